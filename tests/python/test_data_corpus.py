"""Corpus-scale preprocessing through the `loom` CLI (docs/design/corpus_inputs.md):

- compressed inputs (.zst by the zstd tool, .gz and .xz by Python's gzip/lzma) give exactly
  the bytes of the uncompressed input;
- several inputs, directories and globs are one corpus in a stable order;
- `--partition I/N` outputs merged by `loom merge-datasets` are byte-identical to the one-go
  run, both when the unit is files and when it is documents, and equal to megatron-core's own
  merge (IndexedDatasetBuilder.add_index, what Megatron's tools/merge_datasets.py runs);
- bad input exits 2 with a message naming the file (and line), leaving no output behind.
"""
import gzip
import json
import lzma
import pathlib
import shutil
import subprocess
import warnings

import pytest

from test_data_helpers import DATA, loom_binary, preprocess

warnings.filterwarnings("ignore")


def shakespeare_docs(n):
    text = (DATA / "tinyshakespeare.txt").read_text(encoding="utf-8")
    return [p for p in text.split("\n\n") if p.strip()][:n]


def write_jsonl(path, docs):
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")


def compress(path, kind):
    out = pathlib.Path(f"{path}.{kind}")
    raw = pathlib.Path(path).read_bytes()
    if kind == "gz":
        out.write_bytes(gzip.compress(raw))
    elif kind == "xz":
        out.write_bytes(lzma.compress(raw))
    else:
        subprocess.run(["zstd", "-q", "-f", "-o", str(out), str(path)], check=True)
    return out


def outputs(prefix):
    return [pathlib.Path(f"{prefix}_text_document{e}").read_bytes() for e in (".bin", ".idx")]


def merge(inputs, prefix):
    return subprocess.run([str(loom_binary()), "merge-datasets", "--input", *map(str, inputs),
                           "--output-prefix", str(prefix)], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Four JSONL shards and a plain-text file, and the one-go output of all of them."""
    root = tmp_path_factory.mktemp("corpus")
    docs = shakespeare_docs(600)
    shards = root / "shards"
    shards.mkdir()
    for i in range(4):
        write_jsonl(shards / f"part-{i:02d}.jsonl", docs[i * 150:(i + 1) * 150])
    r = preprocess(shards, root / "whole", "--append-eod")
    assert r.returncode == 0, r.stderr
    return root, shards


@pytest.mark.parametrize("kind", ["zst", "gz", "xz"])
def test_compressed_inputs_give_the_uncompressed_bytes(tmp_path, kind):
    docs = shakespeare_docs(300)
    write_jsonl(tmp_path / "c.jsonl", docs)
    (tmp_path / "c.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    for name in ("c.jsonl", "c.txt"):
        plain = preprocess(tmp_path / name, tmp_path / f"plain_{name}", "--append-eod")
        assert plain.returncode == 0, plain.stderr
        packed = preprocess(compress(tmp_path / name, kind), tmp_path / f"packed_{name}", "--append-eod")
        assert packed.returncode == 0, packed.stderr
        assert outputs(tmp_path / f"plain_{name}") == outputs(tmp_path / f"packed_{name}")


def test_directories_globs_and_lists_are_one_corpus_in_order(corpus, tmp_path):
    root, shards = corpus
    files = sorted(shards.glob("*.jsonl"))
    r = preprocess(files[0], tmp_path / "listed", "--append-eod", "--input", *map(str, files[1:]))
    assert r.returncode == 0, r.stderr
    assert outputs(tmp_path / "listed") == outputs(root / "whole")
    r = preprocess(f"{shards}/part-*.jsonl", tmp_path / "globbed", "--append-eod")
    assert r.returncode == 0, r.stderr
    assert outputs(tmp_path / "globbed") == outputs(root / "whole")
    # Concatenating the files gives the same documents.
    with open(tmp_path / "cat.jsonl", "wb") as f:
        for p in files:
            f.write(p.read_bytes())
    r = preprocess(tmp_path / "cat.jsonl", tmp_path / "cat", "--append-eod")
    assert outputs(tmp_path / "cat") == outputs(root / "whole")


@pytest.mark.parametrize("n", [2, 3, 4, 7])
def test_partitions_merged_equal_the_one_go_run(corpus, tmp_path, n):
    """n <= 4 files: whole files per partition; n = 7 > 4 files: documents per partition."""
    root, shards = corpus
    (tmp_path / "parts").mkdir()
    for i in range(n):
        r = preprocess(shards, tmp_path / f"parts/{i:03d}", "--append-eod", "--partition", f"{i}/{n}")
        assert r.returncode == 0, r.stderr
    r = merge([tmp_path / "parts"], tmp_path / "merged_text_document")
    assert r.returncode == 0, r.stderr
    assert outputs(tmp_path / "merged") == outputs(root / "whole")


def test_single_file_partitions_and_megatron_merge(corpus, tmp_path):
    """One compressed file split by documents; Loom's merge equals megatron-core's add_index merge."""
    import numpy
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    root, shards = corpus
    with open(tmp_path / "all.jsonl", "wb") as f:
        for p in sorted(shards.glob("*.jsonl")):
            f.write(p.read_bytes())
    packed = compress(tmp_path / "all.jsonl", "zst")
    prefixes = []
    for i in range(5):
        r = preprocess(packed, tmp_path / f"p{i}", "--append-eod", "--partition", f"{i}/5")
        assert r.returncode == 0, r.stderr
        prefixes.append(tmp_path / f"p{i}_text_document")
    r = merge(prefixes, tmp_path / "loom_text_document")
    assert r.returncode == 0, r.stderr
    assert outputs(tmp_path / "loom") == outputs(root / "whole")
    builder = IndexedDatasetBuilder(str(tmp_path / "mcore_text_document.bin"), dtype=numpy.uint16)
    for p in prefixes:
        builder.add_index(str(p))
    builder.finalize(str(tmp_path / "mcore_text_document.idx"))
    assert outputs(tmp_path / "mcore") == outputs(root / "whole")


def test_skipped_lines_are_reported_with_file_and_line(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"text": "fine"}\n{"text": ["ok", 3]}\nnot json\n{"text": "also fine"}\n')
    r = preprocess(tmp_path / "a.jsonl", tmp_path / "a")
    assert r.returncode == 2 and "a.jsonl' line 2" in r.stderr, r.stderr
    r = preprocess(tmp_path / "a.jsonl", tmp_path / "a", "--skip-bad-lines", "2")
    assert r.returncode == 0, r.stderr
    assert "skipped '" + str(tmp_path / "a.jsonl") + "' line 2" in r.stderr
    assert "line 3: not a JSON object" in r.stderr
    assert "2 malformed line(s) skipped" in r.stderr


def leftovers(directory, stem):
    return sorted(p.name for p in pathlib.Path(directory).iterdir() if p.name.startswith(stem))


def test_bad_inputs_exit_2_naming_the_file_and_leave_nothing(tmp_path):
    docs = shakespeare_docs(400)
    write_jsonl(tmp_path / "good.jsonl", docs)
    full = compress(tmp_path / "good.jsonl", "zst").read_bytes()
    cases = {}
    (tmp_path / "cut.jsonl.zst").write_bytes(full[: len(full) * 2 // 3])
    cases["cut.jsonl.zst"] = ([], ["cut.jsonl.zst", "zstd data is truncated"])
    shutil.copy(tmp_path / "good.jsonl", tmp_path / "liar.jsonl.gz")
    cases["liar.jsonl.gz"] = ([], ["liar.jsonl.gz", "extension says gzip"])
    (tmp_path / "packed.jsonl").write_bytes(full)
    cases["packed.jsonl"] = ([], ["packed.jsonl", "holds zstd data"])
    (tmp_path / "nokey.jsonl").write_text('{"text": "a"}\n{"body": "b"}\n')
    cases["nokey.jsonl"] = ([], ["nokey.jsonl' line 2", 'no key "text"'])
    (tmp_path / "notstr.jsonl").write_text('{"text": "a"}\n\n{"text": {"x": 1}}\n')
    cases["notstr.jsonl"] = ([], ["notstr.jsonl' line 3", "holds object"])
    (tmp_path / "vocab.json").write_text('{"a": 0, ')
    cases["vocab"] = (["--vocab-file", str(tmp_path / "vocab.json")], ["vocab.json", "not valid JSON"])
    cases["partition"] = (["--partition", "3/2"], ["--partition '3/2'"])
    for name, (extra, wants) in cases.items():
        src = tmp_path / (name if name.endswith(("zst", "gz", "jsonl")) else "good.jsonl")
        prefix = tmp_path / f"out_{name.replace('.', '_')}"
        if name == "vocab":  # the helper passes the bundled vocabulary
            r = subprocess.run([str(loom_binary()), "preprocess", "--input", str(src), "--output-prefix", str(prefix),
                                "--merge-file", str(DATA / "gpt2-merges.txt"), *extra], capture_output=True, text=True)
        else:
            r = preprocess(src, prefix, *extra)
        assert r.returncode == 2, (name, r.stderr)
        for w in wants:
            assert w in r.stderr, (name, r.stderr)
        assert leftovers(tmp_path, "out_") == [], (name, leftovers(tmp_path, "out_"))
    # An earlier run's output survives a failed run under the same prefix.
    assert preprocess(tmp_path / "good.jsonl", tmp_path / "keep").returncode == 0
    before = outputs(tmp_path / "keep")
    assert preprocess(tmp_path / "nokey.jsonl", tmp_path / "keep").returncode == 2
    assert outputs(tmp_path / "keep") == before
    assert leftovers(tmp_path, "keep") == ["keep_text_document.bin", "keep_text_document.idx"]


def test_an_output_that_is_an_input_is_refused_before_anything_is_written(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", shakespeare_docs(20))
    assert preprocess(tmp_path / "a.jsonl", tmp_path / "a").returncode == 0
    before = outputs(tmp_path / "a")
    # The earlier output read back as plain text under the same prefix: it would be replaced.
    for given in (tmp_path / "a_text_document.bin", tmp_path / "sub" / ".." / "a_text_document.idx"):
        (tmp_path / "sub").mkdir(exist_ok=True)
        r = preprocess(given, tmp_path / "a")
        assert r.returncode == 2, r.stderr
        assert "which is the input '" + str(given) + "'" in r.stderr, r.stderr
        assert outputs(tmp_path / "a") == before
    # A hard link is the same file under another name.
    (tmp_path / "link.bin").hardlink_to(tmp_path / "a_text_document.bin")
    r = preprocess(tmp_path / "link.bin", tmp_path / "a")
    assert r.returncode == 2 and "link.bin" in r.stderr, r.stderr
    assert outputs(tmp_path / "a") == before
    assert leftovers(tmp_path, "a_") == ["a_text_document.bin", "a_text_document.idx"]


def test_an_endless_line_is_refused_naming_file_and_line_in_bounded_memory(tmp_path):
    (tmp_path / "ok.txt").write_text("first line\n" + "x" * 5000 + "\n")
    r = preprocess(tmp_path / "ok.txt", tmp_path / "ok", "--max-line-bytes", "4096")
    assert r.returncode == 2 and "ok.txt' line 2: longer than 4096 bytes" in r.stderr, r.stderr
    assert leftovers(tmp_path, "ok_") == []
    # /dev/zero is one line without end: refused once the cap is read, not at the memory limit.
    cmd = [str(loom_binary()), "preprocess", "--input", "/dev/zero", "--output-prefix", str(tmp_path / "z"),
           "--vocab-file", str(DATA / "gpt2-vocab.json"), "--merge-file", str(DATA / "gpt2-merges.txt"),
           "--max-line-bytes", str(64 << 20)]
    # 1 GiB of heap (RLIMIT_DATA; the address space also holds the CUDA libraries' mappings).
    r = subprocess.run(["prlimit", f"--data={1 << 30}", *cmd], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "'/dev/zero' line 1: longer than 67108864 bytes" in r.stderr, r.stderr
    r = preprocess(tmp_path / "ok.txt", tmp_path / "ok", "--max-line-bytes", "0")
    assert r.returncode == 2 and "--max-line-bytes" in r.stderr, r.stderr


def test_merge_errors(corpus, tmp_path):
    root, _ = corpus
    r = merge([tmp_path], tmp_path / "m")
    assert r.returncode == 2 and "holds no .idx/.bin pairs" in r.stderr
    r = merge([root / "whole_text_document", root / "whole_text_document"], root / "whole_text_document")
    assert r.returncode == 2 and "is also an input" in r.stderr
    shutil.copy(root / "whole_text_document.idx", tmp_path / "x.idx")
    (tmp_path / "x.bin").write_bytes(b"\0" * 10)
    r = merge([tmp_path / "x"], tmp_path / "y")
    assert r.returncode == 2 and "x.bin" in r.stderr, r.stderr
    assert leftovers(tmp_path, "y") == []
