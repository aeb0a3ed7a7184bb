"""Steps 1 and 2: the environment report (python with torch, the GPU, compilers, the carried
gpu_bundle/ and its libraries) and the build of `loom` for this GPU's architecture only."""
from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple

from .context import Context, StepError, timed_out

BUNDLE_ENV = Path("gpu_bundle/env.sh")
# The Debian 12 libraries need the host's glibc/libstdc++ to be at least as new.
BUNDLE_LIBS = ("libyaml-cpp.so.0.7", "libfmt.so.9", "libpcre2-8.so.0")
PROBE = Path(__file__).with_name("probe_torch.py")


def find_python(ctx: Context) -> Optional[str]:
    """LOOM_PYTHON, then (here) .venv/bin/python, then python3 and python: the first that
    imports torch."""
    cands = [ctx.cfg.environ.get("LOOM_PYTHON", "")]
    if ctx.cfg.dry:
        cands.append(".venv/bin/python")
    cands += ["python3", "python"]
    for c in filter(None, cands):
        path = ctx.which(c)
        if path and ctx.capture([path, "-c", "import torch; print('ok')"], timeout=120).strip().endswith("ok"):
            return path
    return None


def read_bundle_env(script: Path, base_env: Mapping[str, str]) -> Tuple[Dict[str, str], str, List[str]]:
    """Sources the bundle's env.sh in bash: (the environment it leaves, LOOM_BUNDLE_LIB,
    LOOM_BUNDLE_CMAKE_ARGS). Raises RuntimeError naming the script when it fails."""
    code = ('source "$1" > /dev/null || exit 3; '
            'printf "%s\\0" "${LOOM_BUNDLE_LIB:-}" "${#LOOM_BUNDLE_CMAKE_ARGS[@]}" "${LOOM_BUNDLE_CMAKE_ARGS[@]}"; env -0')
    r = subprocess.run(["bash", "-c", code, "_", str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       env=dict(base_env), timeout=30)
    if r.returncode != 0:
        raise RuntimeError(f"sourcing {script} failed (exit {r.returncode}): {r.stderr.decode(errors='replace')[-300:]}")
    parts = r.stdout.decode(errors="replace").split("\0")
    lib, n = parts[0], int(parts[1])
    args = parts[2:2 + n]
    env = dict(p.split("=", 1) for p in parts[2 + n:] if "=" in p)
    return env, lib, args


def _first_line(text: str, default: str = "none") -> str:
    lines = text.strip().splitlines()
    return lines[0] if lines else default


def _environment_lines(ctx: Context) -> List[str]:
    cap = ctx.capture
    lines = [f"date: {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}"]
    osname = ""
    try:
        osname = platform.freedesktop_os_release().get("PRETTY_NAME", "")
    except (OSError, AttributeError):
        pass
    mem = ""
    try:
        kb = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1))
        mem = f"{kb / 1048576:.0f} GiB RAM"
    except (OSError, AttributeError):
        pass
    u = os.uname()
    lines.append(f"host: {u.sysname} {u.release} {u.machine}; {osname}; {os.cpu_count()} cores; {mem}")
    lines.append(f"glibc: {cap(['getconf', 'GNU_LIBC_VERSION']).strip()}")
    lines.append(f"c++: {_first_line(cap(['c++', '--version']))}")
    stdcxx = cap(["c++", "-print-file-name=libstdc++.so.6"]).strip()
    if stdcxx and Path(stdcxx).is_file():
        vers = set(re.findall(rb"GLIBCXX_3\.4\.(\d+)", Path(stdcxx).read_bytes()))
        newest = max((int(v) for v in vers), default=None)
        lines.append(f"libstdc++: {stdcxx}, newest {'GLIBCXX_3.4.%d' % newest if newest is not None else '?'}")
    lines.append(f"cmake: {_first_line(cap(['cmake', '--version']))}; ninja: {_first_line(cap(['ninja', '--version']))}")
    nvcc = ctx.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    m = re.search(r"release [0-9.]*", cap([nvcc, "--version"]))
    lines.append(f"nvcc: {m.group(0) if m else 'none'}")
    lines.append(f"python: {ctx.py} ({_first_line(cap([ctx.py, '-c', 'import sys; print(sys.version.split()[0])']))})")
    lines += cap([ctx.py, str(PROBE)], timeout=120).rstrip("\n").splitlines()
    if ctx.which("nvidia-smi"):
        # Two queries: an unknown field (older drivers) fails a whole query.
        lines += cap(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,pci.bus_id", "--format=csv"]).splitlines()
        lines += cap(["nvidia-smi", "--query-gpu=compute_cap,clocks.max.sm,clocks.max.mem,power.limit", "--format=csv"]).splitlines()
        m = re.search(r"CUDA Version: [0-9.]*", cap(["nvidia-smi"]))
        if m:
            lines.append(m.group(0))
    else:
        lines.append("nvidia-smi: absent")
    return lines


def headline(lines: List[str], driver: str) -> str:
    """The results' first line: GPU, driver, torch, nvcc and compiler, from the env log's lines."""
    val = lambda key: next((l[len(key):] for l in lines if l.startswith(key)), "")
    arch, name, mem = val("ARCH="), val("GPU_NAME="), val("GPU_MEM_GIB=")
    cuda = val("CUDA Version: ")
    nvcc = val("nvcc: ").replace("release ", "") or "none"
    return (f"GPU: {name or 'none'}{f' (sm_{arch})' if arch else ''}{f', {mem} GiB' if mem else ''}; "
            f"driver {driver or 'n/a'}{f', driver CUDA {cuda}' if cuda else ''}; {val('torch: ') and 'torch: ' + val('torch: ')}; "
            f"nvcc {nvcc}; {val('c++: ')}.")


def step_env(ctx: Context) -> str:
    log = ctx.logs / "env.log"
    py = find_python(ctx)
    if not py:
        raise StepError("no python with torch (set LOOM_PYTHON)")
    ctx.py = py
    lines = _environment_lines(ctx)
    log.write_text("\n".join(lines) + "\n")
    val = lambda key: next((l[len(key):] for l in lines if l.startswith(key)), "")
    ctx.arch, ctx.gpu_name, ctx.gpu_mem_gib = val("ARCH="), val("GPU_NAME="), val("GPU_MEM_GIB=")
    driver = _first_line(ctx.capture(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]), "") \
        if ctx.which("nvidia-smi") else ""
    ctx.results.headline = headline(lines, driver)
    ctx.md("```", *(l for l in lines if not re.match(r"^(ARCH|GPU_NAME|GPU_MEM_GIB)=", l)), "```")
    if not BUNDLE_ENV.is_file():
        ctx.md("gpu_bundle/ is missing: run tools/gpu_bundle.sh on the development machine and carry [\"gpu_bundle\"].")
        raise StepError("no gpu_bundle/")
    try:
        env, ctx.bundle_lib, ctx.bundle_cmake_args = read_bundle_env(BUNDLE_ENV, ctx.base_env)
    except (RuntimeError, ValueError, IndexError, subprocess.SubprocessError) as e:
        ctx.md(f"{BUNDLE_ENV}: {e}")
        raise StepError(f"{BUNDLE_ENV} could not be sourced") from None
    ctx.base_env = env     # every later command sees the bundle's compiler, linker and loader paths
    missing = []
    for lib in BUNDLE_LIBS:
        out = ctx.capture(["ldd", f"{ctx.bundle_lib}/{lib}"])
        bad = [l.strip() for l in out.splitlines() if "not found" in l]
        if bad or not out:
            missing.append(lib)
            ctx.md(f"`ldd {lib}`: {' '.join(bad[:3]) or out.strip()[:200] or 'no output'}")
    if missing:
        raise StepError(f"bundled libraries do not load: {' '.join(missing)}")
    if not ctx.cfg.dry and not ctx.arch:
        raise StepError("torch sees no GPU")
    return ctx.gpu_name or "no GPU (dry run)"


def _sh(*cmds: List[str]) -> List[str]:
    """One bash command line running cmds one after another while they succeed."""
    import shlex
    return ["bash", "-c", " && ".join(shlex.join(str(c) for c in cmd) for cmd in cmds)]


def step_build(ctx: Context) -> str:
    cfg = ctx.cfg
    gen = "Ninja" if ctx.which("ninja") else "Unix Makefiles"
    check_log, log = ctx.logs / "bundle_check.log", ctx.logs / "build.log"
    # Two seconds that tell a library problem from a Loom problem.
    shutil.rmtree("build-bundle-check", ignore_errors=True)
    rc = ctx.run(check_log, _sh(["cmake", "-S", "tools/gpu_bundle_check", "-B", "build-bundle-check", "-G", gen,
                                 *ctx.bundle_cmake_args],
                                ["cmake", "--build", "build-bundle-check"], ["build-bundle-check/bundle_check"]), cap=60)
    said = [l for l in check_log.read_text(errors="replace").splitlines() if "bundle check:" in l]
    ctx.md(f"Bundle check (tools/gpu_bundle_check, the same find_package calls): {said[-1] if said else ''}")
    if rc != 0:
        ctx.md_log_tail(check_log, 30)
        raise StepError(f"the bundle check failed (exit {rc}){timed_out(rc)}")
    if cfg.dry:
        ctx.md("", f"Dry run: reusing the development build `{cfg.loom}` (not rebuilt).")
        if not (os.access(cfg.loom, os.X_OK) and cfg.ops_lib.is_file()):
            raise StepError(f"no {cfg.loom} / {cfg.ops_lib}: build it first (tools/build.sh loom)")
        return f"reused {cfg.loom}"
    nvcc = ctx.which("nvcc")
    t0 = time.time()
    rc = ctx.run(log, _sh(["cmake", "-S", ".", "-B", cfg.build, "-G", gen, "-DCMAKE_BUILD_TYPE=Release",
                           "-DLOOM_BUILD_TESTS=OFF", "-DLOOM_WITH_CUDA=ON", f"-DLOOM_CUDA_ARCHS={ctx.arch}",
                           f"-DLOOM_PYTHON={ctx.py}", *ctx.bundle_cmake_args,
                           *([f"-DCMAKE_CUDA_COMPILER={nvcc}"] if nvcc else [])],
                          ["cmake", "--build", cfg.build, "-j", str(cfg.jobs), "--target", "loom"]))
    secs = int(time.time() - t0)
    ctx.md(f"Configure + build of `loom` (Release, tests off, CUDA arch {ctx.arch} only, -j {cfg.jobs}): **{secs} s**.", "")
    found = [l for l in log.read_text(errors="replace").splitlines()
             if re.search(r"Loom: torch|Found (CUDA|CUDAToolkit)|ccache", l)][:5]
    ctx.md(*("    " + l for l in found))
    if rc != 0:
        ctx.md_log_tail(log, 40)
        raise StepError(f"build failed (exit {rc}{', timed out' if rc in (124, 137) else ''})")
    cache = (cfg.build / "CMakeCache.txt").read_text(errors="replace")
    if not re.search(r"^LOOM_WITH_CUDA:BOOL=ON", cache, re.M):
        ctx.md("The build has no CUDA kernels (nvcc was not found, LOOM_WITH_CUDA is off).")
        raise StepError("built without CUDA")
    m = re.search(r"^LOOM_NCCL_INCLUDE:PATH=(.*)$", cache, re.M)
    ctx.nccl_built = bool(m and "NOTFOUND" not in m.group(1))
    if not ctx.nccl_built:
        # One-rank runs and Gloo-staged layouts work without NCCL: the later steps still run.
        ctx.md("**Warning:** nccl.h was not found: this build has no NCCL; the one-GPU runs use Loom's "
               "single-process groups and no NCCL check is made.")
    unresolved = [l for l in ctx.capture(["ldd", cfg.loom]).splitlines() if "not found" in l]
    if unresolved:
        ctx.md("```", *unresolved[:10], "```")
        raise StepError("loom has unresolved libraries")
    return f"{secs} s"


def inspect_build(ctx: Context) -> None:
    """What an existing build says about NCCL (a later call that does not rebuild): a build
    without nccl.h runs one-rank jobs on Loom's single-process groups."""
    cache = ctx.cfg.build / "CMakeCache.txt"
    if ctx.cfg.dry or not cache.is_file():
        return
    m = re.search(r"^LOOM_NCCL_INCLUDE:PATH=(.*)$", cache.read_text(errors="replace"), re.M)
    ctx.nccl_built = bool(m and "NOTFOUND" not in m.group(1))
