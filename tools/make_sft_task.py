#!/usr/bin/env python3
"""Writes Loom's bundled supervised fine-tuning task, data/sft/{train,valid}.jsonl and
data/sft/valid_lambada.jsonl (the validation records as `loom eval` lambada documents).

Task 'pick a word': a list of three to five words from a fixed list of twenty one-token
Shakespeare words, and which of them to name: the first or the last. The answer is that word
(naming a word of the list at random is right about 27% of the time):

    {"input": "Words: crown, night, blood, sword. The first word is", "output": "crown"}
    {"input": "Words: love, grace, king. The last word is", "output": "king"}

The records use NeMo's default SFT fields (prompt_template "{input} {output}", label_key
"output"), so a recipe needs no template. Every answer is one token (" night"), so
`loom eval --tasks lambada:data/sft/valid_lambada.jsonl` (greedy last-word accuracy on
"<input> <output>") scores a model on it, before and after fine-tuning.

Generated, not copied: deterministic (fixed seed); rerunning rewrites the same files. No list
of words appears in two splits.

    python3 tools/make_sft_task.py [--out data/sft]
"""
import argparse
import json
import os
import random

SEED = 1234
WORDS = ("king lord love death heart night day blood crown sword queen eyes hand heaven time life grace "
         "father son world").split()
POSITIONS = {"first": 0, "last": -1}
SIZES = {"train": 2000, "valid": 96}  # the validation size a multiple of the recipes' global batch (8)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="data/sft")
    args = ap.parse_args()
    rng = random.Random(SEED)
    seen = set()
    splits = {}
    for split, size in SIZES.items():
        records = []
        while len(records) < size:
            words = tuple(rng.sample(WORDS, rng.randint(3, 5)))
            if words in seen:
                continue
            seen.add(words)
            name = rng.choice(sorted(POSITIONS))
            records.append({"input": f"Words: {', '.join(words)}. The {name} word is",
                            "output": words[POSITIONS[name]]})
        splits[split] = records
    os.makedirs(args.out, exist_ok=True)
    for split, records in splits.items():
        with open(os.path.join(args.out, f"{split}.jsonl"), "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
    with open(os.path.join(args.out, "valid_lambada.jsonl"), "w") as f:
        for r in splits["valid"]:
            f.write(json.dumps({"text": f"{r['input']} {r['output']}"}) + "\n")


if __name__ == "__main__":
    main()
