"""`loom plan calibrate` and `loom plan --recipe ... --measure K` end to end on CPU ranks: the
calibration writes a profile the planner accepts, and the planner's predicted ordering of six
layouts of the tiny model, spread over its whole ranking, agrees with real runs at the ends
(the issue's check: at least the best and the worst of 6 ranked correctly)."""
import csv
import json
import os
import subprocess

import pytest

from test_data_helpers import ROOT, loom_binary
from train_helpers import RECIPE, make_corpus

RANKS = 2


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory)


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    out = tmp_path_factory.mktemp("calibrate") / "cpu.json"
    done = subprocess.run([str(loom_binary()), "plan", "calibrate", "--devices", str(RANKS), "--out", str(out),
                           "--seconds", "0.1"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def plan(*args, timeout=1800):
    return subprocess.run([str(loom_binary()), "plan", *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_calibration_profile_has_measured_figures(profile):
    doc = json.loads(profile.read_text())
    dev = doc["device"]
    assert dev["name"].startswith(f"cpu-{RANKS}x")
    assert dev["gpus_per_node"] == RANKS
    assert 0 < dev["memory_gib"] < 1e4
    gemm = doc["gemm"]
    assert len(gemm) >= 4
    assert all(g["tflops"] > 0 for g in gemm)
    assert dev["peak_tflops"] == pytest.approx(max(g["tflops"] for g in gemm))
    assert doc["memory_bandwidth_gbs"] > 0.1
    assert doc["kernel_launch_us"] > 0
    assert doc["allreduce_busbw_gbs"]["intra_node"] > 0
    assert doc["collective_latency_us"] > 0
    assert doc["measured"]["ranks"] == RANKS


def test_calibrate_rejects_bad_flags():
    done = plan("calibrate", "--accelerator", "tpu")
    assert done.returncode == 2
    assert "--accelerator: expected cpu or gpu, found 'tpu'" in done.stderr


def test_cpu_recipe_without_profile_names_the_fix():
    done = plan("--recipe", RECIPE)
    assert done.returncode == 2
    assert "loom plan calibrate --devices 4" in done.stderr


def test_plan_from_recipe_ranks_its_layout_and_writes_a_runnable_recipe(profile, tmp_path):
    out = tmp_path / "best.yaml"
    done = plan("--recipe", RECIPE, "--profile", profile, "--write-recipe", out, "trainer.devices=2",
                "model.tensor_model_parallel_size=2", "model.pipeline_model_parallel_size=1")
    assert done.returncode == 0, done.stderr[-4000:]
    assert "The recipe's layout t2 p1" in done.stderr
    text = out.read_text()
    assert text.startswith("# Layout chosen by `loom plan`")
    # The written recipe is the whole resolved recipe: planning it again finds its own layout best.
    again = plan("--recipe", out, "--profile", profile)
    assert again.returncode == 0, again.stderr[-4000:]
    assert "rank 1 of" in again.stderr


# Six layouts spread over the predicted times of every data- and pipeline-parallel layout of the
# tiny model on 2 ranks (recompute, micro-batch, interleaving vary). Tensor parallelism and the
# distributed optimizer are left out: on 2 shared cores Gloo's per-call cost makes their
# measured times swing by tens of percent between runs, too much for a stable order.
MEASURE_KNOBS = ["--measure-pick", "spread", "--tp", "1", "--dist-opt", "off", "--measure-repeats", 3]


def not_beaten_beyond_noise(row, winner):
    """`row` is `winner`, or `winner` is faster by no more than the run-to-run spread of the
    two (3 runs each, fastest kept): a measurement cannot order layouts closer than its noise."""
    if row is winner:
        return True
    def spread(r):
        runs = [float(x) for x in r["run_seconds"].split(";")]
        return (max(runs) - min(runs)) / min(runs)
    noise = max(spread(row), spread(winner))
    return float(row["measured_s"]) - float(winner["measured_s"]) <= noise * float(winner["measured_s"])


def measure(profile, corpus, tmp_path, count, knobs, steps, skip, recipe=RECIPE):
    """`loom plan --measure COUNT` of the recipe's 2-rank layouts (run directories under
    tmp_path/runs): the finished command and the rows of its CSV table."""
    table = tmp_path / "measured.csv"
    done = plan("--recipe", recipe, "--profile", profile, "--measure", count, *knobs,
                "--measure-steps", steps, "--measure-skip", skip, "--measure-csv", table,
                "--measure-dir", tmp_path / "runs", "--measure-timeout", 300,
                "trainer.devices=2", "model.pipeline_model_parallel_size=1",
                f"model.data.data_prefix=[1.0,{corpus}]")
    assert done.returncode == 0, done.stderr[-6000:]
    return done, list(csv.DictReader(table.open()))


@pytest.mark.skipif(os.environ.get("LOOM_PLAN_MEASURE_FULL") != "1",
                    reason="18 timed training runs (~2 min): tools/test.sh --full (LOOM_PLAN_MEASURE_FULL=1); "
                           "CI measures two layouts once each (test_measure_runs_two_layouts_end_to_end)")
def test_measure_ranks_the_best_and_worst_of_six_layouts(profile, corpus, tmp_path):
    done, rows = measure(profile, corpus, tmp_path, 6, MEASURE_KNOBS, steps=6, skip=2)
    assert len(rows) == 6, done.stderr[-4000:]
    assert all(r["status"] == "ok" and len(r["run_seconds"].split(";")) == 3 for r in rows), rows
    by_pred = sorted(rows, key=lambda r: int(r["predicted_rank"]))
    by_meas = sorted(rows, key=lambda r: int(r["measured_rank"]))
    report = done.stderr[-3000:]
    # The predicted best is the measured best, and the predicted worst the measured worst (up to
    # the measurement's own noise when two layouts are that close).
    assert not_beaten_beyond_noise(by_pred[0], by_meas[0]), report
    assert not_beaten_beyond_noise(by_meas[-1], by_pred[-1]), report
    # ... and far apart in time, the two ends are not a matter of noise: the model separates
    # data-parallel from pipelined layouts on these 2 ranks.
    assert float(by_pred[-1]["measured_s"]) > 1.25 * float(by_pred[0]["measured_s"]), report
    for r in rows:
        assert float(r["measured_s"]) > 0 and float(r["peak_mib"]) > 50
    # Timing runs write metrics but never a checkpoint (exp_manager.create_checkpoint_callback=false).
    runs = sorted((tmp_path / "runs").iterdir())
    assert len(runs) == 6
    for run in runs:
        assert (run / "metrics.jsonl").exists()
        assert not (run / "checkpoints").exists()


@pytest.mark.parametrize("recipe", [RECIPE, ROOT / "recipes" / "llama_tiny.yaml"], ids=["gpt", "llama"])
def test_measure_runs_two_layouts_end_to_end(profile, corpus, tmp_path, recipe):
    # CI's share of the ranking test above: two real timed runs, their rows and their run
    # directories (metrics, no checkpoint), without the order (which needs repeats to beat noise).
    _, rows = measure(profile, corpus, tmp_path, 2, ("--tp", "1", "--dist-opt", "off"), steps=3, skip=1,
                      recipe=recipe)
    # The planner's memory for the calibrated profile's layouts is the measured peak within 20%.
    # (Time is not checked here: on shared cores a run's time swings by more than the model's
    # error; the ranking test above measures it with repeats.)
    for r in rows:
        assert abs(float(r["predicted_memory_gib"]) * 1024 / float(r["peak_mib"]) - 1) < 0.2, r
    assert len(rows) == 2 and all(r["status"] == "ok" and float(r["measured_s"]) > 0 for r in rows), rows
    assert sorted(int(r["measured_rank"]) for r in rows) == [1, 2]
    runs = sorted((tmp_path / "runs").iterdir())
    assert len(runs) == 2 and all((r / "metrics.jsonl").exists() and not (r / "checkpoints").exists() for r in runs)


def test_measure_classifies_failed_runs_and_goes_on(profile, tmp_path):
    """Every run fails (the data prefix does not exist): each is classified, the command ends
    with status 1 and the written recipe says its layout is only the predicted best."""
    table, best = tmp_path / "failed.csv", tmp_path / "best.yaml"
    done = plan("--recipe", RECIPE, "--profile", profile, "--measure", 2, "--measure-csv", table,
                "--measure-dir", tmp_path / "runs", "--write-recipe", best, "--measure-timeout", 120,
                "trainer.devices=2", "model.pipeline_model_parallel_size=1",
                f"model.data.data_prefix=[1.0,{tmp_path / 'missing'}]")
    assert done.returncode == 1, done.stderr[-4000:]
    assert "no measured run succeeded" in done.stderr
    rows = list(csv.DictReader(table.open()))
    assert [r["status"] for r in rows] == ["error", "error"]
    assert all("missing" in r["detail"] for r in rows), rows
    assert best.read_text().startswith("# Layout chosen by `loom plan` (predicted best; no measured run succeeded)")


def test_measure_rejects_a_cluster_other_than_the_recipes_ranks(profile):
    done = plan("--recipe", RECIPE, "--profile", profile, "--measure", 2, "--gpus-per-node", 8)
    assert done.returncode == 2
    assert "--measure runs the layouts on this machine with the recipe's ranks" in done.stderr
