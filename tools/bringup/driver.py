"""The bring-up's command line and its loop over the planned steps.

Exit status: 0 every step that ran passed (or was skipped: it cannot apply on this host), 1 a
step failed or a planned one did not run, 2 bad arguments or a plan that cannot fit (nothing
ran). Whatever happens after the plan, the results file is complete: it is written before the
first step, after every step, and on TERM/INT.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from . import registry
from .context import Config, ConfigError, Context, Interrupted, StepError, make_config
from .registry import Plan, SelectionError, Step
from .results import DEFERRED, FAIL, NOT_RUN, PASS, Results

PROG = "tools/gpu_bringup.sh"
# A planned step is not started with less than this left (it could not do anything useful).
MIN_STEP_S = 20

ENVIRONMENT = """\
environment:
  OUT                       also copy the results, logs' tails, metrics and JSON/CSV under it
  LOOM_PYTHON               python with torch (default: the first of python3/python that imports it)
  LOOM_BRINGUP_DEADLINE_S   default --time-budget (570 s on the GPU host: under the device tool's
                            600-s command limit; a dry run's default plans every step)
  LOOM_BRINGUP_BUDGET_<STEP>  a step's budget in seconds (like --budget STEP=S)
  LOOM_BRINGUP_MBS          micro-batch candidates of step {tput} (default 1 2 4 ... 128)
  LOOM_BRINGUP_TINY_STEPS   steps of the tiny runs (30; the bundle's reference must match)
  LOOM_BRINGUP_TPUT_STEPS   steps of a throughput run (10, the first 3 not timed)
  LOOM_BRINGUP_MCORE_MBS, LOOM_BRINGUP_MCORE_STEPS   Megatron-Core's micro-batch and steps
  LOOM_BRINGUP_OVERLAP_STEPS  steps of each bench_step.py run (12)
  LOOM_BRINGUP_KERNEL_TESTS, LOOM_BRINGUP_KERNEL_TEST_ARGS   the kernel test binary of step {san}
                            and its arguments
  LOOM_BRINGUP_JOBS         build jobs (default: the number of cores)
  LOOM_BRINGUP_BUILD        a dry run's build folder (default build/)
  LOOM_BRINGUP_DRY_SCALE    a dry run's budgets as a multiple of the GPU host's (3: CPU runs are slower)
"""


def steps_help() -> str:
    lines = ["steps (run in this order; the numbers are those of docs/gpu_results.md; what each writes is",
             "in runs/bringup/, a dry run's in runs/bringup-dryrun/):"]
    for s in registry.STEPS:
        tag = " [required]" if s.required else ""
        lines.append(f"  {registry.number(s.name):2d}. {s.name:<10} {s.budget_s:4d} s{tag}  {s.summary}")
        lines.append(f"      {'':<10}         writes {s.writes}")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="One-shot GPU bring-up of Loom on the lent GPU host (one GPU; torch wheel, nvcc, cmake, "
                    "ninja, a C++ compiler; no installs, no network; gpu_bundle/ from tools/gpu_bundle.sh "
                    "carried in). Writes docs/gpu_results.md (and $OUT/gpu_results.md plus $OUT/bringup/) "
                    "after every step. The plan keeps the sum of the planned steps' budgets within the time "
                    "budget; optional steps that do not fit are deferred (run when earlier steps leave time, "
                    "else named in the results for a later call).",
        epilog=steps_help() + "\n\n" + ENVIRONMENT.format(tput=registry.number("throughput"),
                                                          san=registry.number("sanitizer")) + """
examples:
  tools/gpu_bringup.sh                        # on the GPU host: what fits in 570 s, build first
  tools/gpu_bringup.sh --plan                 # print the plan, run nothing
  tools/gpu_bringup.sh --steps throughput,calibrate,mcore   # a later call: reuses build-gpu/
  tools/gpu_bringup.sh --skip build --time-budget 280   # keep --time-budget under the device
                                              # command's own timeout (less when less device time is left)
  tools/gpu_bringup.sh --dry-run              # here, on CPU: build/, small shapes, runs/bringup-dryrun/""")
    p.add_argument("--dry-run", action="store_true",
                   help="here, on CPU: reuses build/ (LOOM_BRINGUP_BUILD), the stand-in device, small shapes; "
                        "results in runs/bringup-dryrun/, never docs/")
    p.add_argument("--steps", help="comma-separated steps to run (default: all; env always runs)")
    p.add_argument("--skip", help="comma-separated steps not to run")
    p.add_argument("--time-budget", type=int, metavar="S", help="seconds for the whole call (default 570 on the GPU host)")
    p.add_argument("--budget", action="append", default=[], metavar="STEP=S", help="a step's budget in seconds")
    p.add_argument("--plan", action="store_true", help="print the plan (numbers, budgets, deferred steps) and exit")
    p.add_argument("--make-reference", metavar="DIR",
                   help="for tools/gpu_bundle.sh: the tiny step's CPU fp32 run (LOOM_BIN's build) into DIR")
    return p


def budget_overrides(environ: Dict[str, str], items: Sequence[str]) -> Dict[str, int]:
    """LOOM_BRINGUP_BUDGET_<STEP> then --budget STEP=S (the command line wins)."""
    from_env = [f"{s.name}={environ[k]}" for s in registry.STEPS
                if (k := f"LOOM_BRINGUP_BUDGET_{s.name.upper()}") in environ and environ[k]]
    return registry.parse_budgets(from_env + list(items))


def plan_text(p: Plan) -> List[str]:
    n = registry.number
    out = [f"Plan: {', '.join(f'{n(s.name)} {s.name} ({p.budgets[s.name]} s)' for s in p.planned)}; "
           f"{p.planned_s()} s of budgets within the time budget {p.time_budget_s} s "
           f"({registry.RESERVE_S} s kept for the results)."]
    if p.deferred:
        out.append(f"Deferred (they run only if the steps before them leave time): "
                   f"{', '.join(f'{n(s.name)} {s.name} ({p.budgets[s.name]} s)' for s in p.deferred)}.")
    return out


def later_call(names: Sequence[str]) -> str:
    return f"`{PROG} --steps {','.join(names)}`"


def clean_work(work: Path) -> None:
    """Removes the last call's outputs; keeps last_throughput.txt and the index cache."""
    for d in ("logs", "runs", "pysite", "ops_out"):
        shutil.rmtree(work / d, ignore_errors=True)
    for pattern in ("*.json", "*.csv", "*.smi"):
        for f in work.glob(pattern):
            f.unlink()
    (work / "logs").mkdir(parents=True, exist_ok=True)
    (work / "runs").mkdir(parents=True, exist_ok=True)


def _title_lines(cfg: Config, accel_note: str = "the stand-in device when it is built") -> List[str]:
    if cfg.dry:
        return ["# Loom GPU bring-up — DRY RUN on the development machine (no GPU figures)", "",
                f"> Dry run of tools/gpu_bringup.sh: the existing build, small shapes, {accel_note}.",
                "> It checks the driver's plumbing only; nothing below describes a GPU."]
    return ["# Loom GPU bring-up results"]


class Call:
    """One call of the bring-up: its plan, results and the loop over the steps."""

    def __init__(self, cfg: Config, p: Plan, command: str, clock=None):
        self.cfg, self.plan = cfg, p
        self.results = Results(cfg.results, cfg.work, _title_lines(cfg), command, cfg.time_budget_s, cfg.out,
                               clock=clock or time.time)
        self.ctx = Context(cfg, self.results, clock=clock or time.time)
        for s in registry.STEPS:
            if s in p.planned:
                self.results.add_step(registry.number(s.name), s.name, registry.heading(s), p.budgets[s.name])
            elif s in p.deferred:
                self.results.add_step(registry.number(s.name), s.name, registry.heading(s), p.budgets[s.name],
                                      DEFERRED, "did not fit the time budget; runs if the steps before it leave time")
        self.results.plan_lines = plan_text(p)

    def _not_run(self, steps: Sequence[Step], detail: str) -> None:
        """Planned steps not reached: "not run" (a failure); deferred ones stay deferred."""
        for s in steps:
            if s.name not in self.ctx.done and s in self.plan.planned:
                self.results.finish(s.name, NOT_RUN, None, detail)

    def run_step(self, step: Step) -> str:
        ctx, res = self.ctx, self.results
        ctx.current = step.name
        ctx.step_deadline = ctx.clock() + self.plan.budgets[step.name]
        t0 = ctx.clock()
        label = f"{registry.number(step.name)}. {step.name}"
        ctx.say(f"{label} — {step.title} (budget {self.plan.budgets[step.name]} s, {int(ctx.remaining())} s left)")
        status, detail = PASS, ""
        try:
            detail = step.run(ctx) or ""
        except StepError as e:
            status, detail = e.status, e.detail
        except Interrupted:
            ctx.stop_children()
            ctx.md("", "**Interrupted by a signal during this step.**")
            ctx.done.append(step.name)
            res.finish(step.name, FAIL, ctx.clock() - t0, "interrupted")
            raise
        except Exception as e:  # a bug in the driver must not lose the other steps' results
            ctx.md("", "Driver error (a bug in tools/bringup/):", "```",
                   *traceback.format_exc().splitlines()[-12:], "```")
            status, detail = FAIL, f"driver error: {type(e).__name__}: {e}"
        ctx.done.append(step.name)
        res.finish(step.name, status, ctx.clock() - t0, detail)
        res.write()
        ctx.say(f"{label}: {status} ({round(ctx.clock() - t0)} s) {detail}")
        return status

    def run(self) -> int:
        ctx, res, p = self.ctx, self.results, self.plan
        res.write()
        steps = p.order()
        try:
            for i, step in enumerate(steps):
                if step in p.deferred and not registry.admit(p, step, ctx.remaining(), ctx.done):
                    continue
                if step.name != "env" and ctx.remaining() < MIN_STEP_S:
                    self._not_run([step], f"out of time ({int(ctx.remaining())} s left)")
                    res.write()
                    continue
                status = self.run_step(step)
                stop = None
                if step.name == "env":
                    stop = "step 1 (env) failed" if status != PASS else None
                    if not stop:
                        from . import tiny
                        tiny.choose_accelerator(ctx)
                        if self.cfg.dry:
                            res.title_lines = _title_lines(self.cfg, ctx.accel_note)
                elif step.name == "build" and status != PASS:
                    stop = f"step {registry.number('build')} (build) failed"
                if not stop and step.name in ("env", "build") and all(s.name != "build" for s in steps[i + 1:]):
                    stop = self._build_unusable()
                if stop:
                    self._not_run(steps[i + 1:], stop)
                    res.write()
                    break
        except Interrupted:
            self._not_run(steps, "the call was interrupted")
            res.write()
            ctx.say(f"interrupted: {self.cfg.results} written")
            return 1
        except Exception as e:   # a bug between steps: still write what the call has
            self._not_run(steps, f"driver error: {type(e).__name__}: {e}")
            res.plan_lines = res.plan_lines + ["", "Driver error between steps (a bug in tools/bringup/):", "```",
                                               *traceback.format_exc().splitlines()[-12:], "```"]
            res.write()
            ctx.say(f"driver error: {type(e).__name__}: {e}; {self.cfg.results} written")
            return 1
        left = [n for n, r in res.rows.items() if r.status == DEFERRED]
        for n in left:
            res.finish(n, DEFERRED, None, f"did not fit the time budget: a later call, {later_call([n])}")
        if left:
            res.plan_lines = res.plan_lines + [f"Not reached in this call: {later_call(left)} runs them."]
        res.write()
        where = f"{self.cfg.results}" + (f" and {self.cfg.out}/gpu_results.md" if self.cfg.out else "")
        ctx.say(f"done in {ctx.elapsed()} s: {where}; "
                f"{'some checks FAILED or did not run' if res.failed() else 'all checks that ran passed'}"
                f"{'; deferred: ' + ','.join(left) if left else ''}")
        return 1 if res.failed() else 0

    def _build_unusable(self) -> Optional[str]:
        """Once no build step is to come: why the later steps cannot run (None when `loom` is there)."""
        from . import env_build
        if not (self.cfg.loom.is_file() and os.access(self.cfg.loom, os.X_OK)):
            return f"no usable {self.cfg.loom}" + ("" if self.cfg.dry else ": add build to --steps")
        env_build.inspect_build(self.ctx)
        return None


def _on_signal(signum, frame):
    raise Interrupted(signal.Signals(signum).name)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parser().parse_args(argv)
    os.chdir(Path(__file__).resolve().parents[2])
    mode = "reference" if args.make_reference else ("dry" if args.dry_run else "gpu")
    try:
        cfg = make_config(mode, os.environ, args.time_budget)
        if args.make_reference:
            return make_reference(cfg, Path(args.make_reference))
        p = registry.plan(registry.select(args.steps, args.skip), cfg.time_budget_s,
                          budget_overrides(dict(os.environ), args.budget), cfg.budget_scale)
    except (SelectionError, ConfigError) as e:
        print(f"gpu_bringup: {e}", file=sys.stderr)
        return 2
    if args.plan:
        print("\n".join(plan_text(p)))
        return 0
    clean_work(cfg.work)
    command = PROG + "".join(f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
    call = Call(cfg, p, command)
    if cfg.dry:
        # What a GPU call of the same selection would plan with the default budget.
        try:
            g = registry.plan(registry.select(args.steps, args.skip), registry.GPU_TIME_BUDGET_S,
                              budget_overrides(dict(os.environ), args.budget))
            call.results.plan_lines += ["", "On the GPU host (default time budget): " + " ".join(plan_text(g))]
        except SelectionError as e:
            call.results.plan_lines += ["", f"On the GPU host this selection could not start: {e}"]
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    return call.run()


def make_reference(cfg: Config, dest: Path) -> int:
    from . import env_build, tiny
    clean_work(cfg.work)
    res = Results(cfg.results, cfg.work, ["# reference"], f"{PROG} --make-reference {dest}", cfg.time_budget_s)
    ctx = Context(cfg, res)
    ctx.py = env_build.find_python(ctx) or ""
    if not ctx.py:
        print("gpu_bringup: no python that imports torch", file=sys.stderr)
        return 1
    ctx.step_deadline = ctx.deadline
    return tiny.make_reference(ctx, dest)
