"""Shared helpers of the data-pipeline Python tests (no tests here; named to sit with them)."""
import os
import pathlib
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "data"
VOCAB = DATA / "gpt2-vocab.json"
MERGES = DATA / "gpt2-merges.txt"


def loom_binary() -> pathlib.Path:
    """The `loom` executable: $LOOM_BIN, else <build dir>/bin/loom with the build dir from
    $LOOM_BUILD_DIR (default build/, where tools/build.sh puts it). Missing = test failure."""
    if os.environ.get("LOOM_BIN"):
        path = pathlib.Path(os.environ["LOOM_BIN"])
    else:
        path = ROOT / os.environ.get("LOOM_BUILD_DIR", "build") / "bin" / "loom"
    assert path.is_file(), f"loom executable not found at {path}: build it (tools/build.sh) or set LOOM_BIN"
    return path


def preprocess(input_path, prefix, *extra, workers=2):
    """Runs `loom preprocess` with the bundled GPT-2 files; returns the CompletedProcess."""
    cmd = [str(loom_binary()), "preprocess", "--input", str(input_path), "--output-prefix", str(prefix),
           "--vocab-file", str(VOCAB), "--merge-file", str(MERGES), "--workers", str(workers), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def read_indexed(prefix):
    """Token arrays of a Megatron indexed dataset, read with numpy straight from the format."""
    import numpy
    idx = pathlib.Path(str(prefix) + ".idx").read_bytes()
    assert idx[:9] == b"MMIDIDX\x00\x00"
    dtypes = {1: numpy.uint8, 2: numpy.int8, 3: numpy.int16, 4: numpy.int32, 5: numpy.int64,
              6: numpy.float64, 7: numpy.float32, 8: numpy.uint16}
    dtype = dtypes[idx[17]]
    n = int.from_bytes(idx[18:26], "little")
    d = int.from_bytes(idx[26:34], "little")
    lengths = numpy.frombuffer(idx, numpy.int32, n, 34)
    pointers = numpy.frombuffer(idx, numpy.int64, n, 34 + 4 * n)
    docs = numpy.frombuffer(idx, numpy.int64, d, 34 + 12 * n)
    binary = numpy.fromfile(str(prefix) + ".bin", dtype=numpy.uint8)
    size = numpy.dtype(dtype).itemsize
    seqs = [binary[p:p + l * size].view(dtype).astype(numpy.int64) for p, l in zip(pointers, lengths)]
    return seqs, docs


def reference_tokenizer():
    import sys
    sys.path.insert(0, str(ROOT / "tools"))
    from make_tokenizer_golden import reference_tokenizer as make
    return make()


def text_documents(raw: bytes):
    """Plain-text documents as `loom preprocess` defines them: runs of non-blank lines joined by
    '\\n' (a blank line is empty or only spaces, tabs, CR, FF, VT)."""
    docs, cur = [], []
    for line in raw.split(b"\n"):
        if line.strip(b" \t\r\f\v") == b"":
            if cur:
                docs.append(b"\n".join(cur))
            cur = []
        else:
            cur.append(line)
    if cur:
        docs.append(b"\n".join(cur))
    return docs
