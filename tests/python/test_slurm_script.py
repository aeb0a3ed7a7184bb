"""`loom slurm` end to end without a cluster: the written sbatch script runs under bash with a
stand-in `srun` that starts one task per rank the way Slurm does (SLURM_PROCID, SLURM_LOCALID,
SLURM_NTASKS, SLURM_JOB_NODELIST, SLURM_JOB_ID), so Loom's Slurm rendezvous trains for real."""
import json
import os
import subprocess

import pytest

from test_data_helpers import ROOT, loom_binary
from train_helpers import RECIPE, make_corpus, tiny_overrides

FAKE_SRUN = """#!/bin/bash
# Stand-in for srun inside an allocation: drop srun's own options, start SLURM_NTASKS tasks.
while [[ "$1" == --* ]]; do shift; done
pids=()
for ((i = 0; i < SLURM_NTASKS; i++)); do
  SLURM_PROCID=$i SLURM_LOCALID=$i "$@" &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
exit $rc
"""


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory)


def test_slurm_script_trains_with_slurm_rendezvous(corpus, tmp_path):
    run_dir = tmp_path / "run"
    overrides = tiny_overrides(corpus, run_dir, t=2, p=1, d=1, steps=3) + ["cluster.exclusive=false"]
    script = tmp_path / "train.sbatch"
    done = subprocess.run([str(loom_binary()), "slurm", str(RECIPE), *overrides, "--output", str(script),
                           "--loom", str(loom_binary())], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    text = script.read_text()
    assert "#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=2\n" in text
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "srun").write_text(FAKE_SRUN)
    (bindir / "srun").chmod(0o755)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", SLURM_JOB_ID="4242", SLURM_NTASKS="2",
               SLURM_NTASKS_PER_NODE="2", SLURM_JOB_NODELIST="localhost", SLURM_NNODES="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LOOM_LOCAL_LAUNCHER"):
        env.pop(k, None)
    ran = subprocess.run(["bash", str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stderr[-4000:]
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in steps if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3]
    assert "t=2 p=1" in ran.stderr  # both tasks formed one tensor-parallel pair


def test_slurm_refuses_an_invalid_recipe(tmp_path):
    done = subprocess.run([str(loom_binary()), "slurm", str(RECIPE), "trainer.devices=3"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "trainer.devices" in done.stderr
