"""Shared helpers of the `loom train` tests: run the real executable on small layouts and read
back its metrics and checkpoints."""
import json
import os
import pathlib
import signal
import subprocess
import time

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


# The tiny recipe's model as a Llama-family decoder (docs/design/llama.md): 2 K/V heads (one per
# tensor rank at t = 2), SwiGLU, RoPE, RMSNorm, no biases, an untied output layer.
LLAMA = ["model.normalization=rmsnorm", "model.position_embedding_type=rope", "model.activation=fast-swiglu",
         "model.ffn_hidden_size=96", "model.num_query_groups=2", "model.bias=false",
         "model.share_embeddings_and_output_weights=false", "model.layernorm_epsilon=1.0e-6"]


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


def wait_for_step(run_dir, step, proc, timeout=120):
    metrics_file = pathlib.Path(run_dir) / "metrics.jsonl"
    deadline = time.time() + timeout
    while time.time() < deadline:
        if metrics_file.exists() and f'"step":{step},' in metrics_file.read_text().replace(" ", ""):
            return
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.1)
    raise AssertionError(f"step {step} not reached in {timeout} s")


def rank_pids(launcher_pid):
    """RANK -> pid of the ranks the local launcher started (its children, read from /proc)."""
    out = {}
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"\nPPid:\t{launcher_pid}\n" not in status:
            continue
        for var in env:
            if var.startswith(b"RANK="):
                out[int(var[5:])] = int(entry.name)
    return out


def cpu_seconds(pid):
    """User + system CPU time of a process, from /proc/<pid>/stat."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def assert_a_failed_run_keeps_its_steps(proc, run_dir):
    """`proc`: a local launcher of two or more ranks logging only step 1 before its last step.
    Once rank 0 has computed for 2 s past step 1, kills rank 1 (SIGKILL): the run must fail and
    rank 0 must have written the steps it did since step 1."""
    wait_for_step(run_dir, 1, proc)  # the first step is always written at once
    rank0 = rank_pids(proc.pid)[0]
    start, deadline = cpu_seconds(rank0), time.time() + 120
    while cpu_seconds(rank0) - start < 2 and time.time() < deadline:  # steps of ~10-50 ms
        assert proc.poll() is None
        time.sleep(0.1)
    assert [r["step"] for r in metrics(run_dir)] == [1]
    os.kill(rank_pids(proc.pid)[1], signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    written = [r["step"] for r in metrics(run_dir)]
    assert len(written) > 1 and written == list(range(1, len(written) + 1)), err[-3000:]
