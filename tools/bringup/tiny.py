"""Steps 3 and 7: the tiny recipe on one device (GPU fp32 and bf16 against CPU fp32) and as
t=2 x p=2 with sequence parallelism, four ranks sharing the device; and the CPU reference run
that tools/gpu_bundle.sh carries (--make-reference)."""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import List

from . import metrics
from .context import DATA, Context, StepError, device_line, timed_out

RECIPE = "recipes/gpt3_tiny_cpu.yaml"
BUNDLE_REF = Path("gpu_bundle/reference")


def choose_accelerator(ctx: Context) -> None:
    """The accelerator Loom's GPU code path runs on: the GPU, or in a dry run the CPU-backed
    stand-in device when it is built, else the CPU itself. device_env: the environment of runs
    with trainer.accelerator=gpu (the plugin, in a dry run)."""
    ctx.accel, ctx.accel_note, ctx.device_env = "gpu", "GPU", {}
    if ctx.cfg.dry:
        plugin = ctx.cfg.build / "lib" / "libloom_standin_device.so"
        if plugin.is_file():
            ctx.device_env = {"LOOM_DEVICE_PLUGIN": str(plugin.resolve())}
            ctx.accel_note = f"trainer.accelerator=gpu on the stand-in device ({plugin})"
        else:
            ctx.accel = "cpu"
            ctx.accel_note = f"trainer.accelerator=cpu for the GPU runs ({plugin} is not built yet)"


def common_overrides(ctx: Context, name: str) -> List[str]:
    n = ctx.cfg.tiny_steps
    return [f"run.name={name}", f"run.results_dir={ctx.cfg.work}/runs/{name}",
            f"trainer.max_steps={n}", f"trainer.val_check_interval={n}", "trainer.limit_val_batches=0",
            "trainer.log_every_n_steps=10", "exp_manager.create_checkpoint_callback=false",
            "exp_manager.resume_if_exists=false", f"model.data.data_prefix=[1.0,{DATA}]",
            f"model.data.index_mapping_dir={ctx.cfg.work}/index_cache"]


def tiny_run(ctx: Context, name: str, accel: str, precision: str, cap=None) -> int:
    """One run of the tiny recipe into WORK/runs/NAME, one line (and a log tail) in the section."""
    env = {}
    if accel == "gpu":
        # Real communicators even for one rank: the run goes through NCCL (or the stand-in's
        # communicator in a dry run) as a multi-GPU run does.
        env.update(ctx.device_env)
        if ctx.nccl_built:
            env["LOOM_SINGLE_RANK_GROUPS"] = "1"
    shutil.rmtree(ctx.cfg.work / "runs" / name, ignore_errors=True)
    log = ctx.logs / f"{name}.log"
    rc = ctx.run(log, [ctx.cfg.loom, "train", RECIPE, *common_overrides(ctx, name),
                       f"trainer.accelerator={accel}", f"trainer.precision={precision}", "trainer.devices=1",
                       "model.tensor_model_parallel_size=1", "model.pipeline_model_parallel_size=1",
                       "model.sequence_parallel=false"], cap=cap, env=env)
    ctx.md(f"- `{name}` ({accel}, precision {precision}): exit {rc}{timed_out(rc)}; {device_line(log)}")
    if rc != 0:
        ctx.md_log_tail(log, 15)
    return rc


def _bundle_reference_fits(ctx: Context) -> bool:
    try:
        steps = (BUNDLE_REF / "tiny_steps").read_text().strip()
    except OSError:
        return False
    return (BUNDLE_REF / "tiny_cpu_fp32.metrics.jsonl").is_file() and steps == str(ctx.cfg.tiny_steps)


def _use_bundle_reference(ctx: Context) -> None:
    dest = ctx.cfg.work / "runs" / "tiny_cpu_fp32"
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(BUNDLE_REF / "tiny_cpu_fp32.metrics.jsonl", dest / "metrics.jsonl")
    try:
        made_on = (BUNDLE_REF / "made_on").read_text()[:200].strip()
    except OSError:
        made_on = "?"
    ctx.md(f"- `tiny_cpu_fp32` (cpu, precision 32): the bundle's, made by tools/gpu_bundle.sh on the "
           f"development machine ({made_on})")


def step_tiny(ctx: Context) -> str:
    ctx.md(f"{RECIPE} as one rank (t=p=d=1, 4 micro-batches of 2, sequence 128), {ctx.cfg.tiny_steps} steps, "
           f"no validation or checkpoints; GPU runs on {ctx.accel_note}; losses from each run's metrics.jsonl.", "")
    runs = ctx.cfg.work / "runs"
    use_bundle = not ctx.cfg.dry and _bundle_reference_fits(ctx)
    plan = [("tiny_gpu_fp32", ctx.accel, "32"), ("tiny_gpu_bf16", ctx.accel, "bf16")]
    if not use_bundle:
        plan.append(("tiny_cpu_fp32", "cpu", "32"))
    ok = True
    for i, (name, accel, precision) in enumerate(plan):
        # The step's time shared among the runs still to come (a hang costs one run, not all).
        ok &= tiny_run(ctx, name, accel, precision, cap=ctx.step_remaining() / (len(plan) - i)) == 0
    if use_bundle:
        _use_bundle_reference(ctx)
    ctx.md("")
    if not (runs / "tiny_cpu_fp32" / "metrics.jsonl").is_file():
        raise StepError("no CPU fp32 reference run")
    try:
        lines, same = metrics.compare(runs / "tiny_cpu_fp32", [runs / "tiny_gpu_fp32", runs / "tiny_gpu_bf16"],
                                      [1e-3, 3e-2], ["GPU fp32", "GPU bf16"], "CPU fp32")
        ctx.md(*lines)
    except (OSError, ValueError, KeyError) as e:
        ctx.md(f"No loss table: {type(e).__name__}: {e}")
        same = False
    if not (ok and same):
        raise StepError("see the table (a run failed or a tolerance was exceeded)")
    return "fp32 within 1e-3, bf16 within 3% of CPU fp32"


def step_layout(ctx: Context) -> str:
    runs = ctx.cfg.work / "runs"
    ref = "tiny_gpu_fp32" if (runs / "tiny_gpu_fp32" / "metrics.jsonl").is_file() else "tiny_cpu_fp32"
    if ref == "tiny_cpu_fp32" and not (runs / ref / "metrics.jsonl").is_file() \
            and not ctx.cfg.dry and _bundle_reference_fits(ctx):
        # Step 3 did not run in this call: the bundle's CPU fp32 run is the reference.
        _use_bundle_reference(ctx)
    ctx.md("NCCL refuses two ranks on one device, so device tensors' collectives go through Gloo staged via host "
           "memory (`LOOM_DEVICE_COLLECTIVES=gloo`); rank r runs on cuda:(local_rank % device_count). "
           f"Compared with the 1-rank run `{ref}` (limit 1e-3 relative).", "")
    env = {}
    if ctx.accel == "gpu":
        env = {"LOOM_DEVICE_COLLECTIVES": "gloo", **ctx.device_env}
    name = "layout_t2p2"
    shutil.rmtree(runs / name, ignore_errors=True)
    log = ctx.logs / f"{name}.log"
    rc = ctx.run(log, [ctx.cfg.loom, "train", RECIPE, *common_overrides(ctx, name),
                       f"trainer.accelerator={ctx.accel}", "trainer.precision=32", "trainer.devices=4",
                       "model.tensor_model_parallel_size=2", "model.pipeline_model_parallel_size=2",
                       "model.sequence_parallel=true"], env=env)
    backend = "LOOM_DEVICE_COLLECTIVES=gloo" if ctx.accel == "gpu" else "cpu"
    ctx.md(f"- backend: {backend if ctx.accel == 'gpu' else 'CPU ranks (Gloo)'}; Loom says: {device_line(log)}; "
           f"exit {rc}{timed_out(rc)}", "")
    ok = rc == 0
    if not ok:
        ctx.md_log_tail(log, 20)
    detail = ""
    if (runs / ref / "metrics.jsonl").is_file() and (runs / name / "metrics.jsonl").is_file():
        try:
            lines, same = metrics.compare(runs / ref, [runs / name], [1e-3], ["t2 p2 SP"], f"1 rank ({ref})")
            ctx.md(*lines)
            detail = lines[-1].replace("- t2 p2 SP: ", "")
            ok &= same
        except (OSError, ValueError, KeyError) as e:
            ctx.md(f"No loss table: {type(e).__name__}: {e}")
            ok = False
    else:
        ok = False
    if not ok:
        raise StepError(f"{backend}: {detail or f'no losses (exit {rc})'}")
    return f"{backend}: {detail}"


def make_reference(ctx: Context, dest: Path) -> int:
    """For tools/gpu_bundle.sh: the tiny step's CPU fp32 run, with the GPU run's step count,
    into DEST (tiny_cpu_fp32.metrics.jsonl, tiny_steps, made_on). Returns the exit status."""
    import sys
    if tiny_run(ctx, "tiny_cpu_fp32", "cpu", "32") != 0:
        sys.stderr.write((ctx.logs / "tiny_cpu_fp32.log").read_text(errors="replace"))
        return 1
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(ctx.cfg.work / "runs" / "tiny_cpu_fp32" / "metrics.jsonl", dest / "tiny_cpu_fp32.metrics.jsonl")
    (dest / "tiny_steps").write_text(f"{ctx.cfg.tiny_steps}\n")
    (dest / "made_on").write_text(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}, {os.uname().machine}, "
                                  f"{os.cpu_count()} cores\n")
    ctx.say(f"reference: {dest}/tiny_cpu_fp32.metrics.jsonl ({ctx.cfg.tiny_steps} steps)")
    return 0
