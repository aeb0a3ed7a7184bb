"""The planner's memory against what Loom allocates (docs/planner.md, "Checking the memory
model"): `loom plan --validate-memory` trains the main-job recipe's model for two steps per case
on the stand-in device, whose allocator keeps exact counts, and sets the planner's predicted peak
and after-step bytes of every pipeline stage beside metrics.jsonl's measured ones. CI runs the
`ci` subset (one case each of one rank, t=2 with SP and selective recompute, p=2 1F1B, d=2 fp16
with the distributed optimizer; under a minute on 2 cores) for the GPT recipe and for the Llama-family
tiny recipe; LOOM_MEMORY_SWEEP_FULL=1 (or
tools/test.sh --full) runs every case. Target: every stage within 5% of its measured peak, the
mean within 2%."""
import os
import re
import subprocess

import pytest

from test_data_helpers import ROOT, loom_binary
from test_standin_lane import standin_library
from train_helpers import RECIPE, make_corpus

FULL = os.environ.get("LOOM_MEMORY_SWEEP_FULL") == "1"
ROW = re.compile(r"^\| (\S+) \| (\d+) \| (\w+) \|(.*)\|$")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory)


def parse_rows(stdout):
    """{(case, stage): (predicted peak MiB, measured peak MiB, peak error %, after error %)}."""
    rows = {}
    for line in stdout.splitlines():
        m = ROW.match(line)
        if not m or m[1] == "case":
            continue
        cells = [c.strip() for c in m[4].split("|")]
        rows[m[1], int(m[2])] = (float(cells[7]), float(cells[8]), float(cells[9].rstrip("%")),
                                 float(cells[12].rstrip("%")))
    return rows


# The Llama-family tiny recipe (RMSNorm, RoPE, SwiGLU, 2 query groups for 4 heads, no biases,
# untied output layer, no dropout): the same cases on the other architecture.
LLAMA_RECIPE = ROOT / "recipes" / "llama_tiny.yaml"


@pytest.mark.parametrize("recipe", [RECIPE, LLAMA_RECIPE], ids=["gpt", "llama"])
def test_memory_sweep_is_within_target(corpus, tmp_path, recipe):
    env = dict(os.environ, LOOM_DEVICE_PLUGIN=str(standin_library()), OMP_NUM_THREADS="1")
    env.pop("LOOM_DEVICE_COLLECTIVES", None)
    done = subprocess.run(
        [str(loom_binary()), "plan", "--validate-memory", "--validate-memory-cases", "all" if FULL else "ci",
         "--measure-dir", str(tmp_path), "--recipe", str(recipe), f"model.data.data_prefix=[1.0,{corpus}]",
         "model.data.num_workers=0"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600 if FULL else 300)
    print(done.stdout)
    rows = parse_rows(done.stdout)
    cases = {case for case, _ in rows}
    assert len(cases) == (24 if FULL else 4), (cases, done.stderr[-3000:])
    # Every stage of a pipelined case is there.
    for case in cases:
        stages = 2 if re.search(r"p2", case) else 1
        assert {s for c, s in rows if c == case} == set(range(stages)), case
    errors = [abs(r[2]) for r in rows.values()]
    assert max(errors) <= 5.0, done.stdout
    assert sum(errors) / len(errors) <= 2.0, done.stdout
    # What stays allocated after a step is the model states (predicted within 0.05% here); the
    # bound is the 5%, not 1%: the stand-in's d = 2 rows depend on Gloo dropping a finished
    # collective's tensors in time, which a loaded CI machine may delay.
    assert max(abs(r[3]) for r in rows.values()) <= 5.0, done.stdout
    assert done.returncode == 0 and "(target: every row within 5%, mean within 2%): met" in done.stdout, done.stderr


def test_validate_memory_needs_a_recipe_and_known_cases(tmp_path):
    done = subprocess.run([str(loom_binary()), "plan", "--validate-memory"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "--validate-memory needs --recipe" in done.stderr, done.stderr
    done = subprocess.run([str(loom_binary()), "plan", "--validate-memory", "--recipe", str(RECIPE),
                           "--validate-memory-cases", "t9p9"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "unknown case 't9p9'" in done.stderr, done.stderr
