"""What every step shares: the call's settings (Config), its clock and deadlines, commands run
under a timeout with their output in a log, and the markdown of the current step (Context).

Paths are relative to the repository root (the driver's working directory), as the results
quote them.
"""
from __future__ import annotations

import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

from .results import Results

DATA = "gpu_bundle/data/tinyshakespeare_text_document"
# Seconds kept back at the end of a call to write the results (and for a TERM's 10-s grace).
RESERVE_S = 15
# The device tool's limit on one command is 600 s; the default leaves room for its transfers.
GPU_TIME_BUDGET_S = 570
KILL_GRACE_S = 10          # TERM, then KILL this much later (as `timeout --kill-after=10`)
MIN_START_S = 5            # a command with less time than this is not started


class ConfigError(ValueError):
    """A bad environment variable (the driver exits 2 and runs nothing)."""


def _int_env(env: Mapping[str, str], key: str, default: int) -> int:
    v = env.get(key, "")
    if v == "":
        return default
    try:
        n = int(v)
    except ValueError:
        raise ConfigError(f"{key}: expected an integer, got '{v}'") from None
    if n <= 0:
        raise ConfigError(f"{key}: expected a positive integer, got {n}")
    return n


@dataclass
class Config:
    mode: str                  # "gpu" (the GPU host), "dry" (here, on CPU), "reference" (for gpu_bundle.sh)
    work: Path                 # scratch folder of the call: logs/, runs/, JSON and CSV outputs
    results: Path              # the markdown results file
    build: Path                # the build folder whose bin/loom and lib/libloom_ops.so are used
    tiny_steps: int
    tput_steps: int
    tput_skip: int             # the first steps of a throughput run, not timed
    mbs: List[int]             # micro-batch candidates of the throughput step, ascending
    time_budget_s: int
    jobs: int
    out: Optional[Path]
    environ: Dict[str, str] = field(default_factory=dict)
    # Step budgets are the GPU host's; a dry run's CPU runs take longer (x3 by default).
    budget_scale: int = 1

    @property
    def dry(self) -> bool:
        return self.mode != "gpu"

    @property
    def loom(self) -> Path:
        return self.build / "bin" / "loom"

    @property
    def ops_lib(self) -> Path:
        return self.build / "lib" / "libloom_ops.so"


def make_config(mode: str, environ: Mapping[str, str], time_budget_s: Optional[int] = None) -> Config:
    """The settings of a call from its mode and environment (LOOM_BRINGUP_*, LOOM_BIN, OUT)."""
    env = dict(environ)
    if time_budget_s is not None and time_budget_s <= 0:
        raise ConfigError(f"--time-budget: expected a positive number of seconds, got {time_budget_s}")
    out = Path(env["OUT"]) if env.get("OUT") else None
    jobs = _int_env(env, "LOOM_BRINGUP_JOBS", os.cpu_count() or 1)
    try:
        mbs_text = env.get("LOOM_BRINGUP_MBS", "")
        mbs = sorted(int(x) for x in mbs_text.split()) if mbs_text.strip() else None
    except ValueError:
        raise ConfigError(f"LOOM_BRINGUP_MBS: expected integers separated by spaces, got '{mbs_text}'") from None
    if mbs is not None and (not mbs or mbs[0] <= 0):
        raise ConfigError(f"LOOM_BRINGUP_MBS: expected positive integers, got '{mbs_text}'")
    if mode == "reference":
        build = Path(os.path.dirname(os.path.dirname(env["LOOM_BIN"]))) if env.get("LOOM_BIN") else Path("build")
        work = Path("runs/bringup-reference")
        return Config(mode, work, work / "reference.md", build, _int_env(env, "LOOM_BRINGUP_TINY_STEPS", 30),
                      0, 0, [], time_budget_s or 600, jobs, None, env)
    if mode == "dry":
        from . import registry
        work = Path("runs/bringup-dryrun")
        scale = _int_env(env, "LOOM_BRINGUP_DRY_SCALE", 3)
        # A dry run is not device time: by default its budget plans every step.
        default_budget = _int_env(env, "LOOM_BRINGUP_DEADLINE_S",
                                  sum(s.budget_s * scale for s in registry.STEPS) + RESERVE_S)
        return Config(mode, work, work / "gpu_results.md",     # never docs/ for a dry run
                      Path(env.get("LOOM_BRINGUP_BUILD") or "build"),   # the development build, not rebuilt
                      _int_env(env, "LOOM_BRINGUP_TINY_STEPS", 5), _int_env(env, "LOOM_BRINGUP_TPUT_STEPS", 4), 2,
                      mbs or [4, 8, 16, 32, 64], time_budget_s or default_budget, jobs, out, env, scale)
    if mode != "gpu":
        raise ConfigError(f"unknown mode '{mode}'")
    return Config(mode, Path("runs/bringup"), Path("docs/gpu_results.md"), Path("build-gpu"),
                  _int_env(env, "LOOM_BRINGUP_TINY_STEPS", 30), _int_env(env, "LOOM_BRINGUP_TPUT_STEPS", 10), 3,
                  mbs or [1, 2, 4, 8, 16, 32, 64, 128],
                  time_budget_s or _int_env(env, "LOOM_BRINGUP_DEADLINE_S", GPU_TIME_BUDGET_S), jobs, out, env)


class Interrupted(Exception):
    """TERM or INT arrived (the driver writes what it has and exits 1)."""


class StepError(Exception):
    """A step's failure with its one-line detail (the step's section says more)."""

    def __init__(self, detail: str, status: str = "FAIL"):
        super().__init__(detail)
        self.detail, self.status = detail, status


class Context:
    """The state of one call, shared by the steps (they run one after another)."""

    def __init__(self, cfg: Config, results: Results, clock=time.time):
        self.cfg, self.results, self.clock = cfg, results, clock
        self.start = results.start
        self.deadline = self.start + cfg.time_budget_s - RESERVE_S
        self.logs = cfg.work / "logs"
        self.children: set = set()
        self.base_env: Dict[str, str] = dict(cfg.environ)
        self.current = ""
        self.step_deadline = self.deadline
        # Filled in by the steps.
        self.py = ""
        self.arch = ""
        self.gpu_name = ""
        self.gpu_mem_gib = ""
        self.bundle_lib = ""
        self.bundle_cmake_args: List[str] = []
        self.nccl_built = True
        self.accel, self.accel_note, self.device_env = "gpu", "GPU", {}
        self.winner: Optional[int] = None
        self.loom_tput: dict = {}
        self.dry_mem_gib = 1
        self.predictions: Dict[int, dict] = {}
        self.done: List[str] = []

    # ------------------------------------------------------------------ clock
    def elapsed(self) -> int:
        return int(self.clock() - self.start)

    def remaining(self) -> float:
        """Seconds before the call's deadline (the results' reserve already taken off)."""
        return self.deadline - self.clock()

    def step_remaining(self) -> float:
        return min(self.step_deadline, self.deadline) - self.clock()

    def say(self, text: str) -> None:
        print(f"[gpu_bringup] {self.elapsed()}s: {text}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------------ markdown of the current step
    def md(self, *lines: str) -> None:
        self.results.md(self.current, *lines)

    def md_log_tail(self, log: Path, n: int = 25) -> None:
        try:
            lines = Path(log).read_text(errors="replace").splitlines()[-n:]
        except OSError as e:
            lines = [f"(no log: {e})"]
        self.md("```", *(l[:300] for l in lines), "```")

    # ------------------------------------------------------------------ commands
    def env_with(self, extra: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
        env = dict(self.base_env)
        env.update(extra or {})
        return env

    def run(self, log: Path, cmd: Sequence[str], cap: Optional[float] = None,
            env: Optional[Mapping[str, str]] = None) -> int:
        """Runs cmd with its output in log, under min(cap, the step's time left) seconds: TERM to
        its process group then, KILL 10 s later. Returns its exit status, 124 when it timed out
        (137 when it needed the KILL), 124 without starting when under 5 s were left, 127 when
        the program does not exist."""
        secs = int(min(cap if cap is not None else math.inf, self.step_remaining()))
        log = Path(log)
        log.parent.mkdir(parents=True, exist_ok=True)
        if secs < MIN_START_S:
            log.write_text("not started: out of time\n")
            return 124
        with open(log, "w") as f:
            f.write(f"+ {shlex.join(str(c) for c in cmd)} (timeout {secs}s)\n")
            f.flush()
            try:
                p = subprocess.Popen([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=self.env_with(env), start_new_session=True)
            except OSError as e:
                f.write(f"could not start: {e}\n")
                return 127
            self.children.add(p)
            try:
                return p.wait(timeout=secs)
            except subprocess.TimeoutExpired:
                f.write(f"\ntimed out after {secs} s\n")
                return self._stop(p)
            except BaseException:   # TERM/INT of the driver: the command's process group goes too
                self._stop(p)
                raise
            finally:
                self.children.discard(p)

    def capture(self, cmd: Sequence[str], timeout: float = 30, env: Optional[Mapping[str, str]] = None) -> str:
        """stdout (and stderr) of a short query; "" when it fails to start or times out (within
        `timeout` seconds and the call's deadline)."""
        try:
            r = subprocess.run([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, text=True, errors="replace",
                               timeout=max(1.0, min(timeout, self.remaining())),
                               env=self.env_with(env))
            return r.stdout
        except (OSError, subprocess.SubprocessError):
            return ""

    def _stop(self, p: subprocess.Popen) -> int:
        for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, None)):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout=wait)
                return 124 if sig == signal.SIGTERM else 137
            except subprocess.TimeoutExpired:
                continue
        return 137

    def stop_children(self) -> None:
        for p in list(self.children):
            if p.poll() is None:
                self._stop(p)

    @staticmethod
    def which(name: str) -> Optional[str]:
        return shutil.which(name)


def timed_out(rc: int) -> str:
    return " (timed out)" if rc in (124, 137) else ""


def jget(d: Optional[dict], key: str, decimals: int = 1) -> str:
    """One value of a JSON object for the tables: "-" when absent, strings and booleans as they
    are, numbers with `decimals` places (three below 1, so small dry-run figures do not print as
    0.0; decimals 0 prints integers)."""
    v = (d or {}).get(key)
    if v is None:
        return "-"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    return f"{v:.{3 if decimals and abs(v) < 1 else decimals}f}"


def device_line(log: Path) -> str:
    """What Loom said about its device ("[loom] device: ..."), without the prefix."""
    try:
        for line in Path(log).read_text(errors="replace").splitlines():
            if "[loom] device:" in line:
                return line.rsplit("] ", 1)[-1]
    except OSError:
        pass
    return ""
