"""The GPU bring-up driver's own logic (tools/bringup/): step selection and numbering, the
time-budget plan and the admission of deferred steps, the results file written after every
step, failures and interruptions that still leave a complete file, and the helpers the steps
parse their tools' output with. No `loom`, GPU or bundle needed; runs in seconds."""
import dataclasses
import json
import os
import subprocess
import sys
import time

import pytest

from test_data_helpers import ROOT

sys.path.insert(0, str(ROOT / "tools"))
from bringup import context, driver, metrics, ops, registry, throughput  # noqa: E402
from bringup.context import StepError  # noqa: E402
from bringup.env_build import read_bundle_env  # noqa: E402
from bringup.results import DEFERRED, FAIL, NOT_RUN, PASS, PENDING, SKIPPED, Results  # noqa: E402

NAMES = ["env", "build", "tiny", "throughput", "calibrate", "mcore", "layout", "ops", "sanitizer", "overlap",
         "memory"]
# Budgets pinned for the plan tests (the registry's defaults may be retuned after a GPU call).
PINNED = {"env": 30, "build": 420, "tiny": 100, "throughput": 240, "calibrate": 150, "mcore": 150,
          "layout": 120, "ops": 120, "sanitizer": 150, "overlap": 240, "memory": 240}


# ---------------------------------------------------------------- registry: numbering, selection
def test_one_numbering_in_run_order():
    assert [s.name for s in registry.STEPS] == NAMES
    assert [registry.number(n) for n in NAMES] == list(range(1, 12))
    assert registry.heading(registry.BY_NAME["throughput"]) == "4. GPT-3 126m throughput on one device"
    # --help lists every step with that number and its budget.
    text = driver.steps_help()
    for s in registry.STEPS:
        assert f"{registry.number(s.name):2d}. {s.name:<10} {s.budget_s:4d} s" in text
    assert all(s.budget_s > 0 and s.writes and s.run for s in registry.STEPS)


def test_the_script_has_no_other_numbering():
    # The step numbers printed anywhere come from the registry: no hand-written "N. " headings.
    for path in (ROOT / "tools" / "bringup").glob("*.py"):
        for line in path.read_text().splitlines():
            assert "md(\"## " not in line and "begin_step" not in line, f"{path.name}: {line}"


def test_select_steps_and_skip():
    names = lambda steps: [s.name for s in steps]
    assert names(registry.select()) == NAMES
    # env always runs and the order is the registry's, whatever order --steps names them in.
    assert names(registry.select("ops,tiny")) == ["env", "tiny", "ops"]
    assert names(registry.select(None, "build,overlap")) == [n for n in NAMES if n not in ("build", "overlap")]
    assert names(registry.select("tiny,ops", "ops")) == ["env", "tiny"]
    assert names(registry.select(" tiny , ,layout")) == ["env", "tiny", "layout"]
    with pytest.raises(registry.SelectionError, match=r"--steps: unknown step 'tput' \(steps: env, build"):
        registry.select("tiny,tput")
    with pytest.raises(registry.SelectionError, match="--skip: unknown step 'x'"):
        registry.select(None, "x")
    with pytest.raises(registry.SelectionError, match="env cannot be skipped"):
        registry.select(None, "env")


def test_budget_overrides():
    assert registry.parse_budgets(["tiny=50", "build=300"]) == {"tiny": 50, "build": 300}
    for bad, msg in (("tiny", "expected STEP=SECONDS"), ("nope=5", "expected STEP=SECONDS"),
                     ("tiny=5s", "seconds must be an integer, got '5s'"), ("tiny=0", "must be positive")):
        with pytest.raises(registry.SelectionError, match=msg):
            registry.parse_budgets([bad])
    # The command line wins over LOOM_BRINGUP_BUDGET_<STEP>.
    env = {"LOOM_BRINGUP_BUDGET_TINY": "70", "LOOM_BRINGUP_BUDGET_OPS": "90"}
    assert driver.budget_overrides(env, ["tiny=40"]) == {"tiny": 40, "ops": 90}


# ---------------------------------------------------------------- registry: the plan
def planned(p):
    return [s.name for s in p.planned], [s.name for s in p.deferred]


def test_default_gpu_plan_fits_the_device_command_limit():
    p = registry.plan(registry.select(), registry.GPU_TIME_BUDGET_S)
    assert p.planned_s() <= registry.GPU_TIME_BUDGET_S - registry.RESERVE_S
    assert registry.GPU_TIME_BUDGET_S + registry.RESERVE_S <= 600
    # A first call on a fresh host: the environment, the build and the first GPU figures.
    assert planned(p)[0][:3] == ["env", "build", "tiny"]
    assert planned(p)[0] + planned(p)[1] == NAMES
    # A second call without the build fits more.
    p = registry.plan(registry.select(None, "build"), registry.GPU_TIME_BUDGET_S, PINNED)
    assert planned(p)[0] == ["env", "tiny", "throughput", "calibrate"]
    assert p.planned_s() == 30 + 100 + 240 + 150


def test_plan_drops_optional_steps_to_fit_and_keeps_order():
    sel = registry.select("tiny,throughput,layout,ops")
    # 555 s of room: env 30 + tiny 100 + throughput 240 + layout 120 = 490; ops (120) does not fit.
    assert planned(registry.plan(sel, 570, PINNED)) == (["env", "tiny", "throughput", "layout"], ["ops"])
    # A later, smaller step still fits after a larger one was deferred.
    assert planned(registry.plan(sel, 300, PINNED)) == (["env", "tiny", "layout"], ["throughput", "ops"])
    # Budgets from --budget count.
    assert planned(registry.plan(sel, 300, {**PINNED, "throughput": 100})) == \
        (["env", "tiny", "throughput"], ["layout", "ops"])
    # Without overrides the registry's own budgets are used.
    assert registry.plan(sel, 570).budgets == {s.name: s.budget_s for s in sel}


def test_plan_defers_a_step_whose_input_was_deferred():
    # calibrate (150) would fit, but it compares with step 4's run, which did not.
    p = registry.plan(registry.select("throughput,calibrate"), 250, PINNED)
    assert planned(p) == (["env"], ["throughput", "calibrate"])
    # Not selected at all: calibrate reads an earlier call's measurement, so it is planned.
    assert planned(registry.plan(registry.select("calibrate"), 250, PINNED)) == (["env", "calibrate"], [])


def test_plan_refuses_when_required_steps_do_not_fit():
    with pytest.raises(registry.SelectionError, match=r"env 30 s \+ build 420 s = 450 s, more than the time budget 400 s"):
        registry.plan(registry.select(), 400, PINNED)
    # Without the build it starts.
    assert planned(registry.plan(registry.select("tiny"), 400, PINNED)) == (["env", "tiny"], [])


def test_admit_deferred_steps_only_with_room_for_the_planned_ones():
    p = registry.plan(registry.select("tiny,throughput,layout,ops"), 300, PINNED)   # planned env tiny layout
    st = registry.BY_NAME
    assert registry.admit(p, st["tiny"], 0, [])                  # planned: always
    # throughput (240) with layout (120, planned, later) still to run: needs 360 s.
    assert not registry.admit(p, st["throughput"], 359, ["env", "tiny"])
    assert registry.admit(p, st["throughput"], 360, ["env", "tiny"])
    # ops comes after every planned step: its own budget is enough.
    assert registry.admit(p, st["ops"], 120, ["env", "tiny", "layout"])
    assert not registry.admit(p, st["ops"], 119, ["env", "tiny", "layout"])
    # A deferred step waits for a selected step it needs.
    p = registry.plan(registry.select("throughput,calibrate"), 250, PINNED)
    assert not registry.admit(p, st["calibrate"], 10_000, ["env"])
    assert registry.admit(p, st["calibrate"], 10_000, ["env", "throughput"])


# ---------------------------------------------------------------- configuration
def test_config_per_mode_and_bad_environment():
    gpu = context.make_config("gpu", {})
    assert (str(gpu.results), str(gpu.build), gpu.time_budget_s, gpu.tiny_steps) == \
        ("docs/gpu_results.md", "build-gpu", 570, 30)
    assert gpu.mbs == [1, 2, 4, 8, 16, 32, 64, 128]
    dry = context.make_config("dry", {"LOOM_BRINGUP_BUILD": "b2", "LOOM_BRINGUP_MBS": "8 4", "OUT": "/o"})
    assert (str(dry.results), str(dry.build), dry.mbs, str(dry.out)) == \
        ("runs/bringup-dryrun/gpu_results.md", "b2", [4, 8], "/o")
    assert "docs" not in str(dry.results)
    # A dry run's budgets are the GPU host's x3 (CPU runs), and its default plans every step.
    assert dry.budget_scale == 3 and gpu.budget_scale == 1
    p = registry.plan(registry.select(), dry.time_budget_s, {"ops": 7}, dry.budget_scale)
    assert planned(p) == (NAMES, [])
    assert p.budgets["tiny"] == 3 * registry.BY_NAME["tiny"].budget_s and p.budgets["ops"] == 7
    ref = context.make_config("reference", {"LOOM_BIN": "/x/bld/bin/loom"})
    assert str(ref.build) == "/x/bld" and ref.tiny_steps == 30
    assert context.make_config("gpu", {"LOOM_BRINGUP_DEADLINE_S": "300"}).time_budget_s == 300
    assert context.make_config("gpu", {"LOOM_BRINGUP_DEADLINE_S": "300"}, 200).time_budget_s == 200
    with pytest.raises(context.ConfigError, match="LOOM_BRINGUP_TINY_STEPS: expected an integer, got 'x'"):
        context.make_config("gpu", {"LOOM_BRINGUP_TINY_STEPS": "x"})
    with pytest.raises(context.ConfigError, match="LOOM_BRINGUP_MBS: expected integers"):
        context.make_config("gpu", {"LOOM_BRINGUP_MBS": "1 two"})
    with pytest.raises(context.ConfigError, match="--time-budget: expected a positive number of seconds, got 0"):
        context.make_config("gpu", {}, 0)
    with pytest.raises(context.ConfigError, match="LOOM_BRINGUP_MBS: expected positive"):
        context.make_config("gpu", {"LOOM_BRINGUP_MBS": "0 4"})


# ---------------------------------------------------------------- the results file
def test_results_file_pending_then_final(tmp_path):
    now = [1000.0]
    res = Results(tmp_path / "r.md", tmp_path / "w", ["# Title"], "tools/gpu_bringup.sh", 570,
                  out=tmp_path / "out", clock=lambda: now[0])
    res.add_step(1, "env", "1. Environment", 30)
    res.add_step(3, "tiny", "3. Tiny", 100)
    res.add_step(4, "throughput", "4. Throughput", 240, DEFERRED, "did not fit")
    (tmp_path / "w" / "logs").mkdir(parents=True)
    (tmp_path / "w" / "logs" / "env.log").write_text("".join(f"line {i}\n" for i in range(500)))
    res.write()
    text = (tmp_path / "r.md").read_text()
    assert "| 1 | env | pending | - | 30 |  |" in text
    assert "| 4 | throughput | deferred | - | 240 | did not fit |" in text
    assert "## 4. Throughput" not in text          # a deferred step without a section has none
    now[0] += 12.4
    res.md("env", "some | facts")
    res.finish("env", PASS, 12.4, "H200 | sm_90")
    res.write()
    text = (tmp_path / "r.md").read_text()
    assert "| 1 | env | pass | 12 | 30 | H200 \\| sm_90 |" in text     # a | in a detail does not split the row
    assert "## 1. Environment\n\nsome | facts\n\n**Result: pass** (12 s) — H200 | sm_90" in text
    assert "## 3. Tiny" not in text                 # not started: the table says pending
    res.md("tiny", "- `tiny_gpu_fp32` (gpu, precision 32): exit 0")
    res.write()
    assert ("## 3. Tiny\n\n- `tiny_gpu_fp32` (gpu, precision 32): exit 0\n\n"
            "**Result: pending** (the call stopped before this step ended)") in (tmp_path / "r.md").read_text()
    text = (tmp_path / "r.md").read_text()
    assert "12 s after its start (time budget 570 s)" in text
    assert res.failed()                              # tiny is still pending
    summary = json.loads((tmp_path / "w" / "summary.json").read_text())
    assert [(s["name"], s["status"], s["seconds"]) for s in summary["steps"]] == \
        [("env", "pass", 12), ("tiny", "pending", None), ("throughput", "deferred", None)]
    # $OUT: the same file, the logs' last 400 lines.
    assert (tmp_path / "out" / "gpu_results.md").read_text() == text
    tail = (tmp_path / "out" / "bringup" / "env.log").read_text().splitlines()
    assert len(tail) == 400 and tail[-1] == "line 499"
    res.finish("tiny", SKIPPED, 1, "not here")
    assert not res.failed()                          # skipped and deferred are not failures
    res.finish("tiny", NOT_RUN, None, "out of time")
    assert res.failed()
    assert not list(tmp_path.glob(".r.md.*"))        # no temporary file left behind


# ---------------------------------------------------------------- the driver's loop
class FakeClock:
    def __init__(self):
        self.t = 10_000.0

    def __call__(self):
        return self.t


def make_call(tmp_path, steps_arg=None, budget=570, behaviour=None, overrides=None, mode="gpu"):
    """A Call whose steps only advance a fake clock (behaviour: name -> (seconds, action))."""
    clock = FakeClock()
    cfg = context.make_config(mode, {}, budget)
    cfg = dataclasses.replace(cfg, work=tmp_path / "work", results=tmp_path / "results.md", build=tmp_path / "bld")
    (tmp_path / "bld" / "bin").mkdir(parents=True)
    loom = tmp_path / "bld" / "bin" / "loom"
    loom.write_text("#!/bin/sh\n")
    loom.chmod(0o755)
    ran, seen = [], {}

    def fake(step):
        def run(ctx):
            secs, action = (behaviour or {}).get(step.name, (1, None))
            ran.append(step.name)
            seen[step.name] = cfg.results.read_text()     # what the file said when the step began
            ctx.md(f"{step.name} ran")
            clock.t += secs
            if action:
                return action(ctx)
            return f"{step.name} ok"
        return run

    sel = [dataclasses.replace(s, run=fake(s)) for s in registry.select(steps_arg)]
    p = registry.plan(sel, budget, {**PINNED, **(overrides or {})})
    call = driver.Call(cfg, p, "tools/gpu_bringup.sh test", clock=clock)
    return call, ran, seen, clock


def rows(tmp_path):
    return {s["name"]: (s["status"], s["seconds"]) for s in
            json.loads((tmp_path / "work" / "summary.json").read_text())["steps"]}


def test_call_writes_after_every_step_and_uses_left_over_time(tmp_path, monkeypatch):
    monkeypatch.setattr(driver.Call, "_build_unusable", lambda self: None)
    # The build takes 200 of its 420 s: the left-over time runs deferred steps that fit.
    call, ran, seen, clock = make_call(tmp_path, behaviour={"build": (200, None), "tiny": (60, None),
                                                            "throughput": (150, None), "layout": (50, None)})
    assert call.run() == 0
    # 555 s of room. After env 1, build 200, tiny 60 s: 294 s left, throughput (240) fits; after it
    # 144 s: calibrate and mcore (150) do not, layout (120) does; then 94 s: nothing else fits.
    assert ran == ["env", "build", "tiny", "throughput", "layout"]
    r = rows(tmp_path)
    assert r["tiny"] == (PASS, 60) and r["throughput"] == (PASS, 150) and r["layout"] == (PASS, 50)
    assert [n for n, (status, _) in r.items() if status == DEFERRED] == ["calibrate", "mcore", "ops", "sanitizer", "overlap",
                                                                     "memory"]
    # Partial results: each step saw the previous one's result in the file.
    assert "| 1 | env | pass | 1 |" in seen["build"] and "| 2 | build | pending |" in seen["build"]
    assert "| 2 | build | pass | 200 |" in seen["tiny"]
    text = (tmp_path / "results.md").read_text()
    assert "Not reached in this call: `tools/gpu_bringup.sh --steps calibrate,mcore,ops,sanitizer,overlap,memory` runs them." in text
    assert "| 5 | calibrate | deferred | - | 150 | did not fit the time budget: a later call, " in text
    assert "## 3. Tiny recipe on one device: GPU fp32 and bf16 against CPU fp32\n\ntiny ran" in text


def test_a_failing_step_and_a_driver_bug_do_not_stop_the_others(tmp_path, monkeypatch):
    monkeypatch.setattr(driver.Call, "_build_unusable", lambda self: None)

    def fails(ctx):
        raise StepError("see the table")

    def bug(ctx):
        return {}["missing"]

    def skipped(ctx):
        raise StepError("no kernel test binary", SKIPPED)

    call, ran, _, _ = make_call(tmp_path, "tiny,layout,ops,sanitizer", budget=2000,
                                behaviour={"tiny": (5, fails), "layout": (5, bug), "sanitizer": (1, skipped)})
    assert call.run() == 1
    assert ran == ["env", "tiny", "layout", "ops", "sanitizer"]
    r = rows(tmp_path)
    assert r["tiny"] == (FAIL, 5) and r["layout"] == (FAIL, 5) and r["ops"][0] == PASS and r["sanitizer"][0] == SKIPPED
    text = (tmp_path / "results.md").read_text()
    assert "| 7 | layout | FAIL | 5 | 120 | driver error: KeyError: 'missing' |" in text
    assert "Driver error (a bug in tools/bringup/):" in text and "KeyError" in text


def test_a_skipped_step_alone_does_not_fail_the_call(tmp_path, monkeypatch):
    monkeypatch.setattr(driver.Call, "_build_unusable", lambda self: None)
    call, _, _, _ = make_call(tmp_path, "sanitizer", budget=1000,
                              behaviour={"sanitizer": (1, lambda ctx: (_ for _ in ()).throw(StepError("absent", SKIPPED)))})
    assert call.run() == 0


def test_failed_env_or_build_marks_the_rest_not_run(tmp_path):
    def fails(ctx):
        raise StepError("build failed (exit 1)")

    call, ran, _, _ = make_call(tmp_path, behaviour={"build": (30, fails)})
    assert call.run() == 1
    assert ran == ["env", "build"]
    r = rows(tmp_path)
    assert r["tiny"] == (NOT_RUN, None)
    assert r["throughput"][0] == DEFERRED      # deferred steps stay deferred: the plan left them out
    assert "| 3 | tiny | not run | - | 100 | step 2 (build) failed |" in (tmp_path / "results.md").read_text()


def test_no_build_selected_and_no_loom(tmp_path):
    call, ran, _, _ = make_call(tmp_path, "tiny", budget=1000)
    (tmp_path / "bld" / "bin" / "loom").unlink()
    assert call.run() == 1
    assert ran == ["env"]
    assert rows(tmp_path)["tiny"] == (NOT_RUN, None)
    assert "no usable" in (tmp_path / "results.md").read_text() and "add build to --steps" in (tmp_path / "results.md").read_text()


def test_out_of_time_planned_step_is_not_run(tmp_path, monkeypatch):
    monkeypatch.setattr(driver.Call, "_build_unusable", lambda self: None)
    # The build overran its budget (it cannot, under its timeout, but the driver must not trust that).
    call, ran, _, _ = make_call(tmp_path, "build,tiny", budget=600, behaviour={"build": (570, None)})
    assert call.run() == 1
    assert ran == ["env", "build"]
    assert rows(tmp_path)["tiny"] == (NOT_RUN, None)
    assert "out of time" in (tmp_path / "results.md").read_text()


def test_an_interrupted_call_writes_what_it_has(tmp_path, monkeypatch):
    monkeypatch.setattr(driver.Call, "_build_unusable", lambda self: None)

    def interrupted(ctx):
        raise context.Interrupted("SIGTERM")

    call, ran, _, _ = make_call(tmp_path, "tiny,throughput", budget=2000, behaviour={"tiny": (3, interrupted)})
    assert call.run() == 1
    r = rows(tmp_path)
    assert r["env"][0] == PASS and r["tiny"] == (FAIL, 3) and r["throughput"] == (NOT_RUN, None)
    text = (tmp_path / "results.md").read_text()
    assert "**Interrupted by a signal during this step.**" in text
    assert "| 3 | tiny | FAIL | 3 | 100 | interrupted |" in text


def test_a_driver_bug_between_steps_still_writes_the_results(tmp_path, monkeypatch):
    def broken(self):
        raise OSError("disk full")

    monkeypatch.setattr(driver.Call, "_build_unusable", broken)
    call, ran, _, _ = make_call(tmp_path, "tiny", budget=1000)
    assert call.run() == 1
    assert ran == ["env"] and rows(tmp_path)["tiny"] == (NOT_RUN, None)
    text = (tmp_path / "results.md").read_text()
    assert "| 3 | tiny | not run | - | 100 | driver error: OSError: disk full |" in text
    assert "Driver error between steps (a bug in tools/bringup/):" in text


def test_step_deadline_is_its_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(driver.Call, "_build_unusable", lambda self: None)
    left = {}
    call, _, _, _ = make_call(tmp_path, "tiny", budget=1000, overrides={"tiny": 77},
                              behaviour={"tiny": (0, lambda ctx: left.setdefault("tiny", ctx.step_remaining()) and "")})
    call.run()
    assert left["tiny"] == 77


# ---------------------------------------------------------------- commands under a timeout
def test_run_times_out_and_kills_the_process_group(tmp_path, monkeypatch):
    monkeypatch.setattr(context, "MIN_START_S", 0)
    monkeypatch.setattr(context, "KILL_GRACE_S", 2)
    cfg = dataclasses.replace(context.make_config("dry", {}), work=tmp_path)
    ctx = context.Context(cfg, Results(tmp_path / "r.md", tmp_path, [], "x", 100))
    ctx.step_deadline = time.time() + 100
    t0 = time.time()
    # The child's own child must die too (the whole process group gets the TERM).
    rc = ctx.run(tmp_path / "a.log", ["bash", "-c", "sleep 30 & echo started; wait"], cap=1)
    assert rc == 124 and time.time() - t0 < 10
    log = (tmp_path / "a.log").read_text()
    assert log.startswith("+ bash -c 'sleep 30 & echo started; wait' (timeout 1s)") and "timed out after 1 s" in log
    assert ctx.run(tmp_path / "b.log", ["bash", "-c", "echo hi; exit 3"]) == 3
    assert (tmp_path / "b.log").read_text().endswith("hi\n")
    assert ctx.run(tmp_path / "c.log", [str(tmp_path / "no-such-program")]) == 127
    # Under MIN_START_S left in the step: not started.
    monkeypatch.setattr(context, "MIN_START_S", 5)
    ctx.step_deadline = time.time() + 3
    assert ctx.run(tmp_path / "d.log", ["true"]) == 124
    assert (tmp_path / "d.log").read_text() == "not started: out of time\n"


def test_a_signal_during_a_command_stops_its_process_group(tmp_path, monkeypatch):
    import signal
    monkeypatch.setattr(context, "KILL_GRACE_S", 2)
    cfg = dataclasses.replace(context.make_config("dry", {}), work=tmp_path)
    ctx = context.Context(cfg, Results(tmp_path / "r.md", tmp_path, [], "x", 100))
    ctx.step_deadline = time.time() + 100

    def on_alarm(signum, frame):
        raise context.Interrupted("SIGALRM")

    old = signal.signal(signal.SIGALRM, on_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with pytest.raises(context.Interrupted):
            ctx.run(tmp_path / "a.log", ["bash", "-c", "echo $$; sleep 30 & wait"])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    pgid = int((tmp_path / "a.log").read_text().splitlines()[1])
    assert live_group_members(pgid) == []     # nothing of the command's group runs on


def live_group_members(pgid):
    """Processes of the group that are not zombies (a container's init may not reap them)."""
    live = []
    for stat in os.listdir("/proc"):
        if stat.isdigit():
            try:
                fields = open(f"/proc/{stat}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                live.append(int(stat))
    return live


# ---------------------------------------------------------------- helpers the steps parse with
def test_read_bundle_env(tmp_path):
    script = tmp_path / "env.sh"
    script.write_text('LOOM_BUNDLE_LIB=/b/lib\nexport LD_LIBRARY_PATH=/b/lib\n'
                      'LOOM_BUNDLE_CMAKE_ARGS=(-C "/b/prefix.cmake" -DPKG_CONFIG_EXECUTABLE="/usr/bin/pkg config")\n')
    env, lib, args = read_bundle_env(script, {"PATH": os.environ["PATH"], "KEEP": "a\nb"})
    assert lib == "/b/lib"
    assert args == ["-C", "/b/prefix.cmake", "-DPKG_CONFIG_EXECUTABLE=/usr/bin/pkg config"]
    assert env["LD_LIBRARY_PATH"] == "/b/lib" and env["KEEP"] == "a\nb"
    script.write_text("exit 1\n")
    with pytest.raises(RuntimeError, match="env.sh failed"):
        read_bundle_env(script, {"PATH": os.environ["PATH"]})


def test_micro_batch_search():
    def outcomes(fits_up_to, start, cands=(1, 2, 4, 8, 16), error_at=None):
        def try_run(b):
            return "error" if b == error_at else ("ok" if b <= fits_up_to else "oom")
        return throughput.search(list(cands), start, try_run)
    # Up from the planner's guess while runs succeed, stop at the first out-of-memory.
    assert outcomes(4, 1) == {2: "ok", 4: "ok", 8: "oom"}
    # Down from a guess that was too large, stop at the first that fits.
    assert outcomes(2, 4) == {16: "oom", 8: "oom", 4: "oom", 2: "ok"}
    assert outcomes(16, 3) == {8: "ok", 16: "ok"}
    assert outcomes(0, 1) == {2: "oom", 1: "oom"}
    assert outcomes(16, 0, error_at=2) == {1: "ok", 2: "error"}
    assert throughput.search([1, 2], 0, lambda b: None) == {}       # out of time before the first


def test_compare_tolerances(tmp_path):
    def run(name, losses):
        d = tmp_path / name
        d.mkdir()
        (d / "metrics.jsonl").write_text("".join(json.dumps({"kind": "train", "step": i + 1, "loss": l}) + "\n"
                                                 for i, l in enumerate(losses)))
        return d
    ref, close, off = run("ref", [10.0, 9.0]), run("close", [10.001, 9.0]), run("off", [10.5, 9.0])
    lines, ok = metrics.compare(ref, [close, off], [1e-3, 3e-2], ["fp32", "bf16"], "CPU")
    assert ok is False
    assert lines[0] == "| step | CPU | fp32 | rel. diff | bf16 | rel. diff |"
    assert lines[-2] == "- fp32: max relative difference 1.000e-04 over 2 steps (limit 0.001): pass"
    assert lines[-1] == "- bf16: max relative difference 5.000e-02 over 2 steps (limit 0.03): FAIL"
    short = run("short", [10.0])
    lines, ok = metrics.compare(ref, [short], [1e-3])
    assert not ok and lines[-1].endswith("1 steps missing: FAIL")


def test_sanitizer_error_summary_and_absent_binary(tmp_path):
    log = tmp_path / "s.log"
    log.write_text("========= COMPUTE-SANITIZER\n========= Invalid __global__ read of size 4\n"
                   "========= ERROR SUMMARY: 3 errors\n")
    assert ops.sanitizer_errors(log) == 3
    log.write_text("All tests passed\n")
    assert ops.sanitizer_errors(log) is None
    cfg = dataclasses.replace(context.make_config("gpu", {}), work=tmp_path, build=tmp_path / "bld")
    ctx = context.Context(cfg, Results(tmp_path / "r.md", tmp_path, [], "x", 570))
    ctx.step_deadline = ctx.deadline
    with pytest.raises(StepError) as e:
        ops.step_sanitizer(ctx)
    assert e.value.status == SKIPPED
    assert f"no kernel test binary {tmp_path}/bld/bin/{ops.KERNEL_TEST_TARGET}" in e.value.detail
    cfg = dataclasses.replace(cfg, mode="dry")
    with pytest.raises(StepError, match="needs a GPU") as e:
        ops.step_sanitizer(context.Context(cfg, Results(tmp_path / "r.md", tmp_path, [], "x", 570)))
    assert e.value.status == SKIPPED


def test_jget_and_cfg_value(tmp_path):
    assert context.jget({"a": 0.01234}, "a", 1) == "0.012"
    assert context.jget({"a": 1234.56}, "a", 0) == "1235"
    assert context.jget({"a": True}, "a") == "True" and context.jget({}, "a") == "-" and context.jget(None, "a") == "-"
    conf = tmp_path / "config.yaml"
    conf.write_text("trainer:\n  devices: 1\nmodel:\n  num_layers: 12\n  hidden_size: 768\n  optim:\n    lr: 1\n")
    assert throughput.cfg_value(conf, "model.num_layers") == "12"
    assert throughput.cfg_value(conf, "model.devices") == "0"
    assert throughput.cfg_value(tmp_path / "none.yaml", "model.num_layers") == "0"


# ---------------------------------------------------------------- the command line
def run_cli(*args, env=None):
    return subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_bringup.py"), *args], capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, timeout=60)


def test_cli_plan_help_and_bad_arguments():
    pinned = [f"--budget={n}={b}" for n, b in PINNED.items()]
    r = run_cli("--plan", *pinned)
    assert r.returncode == 0
    assert r.stdout.startswith("Plan: 1 env (30 s), 2 build (420 s), 3 tiny (100 s); 550 s of budgets within the time budget 570 s")
    r = run_cli("--plan", "--steps", "ops", *pinned, "--budget", "ops=60", env={"LOOM_BRINGUP_DEADLINE_S": "200"})
    assert r.stdout.startswith("Plan: 1 env (30 s), 8 ops (60 s); 90 s of budgets within the time budget 200 s")
    r = run_cli("--help")
    assert r.returncode == 0 and " 9. sanitizer" in r.stdout and "LOOM_BRINGUP_MBS          micro-batch candidates of step 4" in r.stdout
    r = run_cli("--steps", "tiny,bogus")
    assert r.returncode == 2 and "--steps: unknown step 'bogus'" in r.stderr
    r = run_cli("--time-budget", "100", *pinned)
    assert r.returncode == 2 and "the required steps need env 30 s + build 420 s" in r.stderr
    r = run_cli("--plan", env={"LOOM_BRINGUP_TPUT_STEPS": "ten"})
    assert r.returncode == 2 and "LOOM_BRINGUP_TPUT_STEPS: expected an integer, got 'ten'" in r.stderr


# ---------------------------------------------------------------- the steps against a stub `loom`
STUB_LOOM = r'''
import json, os, sys
FIT = 8                      # the largest micro-batch that "fits"
args = sys.argv[1:]
opt = lambda name: args[args.index(name) + 1]
if args[:2] == ["plan", "calibrate"]:
    with open(opt("--out"), "w") as f:
        json.dump({"device": {"name": "stub", "peak_tflops": 1, "memory_bandwidth_gbs": 2}, "memory_bandwidth_gbs": 3.0,
                   "kernel_launch_us": 4.0, "measured": {"dtype": "fp32"},
                   "gemm": [{"m": 1, "n": 2, "k": 3, "tflops": 0.5}]}, f)
    print("loom plan calibrate: 1 GEMM shape measured")
    sys.exit(0)
if args[0] == "plan":
    b = int(opt("--mbs"))
    tps = (880.0 if "--profile" in args else 1000.0) * b
    with open(opt("--csv"), "w") as f:
        f.write("micro_batch,fits,memory_gib,weights_optimizer_gib,activations_gib,embedding_logits_gib,"
                "transient_gib,reserve_gib,step_seconds,tokens_per_second,model_tflops_per_gpu,mfu\n")
        f.write(f"{b},{int(b <= FIT)},{0.1 * b},0.1,0.2,0.3,0.4,0.5,0.6,{tps},1.5,0.02\n")
    sys.exit(0 if b <= FIT else 1)
assert args[0] == "train"
o = dict(a.split("=", 1) for a in args[2:])
out = o.get("run.results_dir") or o["exp_manager.explicit_log_dir"]
b = int(o.get("model.micro_batch_size", 2))
print("[loom] device: stub " + o["trainer.accelerator"] + ", env LOOM_SINGLE_RANK_GROUPS=" + os.environ.get("LOOM_SINGLE_RANK_GROUPS", "-"))
if b > FIT:
    print("terminate called: CUDA out of memory (stub)")
    sys.exit(1)
os.makedirs(out, exist_ok=True)
bump = 1.001 if o.get("trainer.precision") == "bf16" else 1.0
with open(out + "/metrics.jsonl", "w") as f:
    for i in range(1, int(o["trainer.max_steps"]) + 1):
        f.write(json.dumps({"kind": "train", "step": i, "loss": (10 - 0.1 * i) * bump, "tokens_per_s": 100.0 * b,
                            "step_time_s": 0.5, "elapsed_s": 0.5 * i, "model_tflops_per_device": 1.0, "mfu": 0.01,
                            "peak_device_memory_mib": 50.0 * b, "max_rss_mib": 300.0}) + "\n")
with open(out + "/config.yaml", "w") as f:
    f.write("trainer:\n  devices: 1\nmodel:\n  num_layers: 2\n  hidden_size: 64\n  num_attention_heads: 2\n"
            "  encoder_seq_length: 64\n  make_vocab_size_divisible_by: 128\n")
print("[loom] model: 2 layers, hidden 64, 123456 parameters on rank 0")
'''


def test_steps_against_a_stub_loom(tmp_path, monkeypatch):
    """Steps 3, 4, 5 and 7 read what `loom` writes (metrics.jsonl, config.yaml, plan CSVs, the
    calibrated profile): with a stub that writes those files, each must pass with its figures."""
    from bringup import calibrate, tiny
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bld" / "bin").mkdir(parents=True)
    loom = tmp_path / "bld" / "bin" / "loom"
    loom.write_text(f"#!{sys.executable}\n" + STUB_LOOM)
    loom.chmod(0o755)
    cfg = dataclasses.replace(context.make_config("dry", {"LOOM_BRINGUP_MBS": "2 4 8 16 32"}),
                              work=tmp_path / "work", build=tmp_path / "bld")
    driver.clean_work(cfg.work)
    res = Results(tmp_path / "r.md", cfg.work, [], "x", 1000)
    ctx = context.Context(cfg, res)
    ctx.py = sys.executable
    tiny.choose_accelerator(ctx)
    assert ctx.accel == "cpu" and "is not built yet" in ctx.accel_note   # no stand-in plugin here
    details = {}
    for name, fn in (("tiny", tiny.step_tiny), ("throughput", throughput.step_throughput),
                     ("calibrate", calibrate.step_calibrate), ("layout", tiny.step_layout)):
        ctx.current, ctx.step_deadline = name, time.time() + 120
        details[name] = fn(ctx)
        ctx.done.append(name)
    assert details["tiny"] == "fp32 within 1e-3, bf16 within 3% of CPU fp32"
    assert details["throughput"] == "b=8: 800 tokens/s, MFU 0.010"
    assert details["calibrate"] == "measured profile +780.0% vs measured tokens/s (built-in profile +900.0%)"
    assert details["layout"] == "cpu: max relative difference 0.000e+00 over 5 steps (limit 0.001): pass"
    s = {k: "\n".join(v) for k, v in res.sections.items()}
    assert "- GPU bf16: max relative difference 1.000e-03 over 5 steps (limit 0.03): pass" in s["tiny"]
    assert "- `tiny_gpu_fp32` (cpu, precision 32): exit 0; device: stub cpu, env LOOM_SINGLE_RANK_GROUPS=-" in s["tiny"]
    # The search starts at the planner's largest fit (8), goes up once and meets the OOM.
    assert "| 8 | ok | 800 | 1.0 | 0.010 | 400 | - | 300 | 0.800 | 8000 | 0.020 |" in s["throughput"]
    assert "| 16 | oom |" in s["throughput"] and "| 4 |" not in s["throughput"]
    assert "- micro-batch 16 (oom): terminate called: CUDA out of memory (stub)" in s["throughput"]
    assert "**Largest micro-batch that ran: 8** (next candidate 16: oom): 800 tokens/s" in s["throughput"]
    assert "L=2 h=64 a=2 s=64 b=8 V=50304 P=123456" in s["throughput"]
    assert "| loom plan, measured profile | 7040 | 0.020 | +780.0% |" in s["calibrate"]
    assert "| 1 x 2 x 3 | 0.5 |" in s["calibrate"]
    # --make-reference (for tools/gpu_bundle.sh): the CPU fp32 run with the GPU run's step count.
    assert tiny.make_reference(ctx, tmp_path / "ref") == 0
    assert (tmp_path / "ref" / "tiny_steps").read_text() == "5\n"
    assert len((tmp_path / "ref" / "tiny_cpu_fp32.metrics.jsonl").read_text().splitlines()) == 5
    # A later call reads step 4's figures from the file this one left.
    later = context.Context(cfg, Results(tmp_path / "r2.md", cfg.work, [], "x", 1000))
    b, figures = throughput.last_throughput(later)
    assert b == 8 and figures["tokens_per_s"] == 800


def test_sanitizer_step_runs_each_tool_and_reports_errors(tmp_path, monkeypatch):
    # A stand-in compute-sanitizer: runs the binary, reports 2 hazards under racecheck.
    tools = tmp_path / "cuda"
    tools.mkdir()
    (tools / "compute-sanitizer").write_text(
        "#!/bin/sh\n[ \"$1\" = --tool ] && tool=$2 && shift 4 && \"$@\" || exit 9\n"
        "if [ \"$tool\" = racecheck ]; then echo '========= ERROR SUMMARY: 2 errors'; exit 99; fi\n"
        "echo '========= ERROR SUMMARY: 0 errors'\n")
    (tools / "compute-sanitizer").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    binary = tmp_path / "kernel_tests"
    binary.write_text("#!/bin/sh\necho \"kernel tests $*\"\n")
    binary.chmod(0o755)
    cfg = dataclasses.replace(context.make_config("gpu", {"LOOM_BRINGUP_KERNEL_TESTS": str(binary),
                                                          "LOOM_BRINGUP_KERNEL_TEST_ARGS": "--order rand"}),
                              work=tmp_path / "w")
    res = Results(tmp_path / "r.md", cfg.work, [], "x", 570)
    ctx = context.Context(cfg, res)
    ctx.current, ctx.step_deadline = "sanitizer", time.time() + 60
    with pytest.raises(StepError) as e:
        ops.step_sanitizer(ctx)
    assert e.value.status == FAIL and e.value.detail == "racecheck exit 99, 2 errors"
    text = "\n".join(res.sections["sanitizer"])
    assert "| memcheck | 0 | 0 |" in text and "| racecheck | 99 | 2 |" in text and "| synccheck | 0 | 0 |" in text
    assert "racecheck:\n```" in text and "memcheck:\n```" not in text    # the failing tool's log tail only
    log = (cfg.work / "logs" / "sanitizer_memcheck.log").read_text()
    assert "--tool memcheck --error-exitcode 99" in log and "kernel tests --order rand" in log
