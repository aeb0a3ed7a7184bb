"""Loom's TensorBoard writer (csrc/runlog) read by TensorBoard's own EventAccumulator: the
records' CRCs, the protobufs, tags, steps and float32 values, and the SessionLog START purge a
resumed run relies on. The writer runs in loom_test_runlog (a hidden Catch2 case), so this needs
no torch build."""
import os
import pathlib
import subprocess

import numpy as np
import pytest

from test_data_helpers import ROOT

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def runlog_test_binary():
    build = pathlib.Path(os.environ.get("LOOM_BUILD_DIR", ROOT / "build"))
    exe = (build if build.is_absolute() else ROOT / build) / "bin" / "loom_test_runlog"
    if not exe.exists():
        pytest.skip(f"{exe} is not built")
    return exe


def test_event_accumulator_reads_what_loom_writes(tmp_path):
    done = subprocess.run([str(runlog_test_binary()), "write the TensorBoard reader fixture"],
                          env={**os.environ, "LOOM_TB_FIXTURE_DIR": str(tmp_path)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    files = sorted((tmp_path / "run").glob("events.out.tfevents.*"))
    assert len(files) == 2
    acc = event_accumulator.EventAccumulator(str(tmp_path / "run"), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == ["train/loss", "train/lr", "validation/val_loss",
                                             "validation/val_perplexity"]
    f32 = lambda v: float(np.float32(v))
    loss = [(e.step, e.value) for e in acc.Scalars("train/loss")]
    # Steps 3 and 4 of the first file were purged by the second file's START at step 3.
    assert loss == [(1, f32(10.0)), (2, f32(5.0)), (3, f32(103.0)), (4, f32(104.0)), (5, f32(105.0))]
    assert [(e.step, e.value) for e in acc.Scalars("train/lr")] == [(1, f32(1e-3)), (2, f32(2e-3))]
    assert [(e.step, e.value) for e in acc.Scalars("validation/val_loss")] == [(5, 2.5)]
    assert acc.file_version == 2.0  # the "brain.Event:2" first record


def test_a_corrupted_record_is_refused_by_tensorboard(tmp_path):
    subprocess.run([str(runlog_test_binary()), "write the TensorBoard reader fixture"],
                   env={**os.environ, "LOOM_TB_FIXTURE_DIR": str(tmp_path)}, check=True, capture_output=True)
    first = sorted((tmp_path / "run").glob("events.out.tfevents.*"))[0]
    data = bytearray(first.read_bytes())
    data[-6] ^= 0xFF  # a payload byte of the last record: its data CRC no longer matches
    first.write_bytes(bytes(data))
    for other in sorted((tmp_path / "run").glob("events.out.tfevents.*"))[1:]:
        other.unlink()
    acc = event_accumulator.EventAccumulator(str(tmp_path / "run"), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    # TensorBoard's reader stops at the damaged record: step 4 (the last record) is not shown.
    assert [e.step for e in acc.Scalars("train/loss")] == [1, 2, 3]
