#!/usr/bin/env python3
"""GPT-2 BPE throughput: Loom (`loom preprocess`, tokenize phase) beside the reference
`tokenizers` package, single thread and all threads. Prints a table of MB/s of UTF-8 input.

Two corpora: data/tinyshakespeare.txt repeated --repeat times (documents split on blank
lines, as `loom preprocess` does for plain text), and one word of --word-mb MB of random
letters without a space (a single pre-tokenisation piece: BPE over it must stay O(n log n)). The reference encodes the same documents with
encode_batch (Rayon; its thread count set by RAYON_NUM_THREADS). Each figure is the best of
--runs runs. Loom's figure covers parsing + tokenizing (not file reading or writing).

Usage: .venv/bin/python tools/bench_tokenizer.py [--loom build/bin/loom] [--repeat 8] [--runs 3]
"""
import argparse
import os
import pathlib
import random
import re
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent

REF_SNIPPET = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
from make_tokenizer_golden import reference_tokenizer
raw = open(sys.argv[2], 'rb').read()
docs, cur = [], []
for line in raw.split(b"\n"):
    if line.strip(b" \t\r\f\v") == b"":
        if cur: docs.append(b"\n".join(cur).decode("utf-8", "replace"))
        cur = []
    else:
        cur.append(line)
if cur: docs.append(b"\n".join(cur).decode("utf-8", "replace"))
tok = reference_tokenizer()
t0 = time.perf_counter()
tok.encode_batch(docs)
print(len(raw) / 1e6 / (time.perf_counter() - t0))
"""


def loom_rate(loom, corpus, workers, tmp):
    r = subprocess.run([str(loom), "preprocess", "--input", str(corpus), "--output-prefix", str(tmp / "bench"),
                        "--vocab-file", str(ROOT / "data" / "gpt2-vocab.json"),
                        "--merge-file", str(ROOT / "data" / "gpt2-merges.txt"),
                        "--workers", str(workers), "--quiet"], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"loom preprocess failed: {r.stderr}")
    m = re.search(r"tokenize ([0-9.]+) MB/s", r.stderr)
    return float(m.group(1))


def ref_rate(corpus, threads):
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="true")
    r = subprocess.run([sys.executable, "-c", REF_SNIPPET, str(ROOT / "tools"), str(corpus)],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"reference failed: {r.stderr}")
    return float(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loom", default=str(ROOT / os.environ.get("LOOM_BUILD_DIR", "build") / "bin" / "loom"))
    ap.add_argument("--repeat", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--word-mb", type=float, default=0.5)
    args = ap.parse_args()
    text = (ROOT / "data" / "tinyshakespeare.txt").read_bytes()
    rnd = random.Random(1)
    word = "".join(rnd.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(int(args.word_mb * 1e6))).encode()
    corpora = [(f"tinyshakespeare x{args.repeat}", (text.rstrip(b"\n") + b"\n\n") * args.repeat),
               (f"one {args.word_mb:g} MB word", word + b"\n")]
    print(f"GPT-2 BPE throughput, best of {args.runs}")
    print(f"{'corpus':>22} | {'threads':>7} | {'loom MB/s':>10} | {'tokenizers MB/s':>15} | {'ratio':>6}")
    print("-" * 73)
    with tempfile.TemporaryDirectory() as d:
        tmp = pathlib.Path(d)
        for name, data in corpora:
            corpus = tmp / "corpus.txt"
            corpus.write_bytes(data)
            for threads in sorted({1, args.threads}):
                lo = max(loom_rate(args.loom, corpus, threads, tmp) for _ in range(args.runs))
                rf = max(ref_rate(corpus, threads) for _ in range(args.runs))
                print(f"{name:>22} | {threads:>7} | {lo:>10.2f} | {rf:>15.2f} | {lo / rf:>6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
