"""The bring-up's steps: one ordered registry, one numbering, and the time-budget plan.

A step's number is its position in STEPS (1-based) whatever a call selects, so --help, the
driver's messages and docs/gpu_results.md all say "4. throughput" for the same thing. The order
is the run order: the scarcest figures first, so a call that runs short loses the least useful.

Budgets are seconds of wall clock, the cap each step runs under (its commands share it). The
plan keeps the sum of the planned steps' budgets within the call's time budget, so a call ends
in time even when every step uses its whole cap; optional steps that do not fit are deferred
(and run after all when the steps before them leave enough time, see admit()).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .context import GPU_TIME_BUDGET_S, RESERVE_S  # noqa: F401 (part of this module's interface)


@dataclass(frozen=True)
class Step:
    name: str                  # what --steps / --skip and the summary call it
    title: str                 # the section heading, after "N. "
    budget_s: int              # wall-clock cap of the whole step (its commands share it)
    writes: str                # what it leaves in the call's folder (runs/bringup/), beside its section
    summary: str               # one line for --help
    required: bool = False     # never deferred: a call that cannot fit it does not start
    needs: Tuple[str, ...] = ()  # steps whose results it uses: deferred with them in one call
    run: Optional[Callable] = field(default=None, compare=False, repr=False)


def _steps() -> List[Step]:
    # The step functions import the context; binding them here keeps registry's data importable
    # (and testable) on its own.
    from . import calibrate, env_build, mcore, memory, ops, overlap, throughput, tiny
    # Budgets are guesses until a GPU call measures them (docs/gpu_results.md gives each step's
    # seconds): env, build and tiny fill a first call's 555 s (`loom` took ~1400 s of one shared
    # core here, the host has 16 cores; tiny is two GPU runs, the CPU one comes from the bundle).
    return [
        Step("env", "Environment", 45, "logs/env.log",
             "nvidia-smi, torch.cuda properties, compilers, the bundle's libraries load",
             required=True, run=env_build.step_env),
        Step("build", "Build (`loom` and libloom_ops.so)", 360, "logs/build.log; the build in build-gpu/ (kept for later calls)",
             "`loom` + libloom_ops.so, CUDA for this GPU's architecture only, tests off "
             "(a dry run reuses build/)", required=True, run=env_build.step_build),
        Step("tiny", "Tiny recipe on one device: GPU fp32 and bf16 against CPU fp32", 150,
             "runs/tiny_*/metrics.jsonl",
             "recipes/gpt3_tiny_cpu.yaml, 1 rank through NCCL, GPU fp32 (1e-3) and bf16 (3%) "
             "against the bundle's CPU fp32 run", run=tiny.step_tiny),
        Step("throughput", "GPT-3 126m throughput on one device", 240,
             "loom_throughput.json, last_throughput.txt, plan_b*.csv, runs/tput_b*/",
             "recipes/gpt3_126m.yaml (bf16, s 2048, selective recompute, t=p=d=1) at the largest "
             "micro-batch that fits, beside `loom plan` and the formula", run=throughput.step_throughput),
        Step("calibrate", "Measured planner profile (`loom plan calibrate`) against the measured 126m run", 150,
             "calibrate.json, plan_cal_b*.csv",
             "`loom plan calibrate` on the device into a profile; `loom plan`'s prediction of "
             "step 4's run with it, beside the built-in profile's and the measurement",
             needs=("throughput",), run=calibrate.step_calibrate),
        Step("mcore", "Megatron-Core, same model and micro-batch (tools/bench_mcore_gpt.py)", 150,
             "mcore.json", "the same model and micro-batch in Megatron-Core, for a tokens/s ratio",
             needs=("throughput",), run=mcore.step_mcore),
        Step("layout", "t=2 × p=2 with sequence parallelism, 4 ranks on one device", 120,
             "runs/layout_t2p2/metrics.jsonl",
             "the tiny recipe as t=2 x p=2 with SP, 4 ranks sharing the GPU "
             "(LOOM_DEVICE_COLLECTIVES=gloo), against step 3's GPU fp32 run (1e-3)",
             needs=("tiny",), run=tiny.step_layout),
        Step("ops", "Op library check (tools/gpu_check.sh)", 120, "ops_out/gpu_results.md",
             "tools/gpu_check.sh on the library just built (op tests on cuda, bandwidth)",
             run=ops.step_ops),
        Step("sanitizer", "CUDA kernel tests under compute-sanitizer (memcheck, racecheck, synccheck)", 150,
             "logs/sanitizer_*.log",
             "the kernel test binary under compute-sanitizer's memcheck, racecheck and synccheck "
             "(skipped when the binary or compute-sanitizer is absent)", run=ops.step_sanitizer),
        Step("overlap", "Overlapped gradient reduction and parameter gather, d=2, d=2 × p=2 and d=2 "
             "with the distributed optimizer (tools/bench_step.py)", 240, "bench_step.json",
             "tools/bench_step.py --gpu: overlap off and on at d=2, d=2 x p=2, d=2 with the "
             "distributed optimizer, ranks sharing the GPU", run=overlap.step_overlap),
        Step("memory", "Memory model against the caching allocator (`loom plan --validate-memory`)", 240,
             "runs/memory/*/metrics.jsonl",
             "GPT-3 126m at s 2048, the memory sweep's one-rank cases: predicted beside measured peak "
             "and after-step bytes per case, and the reserved peak", run=memory.step_memory),
    ]


STEPS: List[Step] = _steps()
BY_NAME: Dict[str, Step] = {s.name: s for s in STEPS}


def number(name: str) -> int:
    """The step's one number: its 1-based position in STEPS."""
    return [s.name for s in STEPS].index(name) + 1


def heading(step: Step) -> str:
    return f"{number(step.name)}. {step.title}"


class SelectionError(ValueError):
    """A bad --steps / --skip / --budget value (the driver exits 2 and runs nothing)."""


def _names(text: str, flag: str) -> List[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    for n in names:
        if n not in BY_NAME:
            raise SelectionError(f"{flag}: unknown step '{n}' (steps: {', '.join(BY_NAME)})")
    return names


def select(steps: Optional[str] = None, skip: Optional[str] = None) -> List[Step]:
    """The steps a call runs, in registry order. `steps` (comma-separated; default: all) picks,
    `skip` removes; env always runs (every other step needs its python and bundle)."""
    picked = set(_names(steps, "--steps")) if steps is not None else set(BY_NAME)
    skipped = set(_names(skip, "--skip")) if skip is not None else set()
    if "env" in skipped:
        raise SelectionError("--skip: env cannot be skipped (it finds python and loads the bundle)")
    picked = (picked - skipped) | {"env"}
    return [s for s in STEPS if s.name in picked]


def parse_budgets(items: Sequence[str]) -> Dict[str, int]:
    """--budget NAME=SECONDS overrides (also LOOM_BRINGUP_BUDGET_<NAME>)."""
    out = {}
    for item in items:
        name, sep, secs = item.partition("=")
        if not sep or name not in BY_NAME:
            raise SelectionError(f"--budget: expected STEP=SECONDS with STEP one of {', '.join(BY_NAME)}, got '{item}'")
        try:
            value = int(secs)
        except ValueError:
            raise SelectionError(f"--budget {name}: seconds must be an integer, got '{secs}'") from None
        if value <= 0:
            raise SelectionError(f"--budget {name}: seconds must be positive, got {value}")
        out[name] = value
    return out


@dataclass
class Plan:
    planned: List[Step]        # guaranteed to fit: sum of budgets <= time budget - RESERVE_S
    deferred: List[Step]       # optional steps that did not fit; run only if time is left over
    budgets: Dict[str, int]    # the budget of every selected step (overrides applied)
    time_budget_s: int

    def planned_s(self) -> int:
        return sum(self.budgets[s.name] for s in self.planned)

    def order(self) -> List[Step]:
        """Every selected step, in registry order."""
        return sorted(self.planned + self.deferred, key=lambda s: number(s.name))


def plan(selected: Sequence[Step], time_budget_s: int, overrides: Optional[Dict[str, int]] = None,
         scale: int = 1) -> Plan:
    """Fits the selection into time_budget_s: required steps first, then optional ones in
    registry order while the sum of budgets still fits; the rest are deferred, and so is a step
    that needs a deferred one (a step it needs but that was not selected is not waited for:
    the step then reads an earlier call's results). `scale` multiplies the registry's budgets
    (not the overrides): a dry run's CPU runs are slower than the GPU host's. Raises
    SelectionError when the required steps alone do not fit (nothing should start then)."""
    budgets = {s.name: (overrides or {}).get(s.name, s.budget_s * scale) for s in selected}
    room = time_budget_s - RESERVE_S
    required = [s for s in selected if s.required]
    need = sum(budgets[s.name] for s in required)
    if need > room:
        parts = " + ".join(f"{s.name} {budgets[s.name]} s" for s in required)
        raise SelectionError(f"the required steps need {parts} = {need} s, more than the time budget "
                             f"{time_budget_s} s less {RESERVE_S} s kept for the results; raise --time-budget, "
                             f"lower a --budget, or leave build out (--skip build reuses an earlier build)")
    used = need
    planned, deferred = [], []
    for s in selected:
        if s.required:
            planned.append(s)
        elif used + budgets[s.name] <= room and not any(d.name in s.needs for d in deferred):
            planned.append(s)
            used += budgets[s.name]
        else:
            deferred.append(s)
    return Plan(planned, deferred, budgets, time_budget_s)


def admit(p: Plan, step: Step, remaining_s: float, done: Sequence[str]) -> bool:
    """Whether to start `step` with remaining_s seconds left before the call's deadline (the
    reserve not included): a planned step always starts (the plan made room for it); a deferred
    one only when its budget fits beside the budgets of the planned steps still to come, and
    every selected step it needs has run in this call."""
    if step in p.planned:
        return True
    selected = {s.name for s in p.order()}
    if any(n in selected and n not in done for n in step.needs):
        return False
    later = [s for s in p.planned if s.name not in done and s.name != step.name
             and number(s.name) > number(step.name)]
    return remaining_s - sum(p.budgets[s.name] for s in later) >= p.budgets[step.name]
