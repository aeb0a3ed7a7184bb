"""Interoperability with megatron-core (tools/requirements-test.txt pins 0.16.1, the newest
release installable on Python 3.11; its wheel ships the compiled dataset helpers).

- megatron-core reads the .bin/.idx that `loom preprocess` writes, and its own
  IndexedDatasetBuilder writes byte-identical files from the same documents;
- the golden arrays the Catch2 tests compare Loom's GPTDataset/BlendedDataset/indexed reader
  against (tests/data/golden/mcore, from tools/make_data_golden.py) are exactly what the
  installed megatron-core produces now.
"""
import filecmp
import json
import pathlib
import subprocess
import sys
import warnings

import numpy
import pytest

from test_data_helpers import DATA, ROOT, preprocess, reference_tokenizer

warnings.filterwarnings("ignore")


def test_megatron_core_datasets_import():
    from megatron.core.datasets import helpers_cpp  # noqa: F401  (compiled helper present)
    from megatron.core.datasets.indexed_dataset import IndexedDataset  # noqa: F401


def test_megatron_reads_loom_output_and_writes_the_same_bytes(tmp_path):
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder

    text = (DATA / "tinyshakespeare.txt").read_text(encoding="utf-8")
    paras = [p for p in text.split("\n\n") if p.strip()][:400]
    with open(tmp_path / "corpus.jsonl", "w", encoding="utf-8") as f:
        for p in paras:
            f.write(json.dumps({"text": p}) + "\n")
    r = preprocess(tmp_path / "corpus.jsonl", tmp_path / "loom", "--append-eod", workers=3)
    assert r.returncode == 0, r.stderr

    ds = IndexedDataset(str(tmp_path / "loom_text_document"))
    assert len(ds) == len(paras)
    assert ds.index.dtype == numpy.uint16
    ref = reference_tokenizer()
    builder = IndexedDatasetBuilder(str(tmp_path / "mcore_text_document.bin"), dtype=numpy.uint16)
    for i, p in enumerate(paras):
        ids = ref.encode(p).ids + [50256]
        assert ds[i].tolist() == ids
        builder.add_document(torch.tensor(ids), [len(ids)])
    builder.finalize(str(tmp_path / "mcore_text_document.idx"))
    for ext in (".bin", ".idx"):
        assert filecmp.cmp(tmp_path / f"loom_text_document{ext}", tmp_path / f"mcore_text_document{ext}",
                           shallow=False), ext


def test_golden_indices_are_megatron_cores_output(tmp_path):
    out = tmp_path / "mcore"
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "make_data_golden.py"), "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    committed = ROOT / "tests" / "data" / "golden" / "mcore"
    want = sorted(p.relative_to(committed) for p in committed.rglob("*") if p.is_file())
    got = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    assert got == want
    differ = [str(p) for p in want if (committed / p).read_bytes() != (out / p).read_bytes()]
    assert not differ, f"regenerate with tools/make_data_golden.py: {differ}"
