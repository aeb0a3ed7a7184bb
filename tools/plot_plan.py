#!/usr/bin/env python3
"""Predicted step time against memory for every layout `loom plan` found that fits, to a PNG.

    loom plan RECIPE --csv plan.csv --keep 1000000 && tools/plot_plan.py plan.csv --output plan.png
    loom plan RECIPE --plot plan.png          # the same two steps in one command

Each point is one layout of the planner's CSV (its `fits` column true): x = the worst pipeline
stage's memory per GPU (GiB), y = predicted seconds per step; colour = tensor-parallel size,
marker = pipeline size; the planner's winner (rank 1) is a red star, labelled with its layout.
Plotting stays out of Loom's C++ (docs/planner.md, "Pictures"). Needs matplotlib."""
import argparse
import csv
import pathlib
import sys


def candidates(csv_path):
    """The CSV rows whose layout fits, as dicts with numbers converted."""
    path = pathlib.Path(csv_path)
    if not path.is_file():
        raise SystemExit(f"plot_plan.py: {path}: no such file")
    rows = []
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            if row.get("fits", "").strip().lower() not in ("1", "true", "yes"):
                continue
            for key in ("rank", "tp", "pp", "vp", "dp", "micro_batch"):
                row[key] = int(row[key])
            for key in ("memory_gib", "step_seconds"):
                row[key] = float(row[key])
            rows.append(row)
    if not rows:
        raise SystemExit(f"plot_plan.py: {path}: no layout that fits")
    return rows


def layout_label(r):
    extra = []
    if r.get("sequence_parallel", "").lower() in ("1", "true", "on"):
        extra.append("SP")
    if r.get("recompute_granularity") not in (None, "", "none", "null"):
        extra.append(f"recompute {r['recompute_granularity']}")
    return (f"t={r['tp']} p={r['pp']} v={r['vp']} d={r['dp']} mbs={r['micro_batch']}"
            + (" " + ", ".join(extra) if extra else ""))


def plot_plan(rows, title=None):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    markers = "os^vD<>ph*"
    fig, ax = plt.subplots(figsize=(9, 6))
    tps = sorted({r["tp"] for r in rows})
    pps = sorted({r["pp"] for r in rows})
    for i, tp in enumerate(tps):
        for j, pp in enumerate(pps):
            pts = [r for r in rows if r["tp"] == tp and r["pp"] == pp]
            if pts:
                ax.scatter([r["memory_gib"] for r in pts], [r["step_seconds"] for r in pts], s=22, alpha=0.7,
                           color=f"C{i}", marker=markers[j % len(markers)], label=f"t={tp} p={pp}")
    best = min(rows, key=lambda r: r["rank"])
    ax.scatter([best["memory_gib"]], [best["step_seconds"]], s=260, marker="*", color="red", edgecolor="black",
               zorder=5, label="winner")
    right_half = best["memory_gib"] > (min(r["memory_gib"] for r in rows) + max(r["memory_gib"] for r in rows)) / 2
    ax.annotate(f"winner: {layout_label(best)}\n{best['step_seconds']:.3g} s/step, {best['memory_gib']:.3g} GiB",
                (best["memory_gib"], best["step_seconds"]), xytext=(-20 if right_half else 20, 60),
                textcoords="offset points", ha="right" if right_half else "left", fontsize=8,
                arrowprops={"arrowstyle": "->", "color": "red"}, bbox={"boxstyle": "round", "fc": "white", "alpha": 0.9})
    ax.set_xlabel("predicted memory per GPU, worst stage (GiB)")
    ax.set_ylabel("predicted step time (s)")
    ax.set_title(title or f"loom plan: {len(rows)} layouts that fit")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("csv", help="CSV written by `loom plan --csv`")
    p.add_argument("--output", required=True, help="PNG file to write")
    p.add_argument("--title")
    a = p.parse_args(argv)
    plot_plan(candidates(a.csv), a.title).savefig(a.output, dpi=110)
    print(f"plot_plan.py: wrote {a.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
