"""What `loom train` guarantees when things go wrong (docs/design/hardening.md), on the real
executable: nothing saved is lost (a deleted tracker, a kill mid-commit, a corrupt newest
checkpoint, a failed resume), one run per run directory, the dead rank is named, a failed run
keeps its logged losses, Ctrl-C and SIGUSR1 (at a rank or at the local launcher) save, runs that cannot fit are refused before any
rank starts, and bad data is bad input (exit 2)."""
import os
import pathlib
import resource
import shutil
import signal
import subprocess
import time

import pytest

from test_data_helpers import ROOT, loom_binary
from train_helpers import (RECIPE, assert_a_failed_run_keeps_its_steps, make_corpus, metrics, rank_pids, run_train,
                           tiny_overrides, wait_for_step)

CKPT = "checkpoints"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory)


def small(corpus, run_dir, steps, every=2, **layout):
    """One rank unless a layout is given; a checkpoint every `every` steps."""
    return tiny_overrides(corpus, run_dir, steps=steps, **layout) + [
        f"exp_manager.checkpoint_callback_params.every_n_steps={every}", "model.num_layers=2"]


def shard(run_dir, iteration, rank="mp_rank_00"):
    return pathlib.Path(run_dir) / CKPT / f"iter_{iteration:07d}" / rank / "model_optim_rng.pt"


def tracker(run_dir):
    return int((pathlib.Path(run_dir) / CKPT / "latest_checkpointed_iteration.txt").read_text())


def flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def start_train(overrides, *flags, **kwargs):
    cmd = [str(loom_binary()), "train", str(RECIPE), *overrides, *flags]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def test_a_deleted_tracker_resumes_from_the_newest_complete_checkpoint(corpus, tmp_path):
    run_train(small(corpus, tmp_path, steps=4))
    saved = shard(tmp_path, 4).read_bytes()
    (tmp_path / CKPT / "latest_checkpointed_iteration.txt").unlink()
    done = run_train(small(corpus, tmp_path, steps=6))
    assert "resuming from the newest complete checkpoint iter_0000004" in done.stderr
    assert shard(tmp_path, 4).read_bytes() == saved  # not overwritten by a restart from step 0
    assert tracker(tmp_path) == 6
    assert [r["step"] for r in metrics(tmp_path)] == [1, 2, 3, 4, 5, 6]


def test_a_kill_mid_replacement_that_left_no_folder_is_recovered(corpus, tmp_path):
    # What a kill between iter_N -> iter_N.old and iter_N.tmp -> iter_N left: the tracker names
    # a folder that is not there (resume used to refuse).
    run_train(small(corpus, tmp_path, steps=4))
    iter4 = tmp_path / CKPT / "iter_0000004"
    shutil.copytree(iter4, tmp_path / CKPT / "iter_0000004.tmp")
    iter4.rename(tmp_path / CKPT / "iter_0000004.old")
    done = run_train(small(corpus, tmp_path, steps=6))
    assert "finished the interrupted replacement" in done.stderr
    assert "resumed from" in done.stderr and "iter_0000004" in done.stderr
    assert tracker(tmp_path) == 6


def test_a_corrupt_newest_checkpoint_names_the_older_one_and_iteration_resumes_from_it(corpus, tmp_path):
    run_train(small(corpus, tmp_path, steps=4))
    flip_a_byte(shard(tmp_path, 4))
    done = run_train(small(corpus, tmp_path, steps=6), check=False)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "is corrupt" in done.stderr
    assert "the newest complete older checkpoint is iter_0000002" in done.stderr
    assert "--iteration 2" in done.stderr
    done = run_train(small(corpus, tmp_path, steps=6), "--iteration", "2")
    assert "resumed from" in done.stderr and "iter_0000002" in done.stderr
    assert "kept it as iter_0000004.superseded-1" in done.stderr
    assert (tmp_path / CKPT / "iter_0000004.superseded-1").is_dir()  # the damaged copy, kept
    assert tracker(tmp_path) == 6


def test_a_failed_resume_leaves_the_earlier_config_yaml(corpus, tmp_path):
    run_train(small(corpus, tmp_path, steps=2))
    before = (tmp_path / "config.yaml").read_text()
    assert "max_steps: 2" in before
    flip_a_byte(shard(tmp_path, 2))
    done = run_train(small(corpus, tmp_path, steps=6), check=False)
    assert done.returncode == 2
    assert (tmp_path / "config.yaml").read_text() == before


def test_a_second_run_on_the_same_directory_is_refused_naming_the_holder(corpus, tmp_path):
    first = start_train(small(corpus, tmp_path, steps=200, every=1000))
    try:
        wait_for_step(tmp_path, 1, first)
        second = run_train(small(corpus, tmp_path, steps=200, every=1000), check=False)
        assert second.returncode == 2, second.stderr[-3000:]
        assert f"is in use by another run (pid {first.pid} on" in second.stderr
        assert ": loom train " in second.stderr  # the holder's command
    finally:
        first.kill()  # SIGKILL: the lock must not outlive the process
        first.communicate(timeout=60)
    # Only the first run wrote metrics, and a later run takes the lock it left behind.
    steps = [r["step"] for r in metrics(tmp_path)]
    assert steps == sorted(set(steps))
    done = run_train(small(corpus, tmp_path, steps=2, every=2) + ["exp_manager.resume_if_exists=false"])
    assert f"ended without releasing it (pid {first.pid} on" in done.stderr


def test_kill_9_of_a_rank_names_that_rank(corpus, tmp_path):
    proc = start_train(small(corpus, tmp_path, steps=200, every=1000, d=3, micro=1, global_batch=6))
    wait_for_step(tmp_path, 1, proc)
    os.kill(rank_pids(proc.pid)[1], signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "loom train: rank 1 failed first (killed by signal 9, SIGKILL)" in err, err[-3000:]


def test_a_flipped_bit_in_one_shard_names_the_rank_that_read_it(corpus, tmp_path):
    run_train(small(corpus, tmp_path, steps=2, t=2))
    flip_a_byte(shard(tmp_path, 2, "mp_rank_01"))
    done = run_train(small(corpus, tmp_path, steps=4, t=2), check=False)
    assert done.returncode == 2, done.stderr[-3000:]
    summary = done.stderr[done.stderr.index("loom train: rank"):]
    # Both ranks learn of the damage at once; rank 1 either exits first or is still exiting
    # when the launcher stops the rest after rank 0's exit: either way it is named, with its error.
    assert (summary.startswith("loom train: rank 1 failed first (exit 2):") or summary.startswith(
        "loom train: rank 1 failed first (stopped by the launcher's SIGTERM after its error):")), summary
    assert "mp_rank_01/model_optim_rng.pt is corrupt" in summary.splitlines()[1]


def test_a_run_that_fails_keeps_the_losses_of_the_steps_since_the_last_log(corpus, tmp_path):
    # Records are written every log_every_n_steps; when a step throws (here: rank 1 dies, so
    # rank 0's next collective fails) rank 0 writes the steps done since the last record.
    steps = 5000
    o = small(corpus, tmp_path, steps=steps, every=steps, d=2, micro=1, global_batch=4) + [
        f"trainer.log_every_n_steps={steps}"]
    assert_a_failed_run_keeps_its_steps(start_train(o), tmp_path)


def test_ctrl_c_saves_and_stops_and_a_second_one_stops_at_once(corpus, tmp_path):
    overrides = small(corpus, tmp_path, steps=200, every=1000, d=2, micro=1, global_batch=4)
    proc = start_train(overrides)
    wait_for_step(tmp_path, 2, proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert "stop requested" in err
    assert 2 <= tracker(tmp_path) < 200
    # Twice: the ranks do not wait for a save.
    proc = start_train(overrides)
    wait_for_step(tmp_path, tracker(tmp_path) + 1, proc)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.05)  # two presses, not one: signals sent together may arrive as one
    proc.send_signal(signal.SIGINT)
    start = time.time()
    _, err = proc.communicate(timeout=60)
    assert time.time() - start < 10
    assert proc.returncode == 130, err[-3000:]
    assert "loom train: interrupted twice: the ranks stopped at once, without saving" in err


@pytest.mark.parametrize("layout", [{}, {"d": 2, "micro": 1, "global_batch": 4}], ids=["at_a_rank", "at_the_launcher"])
def test_sigusr1_saves_and_stops(corpus, tmp_path, layout):
    # What Slurm sends before the time limit (--signal=USR1): to each task (one rank, no
    # launcher), or to the job step's launcher, which forwards it to its ranks.
    proc = start_train(small(corpus, tmp_path, steps=200, every=1000, **layout))
    wait_for_step(tmp_path, 1, proc)
    proc.send_signal(signal.SIGUSR1)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert "stop requested" in err
    assert 1 <= tracker(tmp_path) < 200


@pytest.mark.parametrize("override,message", [
    ("trainer.max_steps=1000000000", "data indices"),
    ("model.encoder_seq_length=100000000", "activations"),
    ("model.num_layers=50000000", "model state"),
])
def test_runs_that_cannot_fit_are_refused_before_any_rank_starts(corpus, tmp_path, override, message):
    o = small(corpus, tmp_path, steps=2, t=2) + [override]
    start = time.time()
    done = run_train(o, check=False)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "the run does not fit this machine" in done.stderr and message in done.stderr
    assert "[rank" not in done.stderr
    assert time.time() - start < 30
    assert not (tmp_path / "metrics.jsonl").exists()


def test_more_local_ranks_than_the_machine_can_run_are_refused(corpus, tmp_path):
    o = small(corpus, tmp_path, steps=1) + ["trainer.devices=100000", "model.global_batch_size=100000",
                                            "model.micro_batch_size=1"]
    done = run_train(o, check=False)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "trainer.devices = 100000 local ranks" in done.stderr or "100000 local ranks need" in done.stderr
    assert "terminate called" not in done.stderr and "[rank" not in done.stderr


def test_ranks_that_cannot_be_started_are_an_error_not_an_abort(corpus, tmp_path):
    # Few file descriptors: the launcher runs out of pipes part-way through starting 16 ranks.
    o = small(corpus, tmp_path, steps=1) + ["trainer.devices=16", "model.global_batch_size=16",
                                            "model.micro_batch_size=1"]

    def few_files():
        resource.setrlimit(resource.RLIMIT_NOFILE, (24, 24))

    cmd = [str(loom_binary()), "train", str(RECIPE), *o]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, preexec_fn=few_files)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "loom train: cannot start the ranks: cannot start rank" in done.stderr
    assert "of 16" in done.stderr and "terminate called" not in done.stderr


def test_bad_data_is_bad_input_and_a_damaged_index_cache_is_rebuilt(corpus, tmp_path):
    run_train(small(corpus, tmp_path / "run", steps=2))
    cache = tmp_path / "run" / "index_cache"
    shuffle = next(cache.glob("*train-shuffle_index.npy"))
    raw = bytearray(shuffle.read_bytes())
    raw[-8:] = (2**31 - 1).to_bytes(4, "little") * 2  # indices far beyond the samples
    shuffle.write_bytes(bytes(raw))
    done = run_train(small(corpus, tmp_path / "run", steps=2))  # the same samples: the same cache entry
    assert "warning: index cache" in done.stderr and "is damaged" in done.stderr
    # An .idx whose dtype byte says int32 over uint16 data: refused with exit 2, naming the file.
    bad = tmp_path / "bad_text_document"
    shutil.copy(corpus + ".bin", str(bad) + ".bin")
    idx = bytearray(pathlib.Path(corpus + ".idx").read_bytes())
    idx[17] = 4
    pathlib.Path(str(bad) + ".idx").write_bytes(bytes(idx))
    o = small(corpus, tmp_path / "bad_run", steps=2) + [f"model.data.data_prefix=[1.0,{bad}]"]
    done = run_train(o, check=False)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "bad_text_document.idx" in done.stderr and "dtype code 4 (int32" in done.stderr


def test_max_time_saves_and_ends_the_run(corpus, tmp_path):
    # trainer.max_time bounds the training time (Lightning's Timer): at the first step boundary
    # past it the ranks agree to stop, save and exit 0, long before max_steps.
    overrides = small(corpus, tmp_path, steps=100000, every=1000000, d=2, micro=1, global_batch=4) + [
        'trainer.max_time="00:00:00:03"']
    proc = start_train(overrides)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-3000:]
    assert "trainer.max_time reached" in err
    assert 1 <= tracker(tmp_path) < 100000
    assert [r["step"] for r in metrics(tmp_path)][-1] == tracker(tmp_path)


@pytest.mark.parametrize("save_last", [True, False])
def test_save_last_decides_whether_the_end_off_the_grid_is_saved(corpus, tmp_path, save_last):
    # NeMo's checkpoint_callback_params.save_last: with it the run's last step is saved even when
    # it is not on the every_n_steps grid; without it only the grid's steps are.
    overrides = small(corpus, tmp_path, steps=3, every=2) + [
        f"exp_manager.checkpoint_callback_params.save_last={'true' if save_last else 'false'}"]
    run_train(overrides)
    saved = sorted(p.name for p in (tmp_path / CKPT).glob("iter_*"))
    assert saved == (["iter_0000002", "iter_0000003"] if save_last else ["iter_0000002"])
    assert tracker(tmp_path) == (3 if save_last else 2)


def test_num_workers_read_ahead_gives_the_same_run(corpus, tmp_path):
    # model.data.num_workers threads read the next step's samples while a step computes: the
    # samples, so the losses, equal reading on the training thread (0), also across a resume.
    def losses(run_dir):
        return [(r["step"], r["loss"]) for r in metrics(run_dir)]

    base = small(corpus, tmp_path / "w0", steps=4, every=2, d=2, micro=1, global_batch=8) + ["model.data.num_workers=0"]
    run_train(base)
    ahead = small(corpus, tmp_path / "w3", steps=4, every=2, d=2, micro=1, global_batch=8) + ["model.data.num_workers=3"]
    run_train(ahead, "--stop-after-steps", "2")
    run_train(ahead)
    assert losses(tmp_path / "w3") == losses(tmp_path / "w0")
    assert [s for s, _ in losses(tmp_path / "w0")] == [1, 2, 3, 4]
