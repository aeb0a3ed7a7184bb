"""Steps 8 and 9: the op library check (tools/gpu_check.sh: op tests on cuda, bandwidth) and the
CUDA kernel tests under compute-sanitizer (memcheck, racecheck, synccheck)."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import time
from pathlib import Path
from typing import Optional

from .context import Context, StepError, timed_out
from .results import SKIPPED

# The kernel tests built by nvcc against the real CUDA runtime (issue #29 part 5): the CMake
# target and the binary it leaves in <build>/bin. LOOM_BRINGUP_KERNEL_TESTS names another binary.
KERNEL_TEST_TARGET = "loom_test_cuda_kernels_gpu"  # tests/cuda_sim: the kernel tests built against the real runtime
SANITIZER_TOOLS = ("memcheck", "racecheck", "synccheck")
ERROR_SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) error")


def step_ops(ctx: Context) -> str:
    cfg = ctx.cfg
    log, out = ctx.logs / "gpu_check.log", cfg.work / "ops_out"
    dev = "cpu" if cfg.dry else "cuda"
    if not cfg.ops_lib.is_file():
        raise StepError(f"no {cfg.ops_lib} (build step)")
    shutil.rmtree(out, ignore_errors=True)
    # gpu_check writes $OUT/gpu_results.md itself: give it its own folder, include its file here.
    rc = ctx.run(log, ["tools/gpu_check.sh"], env={"LOOM_PYTHON": ctx.py, "LOOM_OPS_LIB": str(cfg.ops_lib),
                                                   "LOOM_GPU_CHECK_DEVICE": dev, "OUT": str(out.resolve())})
    ctx.md(f"Library: `{cfg.ops_lib}` (the build step's), device {dev}.", "")
    if (out / "gpu_results.md").is_file():
        for line in (out / "gpu_results.md").read_text(errors="replace").splitlines():
            ctx.md(re.sub(r"^# ", "### ", re.sub(r"^## ", "#### ", line)))
    else:
        ctx.md_log_tail(log, 40)
    if rc == 0:
        return "op tests passed, targets met"
    if rc == 3:
        raise StepError("op tests passed, bandwidth targets missed (exit 3)")
    raise StepError("timed out" if rc in (124, 137) else f"exit {rc}")


def find_sanitizer(ctx: Context) -> Optional[str]:
    """compute-sanitizer on PATH, beside nvcc, or in /usr/local/cuda/bin."""
    nvcc = ctx.which("nvcc")
    for c in (ctx.which("compute-sanitizer"), nvcc and os.path.join(os.path.dirname(nvcc), "compute-sanitizer"),
              "/usr/local/cuda/bin/compute-sanitizer"):
        if c and os.access(c, os.X_OK):
            return c
    return None


def kernel_test_binary(ctx: Context) -> Path:
    named = ctx.cfg.environ.get("LOOM_BRINGUP_KERNEL_TESTS")
    return Path(named) if named else ctx.cfg.build / "bin" / KERNEL_TEST_TARGET


def _build_knows(ctx: Context, target: str) -> bool:
    """Whether the build tree has the target (a Ninja build lists it)."""
    if not (ctx.cfg.build / "build.ninja").is_file():
        return False
    listing = ctx.capture(["ninja", "-C", ctx.cfg.build, "-t", "targets", "all"], timeout=30)
    return any(line.split(":")[0] == target for line in listing.splitlines())


def sanitizer_errors(log: Path) -> Optional[int]:
    """The count in compute-sanitizer's "ERROR SUMMARY: N errors" line; None when absent."""
    found = ERROR_SUMMARY.findall(Path(log).read_text(errors="replace"))
    return int(found[-1]) if found else None


def step_sanitizer(ctx: Context) -> str:
    cfg = ctx.cfg
    binary = kernel_test_binary(ctx)
    sanitizer = find_sanitizer(ctx)
    ctx.md(f"Kernel test binary: `{binary}`; compute-sanitizer: `{sanitizer or 'not found'}`.", "")
    if cfg.dry:
        raise StepError("compute-sanitizer needs a GPU (a dry run only reports what it would use)", SKIPPED)
    if not binary.is_file() and not cfg.environ.get("LOOM_BRINGUP_KERNEL_TESTS") and _build_knows(ctx, KERNEL_TEST_TARGET):
        log = ctx.logs / "kernel_tests_build.log"
        rc = ctx.run(log, ["cmake", "--build", cfg.build, "-j", str(cfg.jobs), "--target", KERNEL_TEST_TARGET],
                     cap=ctx.step_remaining() / 2)
        ctx.md(f"Built `{KERNEL_TEST_TARGET}`: exit {rc}{timed_out(rc)}.")
        if rc != 0:
            ctx.md_log_tail(log, 30)
            raise StepError(f"building {KERNEL_TEST_TARGET} failed (exit {rc})")
    if not binary.is_file():
        raise StepError(f"no kernel test binary {binary} (target {KERNEL_TEST_TARGET} is not in this build; "
                        f"LOOM_BRINGUP_KERNEL_TESTS=PATH names one)", SKIPPED)
    if not sanitizer:
        raise StepError("compute-sanitizer not found (PATH, beside nvcc, /usr/local/cuda/bin)", SKIPPED)
    extra = shlex.split(cfg.environ.get("LOOM_BRINGUP_KERNEL_TEST_ARGS", ""))
    ctx.md("| tool | exit | errors reported | seconds |", "|---|---|---|---|")
    bad = []
    for i, tool in enumerate(SANITIZER_TOOLS):
        log = ctx.logs / f"sanitizer_{tool}.log"
        t0 = time.time()
        # The step's time shared among the tools still to run (racecheck is the slow one).
        rc = ctx.run(log, [sanitizer, "--tool", tool, "--error-exitcode", "99", binary, *extra],
                     cap=ctx.step_remaining() / (len(SANITIZER_TOOLS) - i))
        errors = sanitizer_errors(log)
        ctx.md(f"| {tool} | {rc}{timed_out(rc)} | {'-' if errors is None else errors} | {int(time.time() - t0)} |")
        if rc != 0 or errors:
            bad.append(f"{tool} exit {rc}" + (f", {errors} errors" if errors else ""))
    for tool in SANITIZER_TOOLS:
        log = ctx.logs / f"sanitizer_{tool}.log"
        if f"{tool} exit" in " ".join(bad) and log.is_file():
            ctx.md("", f"{tool}:")
            ctx.md_log_tail(log, 25)
    if bad:
        raise StepError("; ".join(bad))
    return "memcheck, racecheck, synccheck: no errors"
