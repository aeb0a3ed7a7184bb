"""The results file (docs/gpu_results.md, or a dry run's scratch copy) and summary.json.

Written whole after every step (and once before the first), through a temporary file and a
rename, so a call that is killed half-way still leaves a complete file: steps not reached yet
read "pending". With $OUT set, the file, the logs' last 400 lines, the runs' metrics.jsonl and
the JSON/CSV outputs are copied under it too (what the device tool brings back).
"""
from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Optional

PASS, FAIL, SKIPPED, NOT_RUN, DEFERRED, PENDING = "pass", "FAIL", "skipped", "not run", "deferred", "pending"
# Statuses that make the call exit 1. A skipped step cannot apply on this host (no
# compute-sanitizer, say); a deferred one was left out by the plan to fit the time budget.
FAILING = {FAIL, NOT_RUN, PENDING}
LOG_TAIL_LINES = 400


@dataclass
class StepResult:
    number: int
    name: str
    heading: str               # "N. Title"
    budget_s: int
    status: str = PENDING
    seconds: Optional[int] = None
    detail: str = ""


class Results:
    """Rows of the summary table and one markdown section per step, in step order."""

    def __init__(self, path: Path, work: Path, title_lines: List[str], command: str,
                 time_budget_s: int, out: Optional[Path] = None, clock=time.time):
        self.path, self.work, self.out = Path(path), Path(work), out
        self.title_lines, self.command, self.time_budget_s = title_lines, command, time_budget_s
        self.clock = clock
        self.start = clock()
        self.headline = ""
        self.plan_lines: List[str] = []
        self.rows: Dict[str, StepResult] = {}
        self.sections: Dict[str, List[str]] = {}

    def add_step(self, number: int, name: str, heading: str, budget_s: int, status: str = PENDING,
                 detail: str = "") -> None:
        self.rows[name] = StepResult(number, name, heading, budget_s, status, None, detail)

    def md(self, name: str, *lines: str) -> None:
        self.sections.setdefault(name, []).extend(lines)

    def finish(self, name: str, status: str, seconds: Optional[float], detail: str) -> None:
        row = self.rows[name]
        row.status, row.detail = status, detail
        row.seconds = None if seconds is None else int(round(seconds))

    def failed(self) -> bool:
        return any(r.status in FAILING for r in self.rows.values())

    def elapsed(self) -> int:
        return int(self.clock() - self.start)

    def markdown(self) -> str:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.clock()))
        out = list(self.title_lines) + ["", self.headline or "(environment not reported yet)", ""]
        out.append(f"Written by `{self.command}` on {when}, {self.elapsed()} s after its start "
                   f"(time budget {self.time_budget_s} s).")
        out += [""] + self.plan_lines + [""] if self.plan_lines else [""]
        out += ["| # | step | result | seconds | budget s | detail |", "|---|---|---|---|---|---|"]
        for r in sorted(self.rows.values(), key=lambda r: r.number):
            secs = "-" if r.seconds is None else str(r.seconds)
            detail = r.detail.replace("|", "\\|").replace("\n", " ")
            out.append(f"| {r.number} | {r.name} | {r.status} | {secs} | {r.budget_s} | {detail} |")
        out.append("")
        for r in sorted(self.rows.values(), key=lambda r: r.number):
            if r.name not in self.sections and r.status in (PENDING, DEFERRED):
                continue
            section = self.sections.get(r.name, [])
            out += [f"## {r.heading}", ""] + (section + [""] if section else [])
            if r.status != PENDING:
                secs = "" if r.seconds is None else f" ({r.seconds} s)"
                out += [f"**Result: {r.status}**{secs} — {r.detail}", ""]
            else:
                out += ["**Result: pending** (the call stopped before this step ended)", ""]
        return "\n".join(out).rstrip("\n") + "\n"

    def summary(self) -> dict:
        return {"command": self.command, "elapsed_s": self.elapsed(), "time_budget_s": self.time_budget_s,
                "failed": self.failed(), "steps": [asdict(r) for r in sorted(self.rows.values(), key=lambda r: r.number)]}

    def write(self) -> None:
        _atomic_write(self.path, self.markdown())
        self.work.mkdir(parents=True, exist_ok=True)
        _atomic_write(self.work / "summary.json", json.dumps(self.summary(), indent=1) + "\n")
        if self.out:
            self._copy_out()

    def _copy_out(self) -> None:
        dest = Path(self.out) / "bringup"
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.path, Path(self.out) / "gpu_results.md")
        for log in sorted((self.work / "logs").glob("*.log")):
            lines = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
            (dest / log.name).write_text("\n".join(lines) + "\n")
        for m in sorted((self.work / "runs").glob("*/metrics.jsonl")):
            shutil.copyfile(m, dest / f"{m.parent.name}.metrics.jsonl")
        for f in sorted(list(self.work.glob("*.json")) + list(self.work.glob("*.csv"))):
            shutil.copyfile(f, dest / f.name)


def _atomic_write(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
