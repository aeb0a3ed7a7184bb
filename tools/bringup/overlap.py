"""Step 10: overlapped gradient reduction and parameter gather (tools/bench_step.py) at d=2,
d=2 x p=2 and d=2 with the distributed optimizer, every rank on the one device."""
from __future__ import annotations

import re

from .context import DATA, Context, StepError


def step_overlap(ctx: Context) -> str:
    log = ctx.logs / "bench_step.log"
    env, args = {}, ["--loom", ctx.cfg.loom, "--data", DATA, "--json-out", ctx.cfg.work / "bench_step.json"]
    if ctx.accel == "gpu":
        env = {"LOOM_DEVICE_COLLECTIVES": "gloo", **ctx.device_env}
        args += ["--gpu", "--steps", ctx.cfg.environ.get("LOOM_BRINGUP_OVERLAP_STEPS") or "12", "--warmup", "3"]
        ctx.md("All ranks share one device, so collectives go through Gloo staged via host memory "
               "(`LOOM_DEVICE_COLLECTIVES=gloo`): the overlap hides host-side reduction time only.")
    else:
        args += ["--steps", "4", "--warmup", "1", "--hidden", "64"]
    rc = ctx.run(log, [ctx.py, "tools/bench_step.py", *args], env=env)
    lines = log.read_text(errors="replace").splitlines()
    ctx.md("", *(l for l in lines if re.match(r"^(\||loom train|d2)", l)))
    if rc != 0:
        ctx.md_log_tail(log, 20)
        raise StepError(f"exit {rc}")
    return " ".join(l for l in lines if l.startswith("d2"))
