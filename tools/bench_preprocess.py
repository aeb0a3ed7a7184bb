#!/usr/bin/env python3
"""`loom preprocess` beside Megatron-LM's tools/preprocess_data.py on the same corpus, tokenizer
files (the bundled GPT-2 BPE: data/gpt2-vocab.json, data/gpt2-merges.txt) and worker counts,
uncompressed and compressed. Prints MB/s of uncompressed JSONL input and whether the .bin/.idx
pairs are byte-identical.

Megatron's script is not vendored: pass a Megatron-LM checkout whose version matches the
installed megatron-core (tools/requirements-test.txt pins 0.16.1), e.g.

    git clone --depth 1 --branch core_v0.16.1 https://github.com/NVIDIA/Megatron-LM /opt/Megatron-LM
    .venv/bin/python tools/bench_preprocess.py --megatron-lm /opt/Megatron-LM

(or set MEGATRON_LM). It runs with --legacy-tokenizer (its GPT2BPETokenizer from the two files,
offline) and --append-eod. megatron.core comes from the installed wheel, megatron.training from
the checkout. The corpus: data/tinyshakespeare.txt paragraphs as JSONL documents, repeated to
--mb MB. Megatron reads .gz only through --partitions (it decompresses the lines round-robin
into partition files, tokenizes those, then merges; its --keep-sequential-samples counts lines
without decompressing and fails on .gz), so its .gz output holds the same documents in another
order: the table says so after comparing the sorted documents.

Figures: wall time of the whole command ("wall"); for Megatron also without its fixed start-up
cost (Python imports, pool start; measured on a one-document input) as "steady"; and CPU seconds
of the command and its worker processes (Megatron's start-up CPU subtracted), whose MB per
CPU-second is the per-core rate, robust to other load on the machine. Loom's start-up (loading
the vocabulary, a few tenths of a second) is included in its figures.
"""
import argparse
import filecmp
import gzip
import json
import os
import pathlib
import resource
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
VOCAB = ROOT / "data" / "gpt2-vocab.json"
MERGES = ROOT / "data" / "gpt2-merges.txt"


def make_corpus(path, mb):
    text = (ROOT / "data" / "tinyshakespeare.txt").read_text(encoding="utf-8")
    paras = [p for p in text.split("\n\n") if p.strip()]
    lines = [json.dumps({"text": p}) + "\n" for p in paras]
    size, target = 0, int(mb * 1e6)
    with open(path, "w", encoding="utf-8") as f:
        i = 0
        while size < target:
            f.write(lines[i % len(lines)])
            size += len(lines[i % len(lines)])
            i += 1
    return size


def timed(cmd, env=None):
    """(wall seconds, CPU seconds of the command and every process it waited for)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    dt = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(map(str, cmd))}\n{r.stderr[-3000:]}")
    return dt, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def megatron_cmd(script, inp, prefix, workers, partitions=1):
    cmd = [sys.executable, str(script), "--input", str(inp), "--output-prefix", str(prefix),
           "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", str(VOCAB), "--merge-file", str(MERGES),
           "--append-eod", "--legacy-tokenizer", "--workers", str(workers), "--log-interval", "100000000"]
    if partitions > 1:
        cmd += ["--partitions", str(partitions)]
    return cmd


def loom_cmd(loom, inp, prefix, workers):
    return [str(loom), "preprocess", "--input", str(inp), "--output-prefix", str(prefix), "--vocab-file", str(VOCAB),
            "--merge-file", str(MERGES), "--append-eod", "--workers", str(workers), "--quiet"]


def documents(prefix):
    import numpy
    idx = pathlib.Path(f"{prefix}_text_document.idx").read_bytes()
    n = int.from_bytes(idx[18:26], "little")
    lengths = numpy.frombuffer(idx, numpy.int32, n, 34)
    tokens = numpy.fromfile(f"{prefix}_text_document.bin", numpy.uint16)
    ends = numpy.cumsum(lengths)
    return sorted(tokens[e - l:e].tobytes() for e, l in zip(ends, lengths))


def same(a, b):
    return all(filecmp.cmp(f"{a}_text_document{e}", f"{b}_text_document{e}", shallow=False) for e in (".bin", ".idx"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--megatron-lm", default=os.environ.get("MEGATRON_LM"),
                    help="Megatron-LM checkout (tag core_v0.16.1) holding tools/preprocess_data.py; env MEGATRON_LM")
    ap.add_argument("--loom", default=str(ROOT / os.environ.get("LOOM_BUILD_DIR", "build") / "bin" / "loom"))
    ap.add_argument("--mb", type=float, default=20.0, help="corpus size in MB (uncompressed JSONL)")
    ap.add_argument("--workers", default="1,2", help="worker counts to run, comma-separated")
    args = ap.parse_args()
    if not args.megatron_lm:
        sys.exit("give --megatron-lm PATH (or MEGATRON_LM): a checkout of github.com/NVIDIA/Megatron-LM at core_v0.16.1")
    script = pathlib.Path(args.megatron_lm) / "tools" / "preprocess_data.py"
    if not script.is_file():
        sys.exit(f"{script} not found")
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore")
    workers = [int(w) for w in args.workers.split(",")]
    with tempfile.TemporaryDirectory(prefix="loom_bench_pre_") as tmp:
        tmp = pathlib.Path(tmp)
        corpus = tmp / "corpus.jsonl"
        nbytes = make_corpus(corpus, args.mb)
        mb = nbytes / 1e6
        (tmp / "gz").mkdir()
        with open(corpus, "rb") as f, gzip.open(tmp / "gz" / "corpus.jsonl.gz", "wb", compresslevel=6) as g:
            shutil.copyfileobj(f, g)
        subprocess.run(["zstd", "-q", "-3", "-o", str(tmp / "corpus.jsonl.zst"), str(corpus)], check=True)
        one = tmp / "one.jsonl"
        one.write_text(corpus.open(encoding="utf-8").readline(), encoding="utf-8")
        warm = [timed(megatron_cmd(script, one, tmp / "warm", 1), env) for _ in range(2)]
        startup, startup_cpu = min(w for w, _ in warm), min(c for _, c in warm)
        print(f"corpus: {mb:.1f} MB JSONL ({sum(1 for _ in open(corpus))} documents); Megatron start-up "
              f"{startup:.1f} s wall, {startup_cpu:.1f} s CPU; {os.cpu_count()} CPU cores; load average before: "
              f"{os.getloadavg()[0]:.1f}\n")
        rows = []
        for w in workers:
            m, mc = timed(megatron_cmd(script, corpus, tmp / f"meg{w}", w), env)
            ref = tmp / f"meg{w}"
            rows.append(("Megatron preprocess_data.py", ".jsonl", w, m, m - startup, mc - startup_cpu, "reference"))
            for kind, inp in ((".jsonl", corpus), (".jsonl.gz", tmp / "gz" / "corpus.jsonl.gz"),
                              (".jsonl.zst", tmp / "corpus.jsonl.zst")):
                t, c = timed(loom_cmd(args.loom, inp, tmp / f"loom{w}{kind}", w))
                rows.append(("loom preprocess", kind, w, t, t, c,
                             "identical" if same(tmp / f"loom{w}{kind}", ref) else "DIFFERENT"))
            if w >= 2 and w % 2 == 0:
                mg, mgc = timed(megatron_cmd(script, tmp / "gz" / "corpus.jsonl.gz", tmp / f"meggz{w}", w, partitions=2), env)
                eq = "identical" if same(tmp / f"meggz{w}", ref) else \
                    "same documents, round-robin order" if documents(tmp / f"meggz{w}") == documents(ref) else "DIFFERENT"
                rows.append(("Megatron --partitions 2", ".jsonl.gz", w, mg, mg - startup, mgc - startup_cpu, eq))
        print("| tool | input | workers | wall s | MB/s wall | MB/s steady | CPU s | MB per CPU-second | .bin/.idx vs Megatron |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name, kind, w, wall, steady, cpu, eq in rows:
            print(f"| {name} | {kind} | {w} | {wall:.1f} | {mb / wall:.2f} | {mb / max(steady, 1e-9):.2f} | {cpu:.1f} | "
                  f"{mb / max(cpu, 1e-9):.2f} | {eq} |")
        print(f"\nload average after: {os.getloadavg()[0]:.1f}")

if __name__ == "__main__":
    main()
