#!/usr/bin/env python3
"""Writes Loom's bundled evaluation tasks, data/eval/*.jsonl, from data/tinyshakespeare.txt,
each in the file format of an lm-evaluation-harness task (no benchmark data is bundled):

  shakespeare_lambada.jsonl    OpenAI LAMBADA's {"text": ...}: a speech cut right after a word
                               (letters only), so the last word is the target (`lambada` kind,
                               the harness's lambada_openai rules).
  shakespeare_hellaswag.jsonl  Rowan/hellaswag rows: ctx_a = a line, ctx_b = the first three
                               words of the next line, endings = the rest of that next line and
                               the rests of three other lines, label = the true ending's index
                               ("0".."3", a string as in HellaSwag) (`hellaswag` kind).
  shakespeare_speaker.jsonl    the generic multiple-choice shape {"context", "choices", "gold"}:
                               "<first line of a speech>\\nSpeaker:" and four speaker names, one
                               the line's (`mc` kind).
  shakespeare_pages.jsonl      wikitext_document_level's {"page": ...}: runs of consecutive speeches
                               of ~2,000 characters (several 128-token windows each) (`wikitext`
                               kind: the harness's rolling log-likelihood).

The corpus is cut into speeches ("NAME:" then its lines); each file draws from its own
stretch of speeches with a fixed seed, so rerunning rewrites the same bytes.

    python3 tools/make_eval_tasks.py [--corpus data/tinyshakespeare.txt] [--out data/eval]
"""
import argparse
import json
import os
import random
import re

SEED = 1234
WORD = re.compile(r"^[A-Za-z]+$")


def speeches(text):
    """[(speaker, [lines])] in corpus order."""
    out = []
    for block in text.split("\n\n"):
        lines = [line.strip() for line in block.strip().split("\n") if line.strip()]
        if len(lines) >= 2 and lines[0].endswith(":") and len(lines[0]) < 40:
            out.append((lines[0][:-1], lines[1:]))
    return out


def lambada(speech_list, rnd, count):
    docs = []
    for _, lines in speech_list:
        words = " ".join(lines).split()
        cuts = [k for k in range(15, min(len(words), 70)) if WORD.match(words[k])]
        if not cuts:
            continue
        k = rnd.choice(cuts)
        docs.append({"text": " ".join(words[: k + 1])})
        if len(docs) == count:
            break
    return docs


def hellaswag(speech_list, rnd, count):
    lines = [(speaker, line) for speaker, ls in speech_list for line in ls]
    pool = [line.split() for _, line in lines if len(line.split()) >= 6]
    docs = []
    for i in range(len(lines) - 1):
        speaker, line = lines[i]
        nxt = lines[i + 1][1].split()
        if lines[i + 1][0] != speaker or len(nxt) < 6 or len(line.split()) < 4:
            continue
        endings = [" ".join(nxt[3:])]
        while len(endings) < 4:
            other = rnd.choice(pool)
            ending = " ".join(other[3:])
            if ending not in endings:
                endings.append(ending)
        order = list(range(4))
        rnd.shuffle(order)
        shuffled = [endings[j] for j in order]
        label = order.index(0)
        ctx_b = " ".join(nxt[:3])
        docs.append({"ind": len(docs), "activity_label": speaker, "ctx_a": line, "ctx_b": ctx_b,
                     "ctx": line + " " + ctx_b, "endings": shuffled, "label": str(label),
                     "source_id": "tinyshakespeare", "split": "val", "split_type": "indomain"})
        if len(docs) == count:
            break
    return docs


def speaker_choice(speech_list, rnd, count):
    names = sorted({speaker for speaker, _ in speech_list})
    docs = []
    for speaker, lines in speech_list:
        if len(lines[0].split()) < 5:
            continue
        choices = [speaker] + rnd.sample([n for n in names if n != speaker], 3)
        rnd.shuffle(choices)
        docs.append({"context": lines[0] + "\nSpeaker:", "choices": choices, "gold": choices.index(speaker)})
        if len(docs) == count:
            break
    return docs


def pages(speech_list, count, size=2000):
    docs, page = [], ""
    for speaker, lines in speech_list:
        page += speaker + ":\n" + "\n".join(lines) + "\n\n"
        if len(page) >= size:
            docs.append({"page": page.strip() + "\n"})
            page = ""
            if len(docs) == count:
                break
    return docs


def write(path, docs):
    with open(path, "w", encoding="utf-8") as f:
        for doc in docs:
            f.write(json.dumps(doc, ensure_ascii=False) + "\n")
    print(f"{path}: {len(docs)} documents")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default="data/tinyshakespeare.txt")
    ap.add_argument("--out", default="data/eval")
    args = ap.parse_args()
    with open(args.corpus, encoding="utf-8") as f:
        all_speeches = speeches(f.read())
    # Separate stretches of the corpus for the four files (the end of the play text).
    n = len(all_speeches)
    stretch = [all_speeches[n - (k + 1) * n // 8 : n - k * n // 8] for k in range(4)]
    os.makedirs(args.out, exist_ok=True)
    write(os.path.join(args.out, "shakespeare_lambada.jsonl"), lambada(stretch[0], random.Random(SEED), 200))
    write(os.path.join(args.out, "shakespeare_hellaswag.jsonl"), hellaswag(stretch[1], random.Random(SEED + 1), 200))
    write(os.path.join(args.out, "shakespeare_speaker.jsonl"), speaker_choice(stretch[2], random.Random(SEED + 2), 200))
    write(os.path.join(args.out, "shakespeare_pages.jsonl"), pages(stretch[3], 40))


if __name__ == "__main__":
    main()
