"""Step 6: the same model and micro-batch in Megatron-Core (tools/bench_mcore_gpt.py), for a
tokens/s ratio. megatron-core comes from the bundle's tar.gz; what it imports beyond torch
(numpy, packaging) from the host's python, which has them."""
from __future__ import annotations

import glob
import json
import shutil
import tarfile
import time

from . import metrics
from .context import DATA, Context, StepError, jget, timed_out
from .throughput import LAST, last_throughput


def python_site(ctx: Context) -> str:
    """Unpacks megatron-core into WORK/pysite; returns a note on numpy. Raises StepError."""
    site = (ctx.cfg.work / "pysite").resolve()
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir(parents=True)
    tars = sorted(glob.glob("gpu_bundle/python/megatron_core-*.tar.gz"))
    if not tars:
        raise StepError("no gpu_bundle/python/megatron_core-*.tar.gz (tools/gpu_bundle.sh packs it)")
    try:
        with tarfile.open(tars[-1]) as t:
            try:
                t.extractall(site, filter="data")   # plain files only (Python >= 3.11.4)
            except TypeError:
                t.extractall(site)
    except (OSError, tarfile.TarError) as e:
        raise StepError(f"unpacking {tars[-1]} failed: {e}") from None
    for m in ("numpy", "packaging"):
        if not ctx.capture([ctx.py, "-c", f"import {m}; print('ok')"]).strip().endswith("ok"):
            raise StepError(f"the host's python has no {m} (Megatron-Core needs it)")
    return f"numpy {ctx.capture([ctx.py, '-c', 'import numpy; print(numpy.__version__)']).strip()} from the host"


def step_mcore(ctx: Context) -> str:
    cfg, work = ctx.cfg, ctx.cfg.work
    log = ctx.logs / "mcore.log"
    winner, tput = last_throughput(ctx)
    if winner and "throughput" not in ctx.done:
        when = time.strftime("%H:%M:%SZ", time.gmtime((work / LAST).stat().st_mtime))
        ctx.md(f"Loom's figures and micro-batch from an earlier call's step 4 ({when}).")
    b = int(cfg.environ.get("LOOM_BRINGUP_MCORE_MBS") or winner or 0)
    if not b:
        raise StepError("no micro-batch from step 4 (set LOOM_BRINGUP_MCORE_MBS)")
    numpy_note = python_site(ctx)
    site = str((work / "pysite").resolve())
    pypath = site + (":" + ctx.base_env["PYTHONPATH"] if ctx.base_env.get("PYTHONPATH") else "")
    if cfg.dry:
        args = ["--device", "cpu", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "2",
                "--seq-length", "64", "--steps", "2", "--warmup", "1"]
    else:
        args = ["--device", "cuda", "--steps", cfg.environ.get("LOOM_BRINGUP_MCORE_STEPS") or "10", "--warmup", "3"]
    out = work / "mcore.json"
    tries = [b] + ([b // 2] if b > 1 else [])   # one retry at half the micro-batch if it does not fit
    rc = 1
    for i, t in enumerate(tries):
        out.unlink(missing_ok=True)
        rc = ctx.run(log, [ctx.py, "tools/bench_mcore_gpt.py", *args, "--micro-batch", str(t), "--data", DATA,
                           "--json-out", out], cap=ctx.step_remaining() / (len(tries) - i), env={"PYTHONPATH": pypath})
        ctx.md(f"- micro-batch {t}: exit {rc}{timed_out(rc)}")
        if rc == 0:
            break
        ctx.md_log_tail(log, 12)
        if not metrics.is_oom(log):
            break
    where = ctx.capture([ctx.py, "-c", "import megatron.core as m; print(m.__file__)"], env={"PYTHONPATH": pypath})
    ctx.md(f"- megatron imported from: {(where.strip().splitlines() or [''])[-1]}; {numpy_note}")
    if rc != 0 or not out.is_file():
        raise StepError(f"exit {rc}")
    mj = json.loads(out.read_text())
    ctx.md("", "| implementation | micro-batch | tokens/s | model TFLOP/s | MFU | peak memory MiB |",
           "|---|---|---|---|---|---|",
           f"| Loom | {winner} | {jget(tput, 'tokens_per_s', 0)} | {jget(tput, 'model_tflops_per_device', 1)} | "
           f"{jget(tput, 'mfu', 3)} | {jget(tput, 'peak_device_memory_mib', 0)} (peak_device_memory_mib) |",
           f"| Megatron-Core {jget(mj, 'megatron_core_version')} (local spec) | {jget(mj, 'micro_batch', 0)} | "
           f"{jget(mj, 'tokens_per_s', 0)} | {jget(mj, 'model_tflops_per_device', 1)} | {jget(mj, 'mfu', 3)} | "
           f"{jget(mj, 'peak_memory_mib', 0)} (max_memory_allocated) |", "",
           f"Megatron-Core: precision {jget(mj, 'precision')}, recompute {jget(mj, 'recompute')}, fusions "
           f"{jget(mj, 'fusions')}, optimizer {jget(mj, 'optimizer')}; notes: {jget(mj, 'notes')}.")
    a, m = (tput or {}).get("tokens_per_s"), mj.get("tokens_per_s")
    ratio = f"{a / m:.2f}" if a and m else "-"
    differ = winner and jget(mj, "micro_batch", 0) != str(winner)
    ctx.md("", f"**Loom / Megatron-Core tokens/s: {ratio}**"
               f"{f' (different micro-batches: Megatron-Core did not fit {winner})' if differ else ''}")
    return f"ratio Loom/Megatron-Core {ratio}"
