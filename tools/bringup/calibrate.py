"""Step 5: `loom plan calibrate` measures the device (docs/planner.md, "Measured profiles"); the
planner then predicts step 4's measured run (its micro-batch, from this call or the last one)
with that profile and with the built-in one."""
from __future__ import annotations

import json
from typing import List

from .context import Context, StepError, timed_out
from .throughput import last_throughput, plan_for, plan_prediction


def profile_tables(profile: dict) -> List[str]:
    """The measured profile as markdown: its device entry, GEMM and fused-attention rates."""
    d = profile.get("device", {})
    out = [f"Profile device entry: {d.get('name')} (peak {d.get('peak_tflops')} TFLOP/s, HBM "
           f"{d.get('memory_bandwidth_gbs')} GB/s); copy {profile.get('memory_bandwidth_gbs', 0):.1f} GB/s, "
           f"per-op cost {profile.get('kernel_launch_us', 0):.1f} us, dtype {profile.get('measured', {}).get('dtype')}.",
           "", "| GEMM m x n x k | TFLOP/s |", "|---|---|"]
    out += [f"| {g['m']} x {g['n']} x {g['k']} | {g['tflops']:.3g} |" for g in profile.get("gemm", [])]
    if profile.get("fused_attention"):
        out += ["", "| fused attention batch x heads x seq x head_dim | forward TFLOP/s | backward TFLOP/s |", "|---|---|---|"]
        out += [f"| {a['batch']} x {a['heads']} x {a['seq']} x {a['head_dim']} | {a['fwd_tflops']:.3g} | "
                f"{a['bwd_tflops']:.3g} |" for a in profile["fused_attention"]]
    return out + [""]


def comparison(measured: dict, builtin: dict, calibrated: dict, builtin_name: str):
    """(table lines, summary): measured tokens/s beside both predictions and their errors."""
    m = measured.get("tokens_per_s")
    err = lambda t: (t / m - 1) if (t and m) else None
    f = lambda v, spec: "-" if v is None else format(v, spec)
    pct = lambda e: "-" if e is None else format(100 * e, "+.1f") + "%"
    rows = [("measured (throughput step)", m, measured.get("mfu"), None)]
    for name, p in ((f"loom plan, built-in {builtin_name} profile", builtin), ("loom plan, measured profile", calibrated)):
        t = p.get("tokens_per_second")
        rows.append((name, t, p.get("mfu"), err(t)))
    lines = ["| | tokens/s | MFU | error vs measured |", "|---|---|---|---|"]
    lines += [f"| {name} | {f(t, '.0f')} | {f(mfu, '.3f')} | {pct(e)} |" for name, t, mfu, e in rows]
    return lines, f"measured profile {pct(rows[2][3])} vs measured tokens/s (built-in profile {pct(rows[1][3])})"


def step_calibrate(ctx: Context) -> str:
    cfg, work = ctx.cfg, ctx.cfg.work
    log, profile = ctx.logs / "calibrate.log", work / "calibrate.json"
    env = dict(ctx.device_env) if ctx.accel == "gpu" else {}
    # The dtype the throughput step trains in: bf16 on the GPU, fp32 in a dry run (short measurements).
    secs = ["--seconds", "0.03", "--dtype", "fp32"] if cfg.dry else []
    profile.unlink(missing_ok=True)
    # Leave a minute of the step for the two plans below.
    rc = ctx.run(log, [cfg.loom, "plan", "calibrate", "--devices", "1", "--accelerator", ctx.accel, *secs,
                       "--out", profile], cap=max(ctx.step_remaining() - 30, 5), env=env)
    said = next((l.replace("loom plan calibrate: ", "", 1) for l in log.read_text(errors="replace").splitlines()
                 if "loom plan calibrate:" in l), "")
    ctx.md(f"`loom plan calibrate --devices 1 --accelerator {ctx.accel}` on {ctx.accel_note} (one rank: no "
           f"collectives): exit {rc}{timed_out(rc)}. {said}")
    if rc != 0 or not profile.is_file() or profile.stat().st_size == 0:
        ctx.md_log_tail(log, 20)
        raise StepError(f"calibrate exit {rc}")
    ctx.md("")
    try:
        ctx.md(*profile_tables(json.loads(profile.read_text())))
    except (ValueError, KeyError, TypeError) as e:
        ctx.md(f"The profile could not be read: {type(e).__name__}: {e}")
    b, tput = last_throughput(ctx)
    if not b or not tput:
        ctx.md("No measured 126m run to compare with (the throughput step did not run or failed).")
        raise StepError("profile written; no measured run to compare with")
    # `loom plan` exits 1 when the layout does not fit (the dry run's pretend memory): its CSV
    # still has the layout's predicted time, which is what is compared here.
    if not (work / f"plan_b{b}.csv").is_file():
        plan_for(ctx, b)
    (work / f"plan_cal_b{b}.csv").unlink(missing_ok=True)
    plan_for(ctx, b, profile)
    cal_csv = work / f"plan_cal_b{b}.csv"
    if not cal_csv.is_file() or cal_csv.stat().st_size == 0:
        ctx.md_log_tail(ctx.logs / f"plan_cal_b{b}.log", 15)
        raise StepError("loom plan --profile wrote no prediction")
    gpu = (work / "plan_gpu.txt").read_text().strip() if (work / "plan_gpu.txt").is_file() else "H200"
    lines, summary = comparison(tput, plan_prediction(ctx, work / f"plan_b{b}.csv", b),
                                plan_prediction(ctx, cal_csv, b), gpu)
    dry_note = "; a dry run's shrunk shape and CPU or stand-in profile check the plumbing only" if cfg.dry else ""
    ctx.md(f"Micro-batch {b} (the throughput step's largest that ran), the plans for that step's layout (t=p=d=1, "
           f"selective recompute){dry_note}.",
           "", *lines, "",
           f"Profile: `{profile}` (also under $OUT/bringup/); `loom plan --profile` it to plan for this machine.")
    return summary
