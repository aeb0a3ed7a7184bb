"""Loom's GPT-2 BPE (through `loom preprocess`) against the reference tokenizer, live.

Reference: `tokenizers` (tools/requirements-test.txt) loading data/gpt2-vocab.json and
data/gpt2-merges.txt, ByteLevel(add_prefix_space=False), `<|endoftext|>` not special; ill-formed
UTF-8 reaches it as bytes.decode("utf-8", errors="replace") (see csrc/data/gpt2_tokenizer.h).
"""
import json
import subprocess
import sys
import unicodedata

import numpy
import pytest

from test_data_helpers import DATA, ROOT, preprocess, read_indexed, reference_tokenizer, text_documents


@pytest.fixture(scope="module")
def ref():
    return reference_tokenizer()


def test_golden_files_are_the_reference_output():
    """The Catch2 tests compare against tests/data/golden/*.ids: they must still be what the
    installed reference produces."""
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "make_tokenizer_golden.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_whole_corpus_matches_reference(tmp_path, ref):
    raw = (DATA / "tinyshakespeare.txt").read_bytes()
    r = preprocess(DATA / "tinyshakespeare.txt", tmp_path / "shake", "--append-eod")
    assert r.returncode == 0, r.stderr
    seqs, docs = read_indexed(tmp_path / "shake_text_document")
    want_docs = text_documents(raw)
    assert len(want_docs) > 7000
    assert len(seqs) == len(want_docs) and len(docs) == len(want_docs) + 1
    want = ref.encode_batch([d.decode("utf-8") for d in want_docs])
    mismatched = [i for i, (s, w) in enumerate(zip(seqs, want)) if s.tolist() != w.ids + [50256]]
    assert not mismatched, f"{len(mismatched)} documents differ, first {mismatched[:5]}"


def test_every_assigned_code_point(tmp_path, ref):
    """All code points assigned in Unicode 14 (the Unicode version of PCRE2 10.42 and of this
    Python), in varied contexts. Code points unassigned in Unicode 14 are left out: the reference
    classifies some of them as letters/digits under its newer Unicode tables (documented)."""
    assert unicodedata.unidata_version == "14.0.0", "the exclusion below assumes Unicode 14 tables"
    cps = [c for c in range(0x110000)
           if not 0xD800 <= c < 0xE000 and unicodedata.category(chr(c)) != "Cn"]
    seps = [" ", "", "'s", "  ", "1", "\n", "x", "\t ", ""]
    pieces = [chr(c) + seps[i % len(seps)] for i, c in enumerate(cps)]
    docs = ["".join(pieces[i:i + 2000]) for i in range(0, len(pieces), 2000)]
    path = tmp_path / "cps.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    r = preprocess(path, tmp_path / "cps")
    assert r.returncode == 0, r.stderr
    seqs, _ = read_indexed(tmp_path / "cps_text_document")
    want = ref.encode_batch(docs)
    assert len(seqs) == len(docs)
    bad = [i for i, (s, w) in enumerate(zip(seqs, want)) if s.tolist() != w.ids]
    assert not bad, f"chunks {bad[:5]} differ"


def test_long_words_without_spaces_match_reference(tmp_path, ref):
    """One pre-tokenisation piece of 100 KB (letters, digits, a repeated letter, mixed scripts):
    Loom's heap-based merge order must give exactly the reference's ids."""
    import random
    rnd = random.Random(5)
    docs = ["".join(rnd.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(100000)),
            "a" * 50001, "ab" * 30000, "7" * 40000,
            "".join(rnd.choice("abcdéèçßøæπλσ") for _ in range(30000))]
    path = tmp_path / "words.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    r = preprocess(path, tmp_path / "words")
    assert r.returncode == 0, r.stderr
    seqs, _ = read_indexed(tmp_path / "words_text_document")
    want = ref.encode_batch(docs)
    assert [s.tolist() for s in seqs] == [w.ids for w in want]


def test_ill_formed_utf8_text(tmp_path, ref):
    raw = (b"caf\xc3\xa9 \xff\xfe ok\n\xe2\x82 cut \xf0\x9f\x98\x80 \xed\xa0\x80 sur\n\n"
           b"second \xc0\xaf doc \xf4\x90\x80\x80 end \xe2\x82\xac\n")
    (tmp_path / "bad.txt").write_bytes(raw)
    r = preprocess(tmp_path / "bad.txt", tmp_path / "bad")
    assert r.returncode == 0, r.stderr
    seqs, _ = read_indexed(tmp_path / "bad_text_document")
    want = [ref.encode(d.decode("utf-8", errors="replace")).ids for d in text_documents(raw)]
    assert [s.tolist() for s in seqs] == want


def test_preprocess_output_dtype_and_exit_codes(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"text": "hello"}\n{"txt": "x"}\n')
    r = preprocess(tmp_path / "a.jsonl", tmp_path / "a")
    assert r.returncode == 2 and "line 2" in r.stderr and 'no key "text"' in r.stderr
    (tmp_path / "b.jsonl").write_text('{"text": "hello"}\n')
    r = preprocess(tmp_path / "b.jsonl", tmp_path / "b", "--append-eod")
    assert r.returncode == 0, r.stderr
    idx = (tmp_path / "b_text_document.idx").read_bytes()
    assert idx[17] == 8  # uint16 for a 50257-entry vocabulary
    assert numpy.fromfile(tmp_path / "b_text_document.bin", numpy.uint16).tolist() == [31373, 50256]
    r = preprocess(tmp_path / "missing.jsonl", tmp_path / "c")
    assert r.returncode == 2
