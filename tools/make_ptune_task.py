#!/usr/bin/env python3
"""Writes Loom's bundled prompt-learning task, data/ptune/{train,valid,test}.jsonl.

Task 'pronoun': the grammatical role of the pronoun that ends a line fragment.
Every record is a line of data/tinyshakespeare.txt cut right after one of its pronouns
(chosen at random when the line has several); the answer is the role of that last pronoun:

    subject     I thou he she we they        -> label " I"
    determiner  my thy thine your his our their  -> label " the"
    object      me thee him us them           -> label ","

e.g.  {"text": "How hast thou", "label": " I"}
      {"text": "Is but a little way above our", "label": " the"}
      {"text": "... the shepherd's son: hang him", "label": ","}

Pronouns whose role is ambiguous out of context (you, her, it, mine, yours) are never the last
word. Earlier words of the fragment may hold pronouns of any role: only the last one counts.

The labels are verbalizers, not the words' natural continuations: the base model (the main
job's 4-layer, 300-step GPT) shares its input and output embeddings, and only a few tokens can
become its greedy argmax at all; " I", " the" and "," are among the few it can emit (see the
README's prompt-learning section). Without a prompt the base continues a fragment as verse
("thy" -> " lord", "thou" -> ","), so it rarely answers right.

Deterministic (fixed seed, sorted de-duplicated lines): rerunning rewrites the same files.
Splits are by fragment (no fragment is used twice, nor in two splits), each balanced over the three labels; the
validation and test sizes are multiples of the recipe's global batch (8).

    python3 tools/make_ptune_task.py [--corpus data/tinyshakespeare.txt] [--out data/ptune]
"""
import argparse
import json
import os
import random
import re

SEED = 1234
ROLES = {
    " I": "I thou he she we they",
    " the": "my thy thine your his our their",
    ",": "me thee him us them",
}
SIZES = {"train": 1500, "valid": 240, "test": 240}  # per label: 500, 80, 80
TASK = "pronoun"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default="data/tinyshakespeare.txt")
    ap.add_argument("--out", default="data/ptune")
    args = ap.parse_args()

    label_of = {w: lab for lab, words in ROLES.items() for w in words.split()}
    rng = random.Random(SEED)
    with open(args.corpus, encoding="utf-8") as f:
        lines = [line.strip() for line in f]
    # Verse and prose lines; speaker tags ("ROMEO:") are left out.
    lines = sorted({line for line in lines if line and not line.endswith(":")})
    rng.shuffle(lines)

    by_label = {lab: [] for lab in ROLES}
    seen = set()  # a fragment (e.g. "Thou" from different lines) is used once, in one split
    for line in lines:
        cuts = [(m.end(), label_of[w])
                for m in re.finditer(r"[A-Za-z']+", line)
                for w in [m.group(0) if m.group(0) == "I" else m.group(0).lower()]
                if w in label_of]
        if cuts:
            end, lab = rng.choice(cuts)
            if line[:end] not in seen:
                seen.add(line[:end])
                by_label[lab].append(line[:end])

    os.makedirs(args.out, exist_ok=True)
    start = 0
    for split in ("valid", "test", "train"):
        per_label = SIZES[split] // len(ROLES)
        records = []
        for lab, texts in by_label.items():
            if len(texts) < start + per_label:
                raise SystemExit(f"too few fragments for label {lab!r}")
            records += [{"taskname": TASK, "text": t, "label": lab}
                        for t in texts[start:start + per_label]]
        start += per_label
        rng.shuffle(records)
        path = os.path.join(args.out, f"{split}.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        print(f"{path}: {len(records)} records ({per_label} per label)")


if __name__ == "__main__":
    main()
