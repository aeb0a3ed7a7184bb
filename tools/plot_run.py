#!/usr/bin/env python3
"""Loss curves and throughput of Loom runs from their metrics.jsonl, to a PNG.

    tools/plot_run.py RUN_DIR [RUN_DIR ...] --output run.png [--title TEXT]

Top: training loss per step (a line per run) and validation loss (markers on the same colour);
bottom: training tokens/s per step. Several runs are overlaid, each labelled by its directory
name. When a resumed run logged a step twice, the later record is the one drawn (what the run
kept, and what TensorBoard shows). Needs matplotlib (tools/requirements-test.txt)."""
import argparse
import json
import pathlib
import sys


def run_series(run_dir):
    """{'train': {step: record}, 'validation': {step: record}} from RUN_DIR/metrics.jsonl, the
    last record of each step winning."""
    path = pathlib.Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise SystemExit(f"plot_run.py: {path}: no such file (is {run_dir} a Loom run directory?)")
    out = {"train": {}, "validation": {}}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise SystemExit(f"plot_run.py: {path}:{number}: not JSON ({e})")
        kind = record.get("kind", "train")
        if kind in out and "step" in record:
            out[kind][record["step"]] = record
    return out


def curves(run_dir):
    """The drawn data of one run: (steps, values) for train loss, validation loss, tokens/s."""
    s = run_series(run_dir)
    train = sorted(s["train"].items())
    val = sorted((k, r) for k, r in s["validation"].items() if "val_loss" in r)
    return {
        "train_loss": ([k for k, _ in train], [r["loss"] for _, r in train]),
        "val_loss": ([k for k, _ in val], [r["val_loss"] for _, r in val]),
        "tokens_per_s": ([k for k, r in train if "tokens_per_s" in r],
                         [r["tokens_per_s"] for _, r in train if "tokens_per_s" in r]),
    }


def plot_runs(run_dirs, title=None):
    """The matplotlib Figure (two axes: losses, throughput)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (loss_ax, speed_ax) = plt.subplots(2, 1, figsize=(9, 7), sharex=True,
                                            gridspec_kw={"height_ratios": [2, 1]})
    for i, run_dir in enumerate(run_dirs):
        colour = f"C{i}"
        name = pathlib.Path(run_dir).resolve().name
        c = curves(run_dir)
        loss_ax.plot(*c["train_loss"], color=colour, linewidth=1.2, label=f"{name}: train")
        if c["val_loss"][0]:
            loss_ax.plot(*c["val_loss"], color=colour, linestyle="--", marker="o", markersize=5,
                         label=f"{name}: validation")
        speed_ax.plot(*c["tokens_per_s"], color=colour, linewidth=1.0, label=name)
    loss_ax.set_ylabel("loss (nats/token)")
    loss_ax.grid(alpha=0.3)
    loss_ax.legend(fontsize=8)
    loss_ax.set_title(title or "Loom: " + ", ".join(pathlib.Path(d).resolve().name for d in run_dirs))
    speed_ax.set_xlabel("step")
    speed_ax.set_ylabel("tokens/s")
    speed_ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p.add_argument("--output", required=True, help="PNG file to write")
    p.add_argument("--title")
    a = p.parse_args(argv)
    fig = plot_runs(a.run_dirs, a.title)
    fig.savefig(a.output, dpi=110)
    print(f"plot_run.py: wrote {a.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
