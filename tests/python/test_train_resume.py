"""Checkpoints of `loom train`: a run stopped and resumed reproduces the uninterrupted run bit
for bit (fp32, CPU), a SIGTERM saves a checkpoint that resumes, and bad checkpoints or recipes
get clear errors."""
import json
import os
import pathlib
import signal
import subprocess
import time

import pytest

from test_data_helpers import ROOT, loom_binary
from train_helpers import RECIPE, make_corpus, metrics, run_train, tiny_overrides

STEPS = 8


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory)


@pytest.fixture(scope="module")
def uninterrupted(corpus, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("uninterrupted")
    run_train(tiny_overrides(corpus, run_dir, t=2, p=2, steps=STEPS))
    return run_dir


def losses(run_dir):
    return {r["step"]: r["loss"] for r in metrics(run_dir)}


def test_resume_reproduces_the_uninterrupted_run_bit_for_bit(corpus, uninterrupted, tmp_path):
    overrides = tiny_overrides(corpus, tmp_path, t=2, p=2, steps=STEPS)
    run_train(overrides, "--stop-after-steps", "3")
    tracker = tmp_path / "checkpoints" / "latest_checkpointed_iteration.txt"
    assert tracker.read_text().strip() == "3"
    done = run_train(overrides)
    assert "resumed from" in done.stderr
    got, want = losses(tmp_path), losses(uninterrupted)
    assert sorted(got) == list(range(1, STEPS + 1))
    assert got == want  # exact float equality, every step


def test_sigterm_saves_a_checkpoint_that_resumes(corpus, uninterrupted, tmp_path):
    overrides = tiny_overrides(corpus, tmp_path, t=2, p=2, steps=200)
    cmd = [str(loom_binary()), "train", str(RECIPE), *overrides]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics_file = tmp_path / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline:
        if metrics_file.exists() and '"step":2' in metrics_file.read_text().replace(" ", ""):
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)  # the launcher forwards it to every rank
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-4000:]
    assert "stop requested" in err
    saved = int((tmp_path / "checkpoints" / "latest_checkpointed_iteration.txt").read_text())
    assert 2 <= saved < 200
    # Resume to step STEPS of the same 200-step schedule... the schedule differs from the
    # 8-step reference, so compare with a fresh uninterrupted 200-step run cut at the same steps.
    run_train(tiny_overrides(corpus, tmp_path, t=2, p=2, steps=200), "--stop-after-steps", "2")
    resumed = losses(tmp_path)
    ref_dir = tmp_path.parent / (tmp_path.name + "_ref")
    run_train(tiny_overrides(corpus, ref_dir, t=2, p=2, steps=200), "--stop-after-steps", str(saved + 2))
    reference = losses(ref_dir)
    for step in range(1, saved + 3):
        assert resumed[step] == reference[step], step


def test_checkpoint_from_another_layout_is_refused(corpus, uninterrupted, tmp_path):
    # The uninterrupted run was t=2, p=2; resuming it with t=1, p=2 d=2 must name the difference.
    done = run_train(tiny_overrides(corpus, uninterrupted, t=1, p=2, d=2, steps=STEPS + 2),
                     check=False)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "tensor_model_parallel_size" in done.stderr
    assert "resharding is not supported" in done.stderr


def test_truncated_shard_is_named(corpus, tmp_path):
    overrides = tiny_overrides(corpus, tmp_path, steps=2)
    run_train(overrides)
    shard = tmp_path / "checkpoints" / "iter_0000002" / "mp_rank_00" / "model_optim_rng.pt"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    done = run_train(tiny_overrides(corpus, tmp_path, steps=4), check=False)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "mp_rank_00/model_optim_rng.pt is truncated" in done.stderr


def test_corrupt_shard_is_named(corpus, tmp_path):
    run_train(tiny_overrides(corpus, tmp_path, steps=2))
    shard = tmp_path / "checkpoints" / "iter_0000002" / "mp_rank_00" / "model_optim_rng.pt"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    done = run_train(tiny_overrides(corpus, tmp_path, steps=4), check=False)
    assert done.returncode == 2
    assert "is corrupt" in done.stderr


def test_a_save_that_died_leaves_the_previous_checkpoint(corpus, tmp_path):
    run_train(tiny_overrides(corpus, tmp_path, steps=2))
    ckpt = tmp_path / "checkpoints"
    # What a rank killed mid-save leaves behind: a half-written iteration folder, tracker untouched.
    partial = ckpt / "iter_0000004.tmp" / "mp_rank_00"
    partial.mkdir(parents=True)
    (partial / "model_optim_rng.pt").write_bytes(b"half a file")
    done = run_train(tiny_overrides(corpus, tmp_path, steps=4))
    assert "resumed from" in done.stderr and "iter_0000002" in done.stderr
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "4"
    assert not (ckpt / "iter_0000004.tmp").exists()


def test_main_job_recipe_runs_on_four_ranks(corpus, tmp_path):
    # The default main job itself (t=2, p=2, SP, selective recompute, its model), a few steps.
    done = run_train([f"model.data.data_prefix=[1.0,{corpus}]", "trainer.max_steps=3",
                      "trainer.val_check_interval=3", "trainer.limit_val_batches=1",
                      f"exp_manager.explicit_log_dir={tmp_path}"])
    recs = metrics(tmp_path)
    assert [r["step"] for r in recs] == [1, 2, 3]
    assert all(r["loss"] < 11.5 for r in recs)
    assert sorted(p.name for p in (tmp_path / "checkpoints" / "iter_0000003").iterdir()) == [
        "metadata.json", "mp_rank_00_000", "mp_rank_00_001", "mp_rank_01_000", "mp_rank_01_001"]
    assert "[rank 0] step 3/3" in done.stderr


@pytest.mark.parametrize("override,message", [
    ("model.num_attention_heads=3", "model.num_attention_heads"),
    ("trainer.devices=3", "trainer.devices"),
    ("model.hidden_sise=64", "did you mean"),
])
def test_bad_recipe_is_refused_before_any_rank_starts(corpus, tmp_path, override, message):
    done = run_train(tiny_overrides(corpus, tmp_path, t=2, p=2) + [override], check=False)
    assert done.returncode == 2
    assert message in done.stderr
    assert "[rank" not in done.stderr
