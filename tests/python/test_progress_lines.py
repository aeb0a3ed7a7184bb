"""Progress at a glance (csrc/runlog/progress_line.h, train/metrics_log.cpp): `loom preprocess`'s
progress line with rate and ETA, plain lines off a terminal and an in-place line on one; the
training step line's elapsed time and ETA (and max_time), and the one-line summary at the end."""
import os
import pty
import re
import subprocess

import pytest

from test_data_helpers import ROOT, loom_binary
from train_helpers import make_corpus, metrics, run_train, tiny_overrides

CONTROL = re.compile(r"[\r\x1b]")
PREPROCESS_LINE = re.compile(r"^\[preprocess\] (\d+\.\d)/(\d+\.\d) MB \((\d+)%\) \| [\d.]+ MB/s \| elapsed \d+:\d\d \| "
                             r"ETA (\d+:\d\d|--:--) \| (\d+) docs, (\d+) tokens$")


def preprocess_cmd(tmp_path):
    return [str(loom_binary()), "preprocess", "--input", str(ROOT / "data" / "tinyshakespeare.txt"),
            "--output-prefix", str(tmp_path / "out"), "--vocab-file", str(ROOT / "data" / "gpt2-vocab.json"),
            "--merge-file", str(ROOT / "data" / "gpt2-merges.txt"), "--append-eod"]


def test_preprocess_prints_plain_progress_lines_off_a_terminal(tmp_path):
    done = subprocess.run(preprocess_cmd(tmp_path), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert not CONTROL.search(done.stderr)
    lines = [l for l in done.stderr.splitlines() if PREPROCESS_LINE.match(l)]
    assert lines, done.stderr
    last = PREPROCESS_LINE.match(lines[-1])
    assert last.group(1) == last.group(2) and last.group(3) == "100" and last.group(4) == "0:00"
    summary = re.search(r"\[preprocess\] (\d+) documents, (\d+) tokens", done.stderr)
    assert (last.group(5), last.group(6)) == summary.groups()  # the last line counts everything


def test_preprocess_redraws_one_line_on_a_terminal(tmp_path):
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(preprocess_cmd(tmp_path)[0], preprocess_cmd(tmp_path))
    out = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, out[-2000:]
    text = out.decode()
    assert "\r\x1b[K[preprocess] " in text
    assert re.search(r"\(100%\) \| [\d.]+ MB/s \| elapsed \d+:\d\d \| ETA 0:00 \| \d+ docs", text)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory)


def test_step_lines_show_elapsed_and_eta_and_the_run_ends_with_a_summary(corpus, tmp_path):
    done = run_train(tiny_overrides(corpus, tmp_path, steps=4, extra=["trainer.max_time=00:01:00:00"]))
    assert not CONTROL.search(done.stderr)  # captured: not a terminal
    steps = re.findall(r"step (\d)/4 \| loss [\d.]+ .*\| elapsed (\d+:\d\d) \| ETA (\d+:\d\d) "
                       r"\(max_time in (\d+:\d\d:\d\d|\d+:\d\d)\)", done.stderr)
    assert [s[0] for s in steps] == ["1", "2", "3", "4"], done.stderr[-3000:]
    assert steps[-1][2] == "0:00"
    records = metrics(tmp_path)
    assert all(r["eta_s"] >= 0 and 0 < r["max_time_left_s"] <= 3600 for r in records)
    assert records[-1]["eta_s"] == 0
    tokens = sum(r["tokens_per_s"] * r["step_time_s"] for r in records)
    best = min(r["val_loss"] for r in metrics(tmp_path, "validation"))
    summary = re.search(r"\[loom\] done: steps 1-4 of 4 \(4 in this run\), (\d+) tokens in \d+:\d\d "
                        r"\(mean (\d+) tokens/s\) \| best validation loss ([\d.]+) \(step \d\) \| checkpoint (\S+)",
                        done.stderr)
    assert summary, done.stderr[-2000:]
    assert int(summary.group(1)) == round(tokens)
    assert float(summary.group(3)) == pytest.approx(best, abs=1e-4)
    assert summary.group(4).endswith("checkpoints/iter_0000004")
