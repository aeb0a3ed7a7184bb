"""Step 11: the planner's memory model against the device's allocator (docs/planner.md, "Checking
the memory model"): `loom plan --validate-memory` on GPT-3 126m at its real shape (s 2048), the
sweep's one-rank cases (fp32, bf16 and fp16; no, selective and full recompute; fused attention;
micro-batch sizes 1, 2 and 4), predicted beside measured peak and after-step bytes from the CUDA
caching allocator, and its reserved peak beside them. In a dry run: the tiny recipe on the
stand-in device."""
from __future__ import annotations

import json
import re
from pathlib import Path

from .context import DATA, Context, StepError, timed_out

RECIPE_GPU = "recipes/gpt3_126m.yaml"
RECIPE_DRY = "recipes/gpt3_tiny_cpu.yaml"


def reserved_peaks(runs: Path) -> list:
    """(case, last step's mem_reserved_peak_bytes) of every run directory under `runs`."""
    out = []
    for metrics in sorted(runs.glob("*/metrics.jsonl")):
        last = None
        for line in metrics.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("kind") == "train" and "mem_reserved_peak_bytes" in rec:
                last = rec
        if last:
            out.append((metrics.parent.name, last["mem_peak_bytes"], last["mem_reserved_peak_bytes"]))
    return out


def step_memory(ctx: Context) -> str:
    cfg = ctx.cfg
    if ctx.accel != "gpu":
        raise StepError("needs a device with allocator statistics (the GPU, or the stand-in in a dry run)")
    runs = cfg.work / "runs" / "memory"
    log = ctx.logs / "memory.log"
    recipe = RECIPE_DRY if cfg.dry else RECIPE_GPU
    cmd = [cfg.loom, "plan", "--validate-memory", "--validate-memory-cases", "one-rank", "--measure-dir", runs,
           "--measure-timeout", "120", "--recipe", recipe, f"model.data.data_prefix=[1.0,{DATA}]",
           'model.data.splits_string="900,90,10"', f"model.data.index_mapping_dir={cfg.work}/index_cache",
           "trainer.num_nodes=1", "cluster.gpus_per_node=1"]
    rc = ctx.run(log, cmd, env=dict(ctx.device_env))
    text = log.read_text(errors="replace")
    table = [l for l in text.splitlines() if l.startswith("|")]
    summary = next((l for l in text.splitlines() if "peak |error| mean" in l), "")
    ctx.md(f"`loom plan --validate-memory --validate-memory-cases one-rank --recipe {recipe}` on {ctx.accel_note}: "
           f"exit {rc}{timed_out(rc)}.", "", *table, "", summary, "")
    peaks = reserved_peaks(runs)
    if peaks:
        ctx.md("Allocated against reserved peak of the last step (the caching allocator's blocks):", "",
               "| case | allocated peak MiB | reserved peak MiB | reserved / allocated |", "|---|---|---|---|",
               *(f"| {c} | {a / 2**20:.1f} | {r / 2**20:.1f} | {r / a:.3f} |" for c, a, r in peaks), "")
    if not table:
        ctx.md_log_tail(log, 20)
        raise StepError(f"exit {rc}, no table")
    m = re.search(r"mean ([\d.]+)%, worst ([\d.]+)%", summary)
    return f"peak error mean {m[1]}%, worst {m[2]}%" if m else summary
