"""The GPU code path on a CPU machine (docs/design/devices.md, "The stand-in device"): `loom
train` with trainer.accelerator=gpu on the test-only stand-in device (LOOM_DEVICE_PLUGIN), whose
communicator refuses host tensors as NCCL does, must compute exactly what the same layout
computes on CPU ranks: every step's loss and gradient norm, the validation loss and every
checkpoint file, bit for bit; checkpoints cross between the two; `loom generate` at t=2 prints
the same text."""
import json
import os
import pathlib
import re
import subprocess

import pytest

from test_data_helpers import ROOT, loom_binary
from train_helpers import LLAMA, RECIPE, make_corpus, metrics

STEPS = 4
# The main-job recipe's model and data; these layouts and precisions (the lane).
LAYOUTS = {
    "t2p2_sp_selective": ["trainer.devices=4", "model.tensor_model_parallel_size=2",
                          "model.pipeline_model_parallel_size=2", "model.sequence_parallel=true",
                          "model.activations_checkpoint_granularity=selective"],
    "t1p2d2_distopt": ["trainer.devices=4", "model.tensor_model_parallel_size=1",
                       "model.pipeline_model_parallel_size=2", "model.sequence_parallel=false",
                       "model.activations_checkpoint_granularity=selective",
                       "model.optim.name=distributed_fused_adam"],
}
PRECISIONS = {"fp32": "trainer.precision=32", "bf16": "trainer.precision=bf16"}
# The interleaved schedule sends between the last and the first stage too; the stand-in's
# NCCL-like point-to-point (in order, sends wait for their receive) checks it cannot deadlock.
INTERLEAVED = ["trainer.devices=4", "model.tensor_model_parallel_size=1",
               "model.pipeline_model_parallel_size=4", "model.virtual_pipeline_model_parallel_size=2",
               "model.num_layers=8", "model.sequence_parallel=false", "model.micro_batch_size=1"]


def standin_library():
    build = ROOT / os.environ.get("LOOM_BUILD_DIR", "build")
    path = build / "lib" / "libloom_standin_device.so"
    assert path.is_file(), f"stand-in device not built at {path} (tools/build.sh builds it with the tests)"
    return path


def loom(args, device, check=True, timeout=600, env_extra=None):
    """Runs `loom <args>` on CPU ranks (device "cpu") or the stand-in device ("standin")."""
    env = dict(os.environ)
    for name in ("LOOM_DEVICE_PLUGIN", "LOOM_DEVICE_COLLECTIVES", "LOOM_STANDIN_DEVICE_COUNT"):
        env.pop(name, None)
    env.update(env_extra or {})
    if device == "standin":
        env["LOOM_DEVICE_PLUGIN"] = str(standin_library())
    done = subprocess.run([str(loom_binary()), *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)
    if check:
        assert done.returncode == 0, f"loom {args[0]} on {device} failed ({done.returncode}):\n{done.stderr[-6000:]}"
    return done


def train(corpus, run_dir, device, layout, precision, steps=STEPS, extra=(), env_extra=None,
          check=True):
    accelerator = "gpu" if device == "standin" else "cpu"
    args = ["train", str(RECIPE), f"model.data.data_prefix=[1.0,{corpus}]",
            f"trainer.accelerator={accelerator}", f"trainer.max_steps={steps}",
            "trainer.log_every_n_steps=2", f"trainer.val_check_interval={steps}",
            "trainer.limit_val_batches=1", f"exp_manager.explicit_log_dir={run_dir}",
            f"exp_manager.checkpoint_callback_params.every_n_steps={steps}",
            *LAYOUTS[layout], PRECISIONS[precision], *extra]
    return loom(args, device, check=check, env_extra=env_extra)


def checkpoint_files(run_dir):
    """Every file of the run's checkpoints folder: relative path -> bytes."""
    root = pathlib.Path(run_dir) / "checkpoints"
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def step_values(run_dir):
    return [(r["step"], r["loss"], r["grad_norm"]) for r in metrics(run_dir)]


def val_values(run_dir):
    return [(r["step"], r["val_loss"]) for r in metrics(run_dir, "validation")]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory)


@pytest.fixture(scope="module")
def cpu_runs(corpus, tmp_path_factory):
    """The CPU-rank reference of every (layout, precision), trained once."""
    runs = {}
    for layout in LAYOUTS:
        for precision in PRECISIONS:
            run_dir = tmp_path_factory.mktemp(f"cpu_{layout}_{precision}")
            train(corpus, run_dir, "cpu", layout, precision)
            runs[layout, precision] = run_dir
    return runs


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_standin_run_is_bit_identical_to_cpu_ranks(corpus, cpu_runs, tmp_path, layout, precision):
    done = train(corpus, tmp_path, "standin", layout, precision)
    assert "device: standin:0" in done.stderr
    want = cpu_runs[layout, precision]
    assert step_values(tmp_path) == step_values(want)  # exact floats, every step
    assert len(step_values(tmp_path)) == STEPS
    assert val_values(tmp_path) == val_values(want)
    got_files, want_files = checkpoint_files(tmp_path), checkpoint_files(want)
    assert sorted(got_files) == sorted(want_files)
    for name, data in want_files.items():
        assert got_files[name] == data, f"checkpoint file {name} differs"
    if precision == "fp32":
        check_step_memory(metrics(tmp_path), stages=2)


def check_step_memory(records, stages):
    """Each step's device memory (the stand-in's allocator keeps exact counts): per step and per
    pipeline stage, the peak is at least what stays allocated after the step, the largest stage's
    figures are the record's, what stays allocated no longer changes once the optimizer state
    exists (no step leaks: only the step log's own unflushed records, a few scalars per step,
    come and go), and the run's peak covers every step's."""
    for r in records:
        assert len(r["mem_peak_bytes_by_stage"]) == len(r["mem_after_step_bytes_by_stage"]) == stages, r
        assert r["mem_peak_bytes"] == max(r["mem_peak_bytes_by_stage"])
        assert r["mem_after_step_bytes"] == max(r["mem_after_step_bytes_by_stage"])
        for peak, after in zip(r["mem_peak_bytes_by_stage"], r["mem_after_step_bytes_by_stage"]):
            assert peak > after > 0, r
        assert r["peak_device_memory_mib"] * 2**20 >= r["mem_peak_bytes"], r
    settled = [r["mem_after_step_bytes_by_stage"] for r in records[1:]]
    for stage in range(stages):
        after = [step[stage] for step in settled]
        assert max(after) - min(after) < 1024, settled


def test_one_rank_step_memory_holds_the_model_states(corpus, tmp_path):
    # fp32 Adam on one rank: after a step the parameters, their gradients and both moments stay
    # allocated (4 copies of 4 bytes per parameter), and the step's peak adds its activations.
    one_rank = ["trainer.devices=1", "model.tensor_model_parallel_size=1",
                "model.pipeline_model_parallel_size=1", "model.sequence_parallel=false",
                "model.global_batch_size=4"]
    done = train(corpus, tmp_path, "standin", "t2p2_sp_selective", "fp32", steps=3, extra=one_rank)
    params = int(re.search(r"hidden \d+, (\d+) parameters on rank 0", done.stderr)[1])
    records = metrics(tmp_path)
    check_step_memory(records, stages=1)
    after = records[-1]["mem_after_step_bytes"]
    assert 16 * params <= after < 17 * params, (after, params)
    assert records[-1]["mem_peak_bytes"] > after


def test_interleaved_pipeline_is_bit_identical_to_cpu_ranks(corpus, tmp_path):
    cpu, standin = tmp_path / "cpu", tmp_path / "standin"
    train(corpus, cpu, "cpu", "t1p2d2_distopt", "fp32", extra=INTERLEAVED)
    train(corpus, standin, "standin", "t1p2d2_distopt", "fp32", extra=INTERLEAVED)
    assert step_values(standin) == step_values(cpu)
    assert checkpoint_files(standin) == checkpoint_files(cpu)


def test_one_rank_through_real_groups_computes_the_one_rank_run(corpus, tmp_path):
    # LOOM_SINGLE_RANK_GROUPS=1 builds the device's communicators even for one rank (how the
    # GPU bring-up runs NCCL on its one GPU); the run must not change.
    one_rank = ["trainer.devices=1", "model.tensor_model_parallel_size=1",
                "model.pipeline_model_parallel_size=1", "model.sequence_parallel=false",
                "model.global_batch_size=4"]
    plain, groups = tmp_path / "plain", tmp_path / "groups"
    train(corpus, plain, "cpu", "t2p2_sp_selective", "fp32", steps=2, extra=one_rank)
    train(corpus, groups, "standin", "t2p2_sp_selective", "fp32", steps=2, extra=one_rank,
          env_extra={"LOOM_SINGLE_RANK_GROUPS": "1"})
    assert step_values(groups) == step_values(plain)


def test_ranks_share_one_device_with_host_staged_gloo(corpus, cpu_runs, tmp_path):
    # NCCL (and the stand-in's communicator) refuse two ranks on one device; with
    # LOOM_DEVICE_COLLECTIVES=gloo the 4 ranks share standin:0 and compute the same run.
    layout, precision = "t2p2_sp_selective", "fp32"
    done = train(corpus, tmp_path, "standin", layout, precision,
                 env_extra={"LOOM_DEVICE_COLLECTIVES": "gloo", "LOOM_STANDIN_DEVICE_COUNT": "1"})
    assert "device: standin:0, Gloo through host memory" in done.stderr
    assert step_values(tmp_path) == step_values(cpu_runs[layout, precision])
    assert checkpoint_files(tmp_path) == checkpoint_files(cpu_runs[layout, precision])


@pytest.mark.parametrize("layout,precision,extra", [
    ("t2p2_sp_selective", "bf16", []),
    # fp16: the loss scaler's overflow check and skip decision stay on the device too; with
    # both overlaps the gradient buckets and parameter gathers run asynchronously.
    ("t1p2d2_distopt", "fp32", ["trainer.precision=16", "model.optim.overlap_grad_sync=true",
                                "model.optim.overlap_param_sync=true", "model.optim.ddp_bucket_size=20000"]),
])
def test_a_training_step_never_waits_for_the_device(corpus, tmp_path, layout, precision, extra):
    # The stand-in counts what would stall a GPU's queue (.item(), copies to the host, blocking
    # copies from it, synchronize); the step log records the count of each step's own work.
    # Losses, norms and skip flags are read at the flushes (every 3 steps here), outside steps.
    train(corpus, tmp_path, "standin", layout, precision, steps=6,
          extra=["trainer.log_every_n_steps=3", *extra])
    waits = [(r["step"], r["host_waits"]) for r in metrics(tmp_path)]
    assert [s for s, _ in waits] == list(range(1, 7))
    assert waits == [(s, 0) for s in range(1, 7)], waits


def test_the_host_wait_count_sees_host_staged_collectives(corpus, tmp_path):
    # The counter is live: Gloo staging copies every collective through host memory.
    train(corpus, tmp_path, "standin", "t2p2_sp_selective", "fp32", steps=2,
          env_extra={"LOOM_DEVICE_COLLECTIVES": "gloo", "LOOM_STANDIN_DEVICE_COUNT": "1"})
    assert all(r["host_waits"] > 0 for r in metrics(tmp_path))


def test_more_ranks_than_devices_is_refused_naming_the_remedy(corpus, tmp_path):
    done = loom(["train", str(RECIPE), f"model.data.data_prefix=[1.0,{corpus}]",
                 "trainer.accelerator=gpu", f"exp_manager.explicit_log_dir={tmp_path}"],
                "standin", check=False, env_extra={"LOOM_STANDIN_DEVICE_COUNT": "2"})
    assert done.returncode == 2
    assert "local rank 2 needs 'standin' device 2 but this host has 2" in done.stderr
    assert "LOOM_DEVICE_COLLECTIVES=gloo" in done.stderr


def test_a_run_that_does_not_fit_its_device_names_out_of_memory(corpus, tmp_path):
    done = train(corpus, tmp_path, "standin", "t2p2_sp_selective", "fp32", check=False,
                 env_extra={"LOOM_STANDIN_MEMORY_MIB": "16"})
    assert done.returncode == 1
    assert "standin: out of memory: tried to allocate" in done.stderr
    assert "frame #" not in done.stderr  # no C++ stack for the user


@pytest.mark.parametrize("first,then", [("standin", "cpu"), ("cpu", "standin")])
def test_checkpoint_resumes_on_the_other_device(corpus, cpu_runs, tmp_path, first, then):
    layout, precision = "t2p2_sp_selective", "fp32"
    train(corpus, tmp_path, first, layout, precision, extra=["--stop-after-steps", "2"])
    assert (tmp_path / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    done = train(corpus, tmp_path, then, layout, precision)
    assert "resumed from" in done.stderr
    assert step_values(tmp_path) == step_values(cpu_runs[layout, precision])


def test_generate_at_t2_on_the_standin_prints_the_cpu_text(cpu_runs):
    run_dir = cpu_runs["t2p2_sp_selective", "fp32"]
    args = ["generate", "--checkpoint", str(run_dir), "--prompt", "ROMEO:", "--max-new-tokens", "12",
            "--temperature", "0.8", "--top-k", "40", "--seed", "7", "--tensor-parallel", "2"]
    on_cpu = loom(args + ["--accelerator", "cpu"], "cpu")
    on_standin = loom(args + ["--accelerator", "gpu"], "standin")
    assert on_standin.stdout == on_cpu.stdout
    assert on_cpu.stdout.startswith("ROMEO:") and len(on_cpu.stdout) > len("ROMEO:\n")


def test_llama_standin_run_is_bit_identical_to_cpu_ranks(corpus, tmp_path):
    """The Llama-family decoder (RMSNorm, RoPE, SwiGLU, grouped-query attention, untied output)
    on the lane's t=2 × p=2 SP layout in bf16: the stand-in device computes the CPU ranks' run."""
    cpu, standin = tmp_path / "cpu", tmp_path / "standin"
    train(corpus, cpu, "cpu", "t2p2_sp_selective", "bf16", extra=LLAMA)
    done = train(corpus, standin, "standin", "t2p2_sp_selective", "bf16", extra=LLAMA)
    assert "device: standin:0" in done.stderr and "normalization: rmsnorm" in done.stderr
    assert len(step_values(cpu)) == STEPS and step_values(standin) == step_values(cpu)
    assert val_values(standin) == val_values(cpu)
    assert checkpoint_files(standin) == checkpoint_files(cpu)
