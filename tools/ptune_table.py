#!/usr/bin/env python3
"""Prints tools/ptune_job.sh's markdown table from the runs it made.

Per run (--run "NAME=RUN_DIR"): trainable parameters from the log line "N trainable prompt
parameters" (RUN_DIR.log), steps from the last training record of RUN_DIR/metrics.jsonl, wall
time of the whole command (RUN_DIR.wall_s, written by the job; training, validation and test),
the held-out test exact match (metrics.jsonl, kind "test": teacher-forced argmax at every
answer position) and, as "decoded", the same test set decoded greedily by loom generate
(RUN_DIR.generate.log); the two should agree. Then two reference rows:
chance (1 / number of labels of --test) and the no-prompt baseline (the "exact match a/b"
line of loom generate's log, --baseline).
"""
import argparse
import json
import re
import sys


def run_row(name, run_dir):
    with open(run_dir + ".log", encoding="utf-8") as f:
        log = f.read()
    m = re.search(r"(\d+) trainable prompt parameters", log)
    params = int(m.group(1)) if m else None
    steps, test = None, None
    with open(run_dir + "/metrics.jsonl", encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("kind") == "train":
                steps = rec["step"]
            elif rec.get("kind") == "test":
                test = (rec["test_accuracy"], rec["test_examples"])
    try:
        with open(run_dir + ".wall_s", encoding="utf-8") as f:
            wall = float(f.read())
    except OSError:
        wall = None
    decoded = None
    try:
        with open(run_dir + ".generate.log", encoding="utf-8") as f:
            m = re.search(r"exact match (\d+)/(\d+)", f.read())
        if m:
            decoded = int(m.group(1)) / int(m.group(2))
    except OSError:
        pass
    return name, params, steps, wall, test, decoded


def pct(x):
    return f"{100 * x:.1f}%"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", action="append", default=[], help="NAME=RUN_DIR")
    ap.add_argument("--baseline", required=True, help="loom generate --no-virtual-tokens log")
    ap.add_argument("--test", required=True, help="the test JSONL (its labels give chance)")
    args = ap.parse_args()

    with open(args.test, encoding="utf-8") as f:
        labels = {json.loads(line)["label"] for line in f if line.strip()}
    with open(args.baseline, encoding="utf-8") as f:
        m = re.search(r"exact match (\d+)/(\d+)", f.read())
    if not m:
        sys.exit(f"{args.baseline}: no 'exact match a/b' line")
    base_ok, base_n = int(m.group(1)), int(m.group(2))

    print("| method | trainable parameters | steps | wall time | test exact match | decoded |")
    print("|---|---:|---:|---:|---:|---:|")
    for spec in args.run:
        name, run_dir = spec.split("=", 1)
        name, params, steps, wall, test, decoded = run_row(name, run_dir)
        acc = f"{pct(test[0])} of {test[1]}" if test else "-"
        params = f"{params:,}" if params is not None else "-"
        wall = f"{wall:.0f} s" if wall is not None else "-"
        decoded = pct(decoded) if decoded is not None else "-"
        print(f"| {name} | {params} | {steps or '-'} | {wall} | {acc} | {decoded} |")
    print(f"| no prompt (base, greedy) | 0 | 0 | - | {pct(base_ok / base_n)} of {base_n} | "
          f"{pct(base_ok / base_n)} |")
    print(f"| chance (1/{len(labels)}) | - | - | - | {pct(1 / len(labels))} | - |")


if __name__ == "__main__":
    main()
