"""Shared helpers of the `loom train` tests: run the real executable on small layouts and read
back its metrics and checkpoints."""
import json
import pathlib
import subprocess

import torch
import torch.jit._pickle

from test_data_helpers import ROOT, loom_binary, preprocess

RECIPE = ROOT / "recipes" / "gpt3_tiny_cpu.yaml"


def make_corpus(tmp_path_factory):
    """The bundled Shakespeare corpus preprocessed once per session; returns the prefix."""
    out = tmp_path_factory.mktemp("corpus")
    prefix = out / "shakespeare"
    done = preprocess(ROOT / "data" / "tinyshakespeare.txt", prefix, "--append-eod")
    assert done.returncode == 0, done.stderr
    return str(prefix) + "_text_document"


def tiny_overrides(corpus, run_dir, t=1, p=1, d=1, v=None, steps=5, micro=2, global_batch=8,
                   extra=()):
    """Overrides that turn the main-job recipe into a fast run of the given layout. Sequence
    parallelism and selective recompute are on wherever t > 1 (as the issue asks)."""
    o = [
        f"trainer.devices={t * p * d}",
        f"trainer.max_steps={steps}",
        "trainer.log_every_n_steps=1",
        f"trainer.val_check_interval={steps}",
        "trainer.limit_val_batches=1",
        f"exp_manager.explicit_log_dir={run_dir}",
        f"exp_manager.checkpoint_callback_params.every_n_steps={steps}",
        f"model.tensor_model_parallel_size={t}",
        f"model.pipeline_model_parallel_size={p}",
        f"model.virtual_pipeline_model_parallel_size={'null' if v is None else v}",
        f"model.sequence_parallel={'true' if t > 1 else 'false'}",
        f"model.activations_checkpoint_granularity={'selective' if t > 1 else 'null'}",
        "model.num_layers=4",
        "model.hidden_size=32",
        "model.ffn_hidden_size=128",
        "model.num_attention_heads=4",
        "model.encoder_seq_length=32",
        f"model.micro_batch_size={micro}",
        f"model.global_batch_size={global_batch}",
        "model.optim.sched.warmup_steps=2",
        f"model.data.data_prefix=[1.0,{corpus}]",
    ]
    return o + list(extra)


def run_loom(command, recipe, overrides, *flags, check=True, timeout=600):
    """Runs `loom COMMAND RECIPE overrides flags` from the repository root; returns the
    CompletedProcess (with `check`, a failure shows the end of stderr)."""
    cmd = [str(loom_binary()), command, str(recipe), *overrides, *flags]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if check:
        assert done.returncode == 0, f"loom {command} failed ({done.returncode}):\n{done.stderr[-6000:]}"
    return done


def run_train(overrides, *flags, check=True, timeout=600):
    """Runs `loom train` on the main-job recipe with overrides; returns the CompletedProcess."""
    return run_loom("train", RECIPE, overrides, *flags, check=check, timeout=timeout)


def metrics(run_dir, kind="train"):
    """The records of <run_dir>/metrics.jsonl of one kind, in order."""
    lines = (pathlib.Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def load_shard(path):
    """One checkpoint shard (torch.save format written by LibTorch's pickler)."""
    with torch.serialization.safe_globals([torch.jit._pickle.restore_type_tag]):
        return torch.load(path, weights_only=True)


def full_parameters(run_dir, iteration):
    """Every parameter of a checkpoint assembled to its global shape from the shards (using the
    global shape and offset stored with each shard). The last pipeline stage's copy of the word
    embedding ('output_layer.weight') is returned under its own name."""
    it_dir = pathlib.Path(run_dir) / "checkpoints" / f"iter_{iteration:07d}"
    out = {}
    for shard in sorted(it_dir.glob("mp_rank_*/model_optim_rng.pt")):
        blob = load_shard(shard)
        info = json.loads(blob["meta"])["shards"]
        for name, tensor in blob["model"].items():
            shape, offset = info[name]["global_shape"], info[name]["offset"]
            full = out.setdefault(name, torch.full(shape, float("nan"), dtype=tensor.dtype))
            index = tuple(slice(o, o + n) for o, n in zip(offset, tensor.shape))
            full[index] = tensor
    for name, tensor in out.items():
        assert not torch.isnan(tensor).any(), f"{name} not covered by the shards of {it_dir}"
    return out
