"""Pictures: tools/plot_run.py draws a real run's train/validation loss and throughput (the drawn
data equals metrics.jsonl, last record per step), several runs overlaid; `loom plan --plot`
writes the planner's CSV and tools/plot_plan.py draws every layout that fits with the winner
marked (the drawn points equal the CSV's fitting rows). The PNGs must exist and not be blank."""
import csv
import json
import subprocess
import sys

import pytest

from test_data_helpers import ROOT, loom_binary
from train_helpers import make_corpus, run_train, tiny_overrides

pytest.importorskip("matplotlib")
sys.path.insert(0, str(ROOT / "tools"))
import plot_plan  # noqa: E402
import plot_run  # noqa: E402


def assert_picture(path, min_colours=20):
    """A PNG that is not blank: several distinct colours and a real share of non-white pixels."""
    import matplotlib.image
    import numpy as np
    assert path.is_file() and path.stat().st_size > 10_000, path
    img = matplotlib.image.imread(str(path))[..., :3]
    colours = np.unique((img * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) >= min_colours
    assert (img.mean(axis=2) < 0.9).mean() > 0.01


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    corpus = make_corpus(tmp_path_factory)
    out = []
    for name, lr in (("run_a", "1e-3"), ("run_b", "3e-3")):
        run_dir = tmp_path_factory.mktemp(name)
        run_train(tiny_overrides(corpus, run_dir, steps=3, extra=["trainer.val_check_interval=2",
                                                                  f"model.optim.lr={lr}"]))
        out.append(run_dir)
    return out


def test_plot_run_draws_the_metrics_of_several_runs(runs, tmp_path):
    png = tmp_path / "runs.png"
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "plot_run.py"), *map(str, runs), "--output", str(png)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert_picture(png)
    fig = plot_run.plot_runs(runs)
    loss_ax, speed_ax = fig.axes
    lines = {line.get_label(): line for line in loss_ax.get_lines()}
    for run_dir in runs:
        records = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
        train = {r["step"]: r for r in records if r["kind"] == "train"}
        val = {r["step"]: r for r in records if r["kind"] == "validation"}
        drawn = lines[f"{run_dir.name}: train"]
        assert list(drawn.get_xdata()) == sorted(train)
        assert list(drawn.get_ydata()) == [train[s]["loss"] for s in sorted(train)]
        drawn = lines[f"{run_dir.name}: validation"]
        assert list(drawn.get_xdata()) == sorted(val) == [0, 2, 3]
        assert list(drawn.get_ydata()) == [val[s]["val_loss"] for s in sorted(val)]
    assert len(speed_ax.get_lines()) == len(runs)


def test_plot_run_names_a_directory_without_metrics(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "plot_run.py"), str(tmp_path), "--output",
                           str(tmp_path / "x.png")], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "metrics.jsonl" in done.stderr


def test_loom_plan_plot_draws_every_layout_that_fits(tmp_path):
    png = tmp_path / "plan.png"
    done = subprocess.run([str(loom_binary()), "plan", "--size", "5", "--nodes", "2", "--global-batch-size", "64",
                           "--tp", "1,2,4", "--pp", "1,2", "--plot", str(png)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert_picture(png)
    rows = list(csv.DictReader((tmp_path / "plan.csv").open()))
    fitting = [r for r in rows if r["fits"].lower() in ("1", "true", "yes")]
    assert len(fitting) > 10
    fig = plot_plan.plot_plan(plot_plan.candidates(tmp_path / "plan.csv"))
    ax = fig.axes[0]
    points = sorted(tuple(p) for coll in ax.collections[:-1] for p in coll.get_offsets().tolist())
    assert points == sorted((float(r["memory_gib"]), float(r["step_seconds"])) for r in fitting)
    winner = ax.collections[-1].get_offsets().tolist()[0]
    best = min(fitting, key=lambda r: int(r["rank"]))
    assert winner == [float(best["memory_gib"]), float(best["step_seconds"])]
    # --csv beside --plot is refused (the picture writes its own CSV).
    bad = subprocess.run([str(loom_binary()), "plan", "--size", "5", "--plot", str(png), "--csv", "x.csv"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--csv" in bad.stderr
    # Without --plot, --csv is the plan's own table (tools/gpu_bringup.sh's predictions read it).
    alone = subprocess.run([str(loom_binary()), "plan", "--size", "5", "--nodes", "2", "--global-batch-size", "64",
                            "--tp", "1,2,4", "--pp", "1,2", "--csv", str(tmp_path / "alone.csv")],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert alone.returncode == 0, alone.stderr[-2000:]
    assert len(list(csv.DictReader((tmp_path / "alone.csv").open()))) > 10
