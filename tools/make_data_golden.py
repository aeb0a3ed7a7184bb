#!/usr/bin/env python3
"""Writes tests/data/golden/mcore/: indexed datasets and GPT/blended sample indices produced by
the reference, megatron-core (pinned in tools/requirements-test.txt), for Loom's C++ tests.

- corpus_a/corpus_b_text_document.bin/.idx: paragraphs of tinyshakespeare tokenized by the
  reference GPT-2 tokenizer (`tokenizers`), EOD appended, written by megatron-core's
  IndexedDatasetBuilder (uint16).
- one folder per case with config.json (the parameters), and .npy arrays taken from
  megatron-core's GPTDataset / BlendedDataset built by BlendedMegatronDatasetBuilder:
  document_index, sample_index, shuffle_index (single dataset, per split), text (the S+1 ids of
  every sample in order, int32) and loss_mask; dataset_index / dataset_sample_index (blends).

Usage: .venv/bin/python tools/make_data_golden.py [--out DIR]
  (tests/python/test_data_megatron.py regenerates into a temporary folder and requires the
  result to be byte-identical to the committed files, so they stay the live reference's output.)
"""
import argparse
import json
import os
import pathlib
import shutil
import sys
import tempfile
import warnings

import numpy

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
warnings.filterwarnings("ignore")

CASES = [
    # name, prefixes (with weights), split, seq_length, seed, num_samples (train, valid, test), eod_mask_loss
    dict(name="single_multi_epoch", blend=["corpus_a"], split="90,8,2", seq_length=32, seed=1234,
         num_samples=[700, 40, 5], eod_mask_loss=True, store_text=True),
    dict(name="epoch_exact", blend=["corpus_a"], split="1", seq_length=16, seed=7,
         num_samples=["EPOCH", None, None], eod_mask_loss=False, store_text=False),
    dict(name="epoch_minus_one", blend=["corpus_a"], split="1", seq_length=16, seed=7,
         num_samples=["EPOCH-1", None, None], eod_mask_loss=False, store_text=False),
    dict(name="epoch_plus_one", blend=["corpus_a"], split="1", seq_length=16, seed=7,
         num_samples=["EPOCH+1", None, None], eod_mask_loss=False, store_text=True),
    dict(name="three_epochs_joint_last", blend=["corpus_a"], split="90,10", seq_length=24, seed=99,
         num_samples=["2.9EPOCH", 10, None], eod_mask_loss=True, store_text=False),
    dict(name="one_epoch_none", blend=["corpus_b"], split="80,10,10", seq_length=20, seed=5,
         num_samples=[None, None, None], eod_mask_loss=False, store_text=True),
    dict(name="blend_30_70", blend=["0.3", "corpus_a", "0.7", "corpus_b"], split="98,2,0", seq_length=16,
         seed=1234, num_samples=[400, 20, 0], eod_mask_loss=True, store_text=True),
    dict(name="blend_0001_0999", blend=["0.001", "corpus_a", "0.999", "corpus_b"], split="1", seq_length=16,
         seed=3, num_samples=[1500, 0, 0], eod_mask_loss=False, store_text=True),
]


class _Tokenizer:
    """What megatron-core's datasets read from a tokenizer: vocab_size, eod, an identity."""
    vocab_size = 50257
    eod = 50256
    unique_identifiers = {"class": "GPT2BPETokenizer"}

    @property
    def pad(self):
        raise AttributeError("GPT-2 has no pad token")


def paragraphs():
    text = (ROOT / "data" / "tinyshakespeare.txt").read_text(encoding="utf-8")
    return [p for p in text.split("\n\n") if p.strip()]


def write_corpora(out: pathlib.Path):
    import torch
    from make_tokenizer_golden import reference_tokenizer
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    tok = reference_tokenizer()
    paras = paragraphs()
    for name, docs in (("corpus_a", paras[:120]), ("corpus_b", paras[120:300])):
        prefix = out / f"{name}_text_document"
        builder = IndexedDatasetBuilder(str(prefix) + ".bin", dtype=numpy.uint16)
        for d in docs:
            ids = tok.encode(d).ids + [50256]
            builder.add_document(torch.tensor(ids), [len(ids)])
        builder.finalize(str(prefix) + ".idx")


def resolve_counts(case, work):
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    from megatron.core.datasets.blended_megatron_dataset_config import parse_and_normalize_split, \
        convert_split_vector_to_split_matrix

    out = []
    for i, n in enumerate(case["num_samples"]):
        if not isinstance(n, str):
            out.append(n)
            continue
        # Samples per epoch of this split of the first prefix: (tokens - 1) // S.
        ds = IndexedDataset(str(work / (case["blend"][0] + "_text_document")))
        m = convert_split_vector_to_split_matrix(parse_and_normalize_split(case["split"]))[i]
        n_seq = len(ds.sequence_lengths)
        beg, end = int(round(m[0] * n_seq)), int(round(m[1] * n_seq))
        per_epoch = (int(ds.sequence_lengths[beg:end].sum()) - 1) // case["seq_length"]
        factor, _, delta = n.partition("EPOCH")
        base = int(float(factor or 1) * per_epoch)
        out.append(base + (int(delta) if delta else 0))
    return out


def build_case(case, work: pathlib.Path, dest: pathlib.Path):
    from megatron.core.datasets.blended_dataset import BlendedDataset
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.utils import get_blend_from_list

    blend = [b if b[0].isdigit() else str(work / (b + "_text_document")) for b in case["blend"]]
    counts = resolve_counts(case, work)
    config = GPTDatasetConfig(
        random_seed=case["seed"], sequence_length=case["seq_length"], blend=get_blend_from_list(blend),
        split=case["split"], path_to_cache=None, tokenizer=_Tokenizer(), reset_position_ids=False,
        reset_attention_mask=False, eod_mask_loss=case["eod_mask_loss"], create_attention_mask=False)
    datasets = BlendedMegatronDatasetBuilder(GPTDataset, counts, lambda: True, config).build()
    dest.mkdir(parents=True, exist_ok=True)
    meta = dict(case, num_samples=counts, blend=case["blend"], sizes=[])
    for split, ds in zip(("train", "valid", "test"), datasets):
        if ds is None:
            meta["sizes"].append(None)
            continue
        meta["sizes"].append(len(ds))
        arrays = {}
        if isinstance(ds, BlendedDataset):
            arrays["dataset_index"] = ds.dataset_index
            arrays["dataset_sample_index"] = ds.dataset_sample_index
        else:
            arrays["document_index"] = ds.document_index
            arrays["sample_index"] = ds.sample_index
            arrays["shuffle_index"] = ds.shuffle_index
        if case["store_text"]:
            items = [ds[i] for i in range(len(ds))]
            arrays["text"] = numpy.stack(
                [numpy.concatenate([it["tokens"].numpy(), it["labels"].numpy()[-1:]]) for it in items]).astype(numpy.int32)
            arrays["loss_mask"] = numpy.stack([it["loss_mask"].numpy() for it in items]).astype(numpy.int16)
        for k, v in arrays.items():
            numpy.save(dest / f"{split}-{k}.npy", numpy.ascontiguousarray(v))
    (dest / "config.json").write_text(json.dumps(meta, indent=1) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "tests" / "data" / "golden" / "mcore"))
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    write_corpora(out)
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        for f in out.glob("corpus_*"):
            shutil.copy(f, work / f.name)  # megatron-core caches indices next to the data
        for case in CASES:
            build_case(case, work, out / case["name"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
