"""TensorBoard event files of `loom train` (csrc/runlog, docs/design/tensorboard.md), read back
with TensorBoard's own EventAccumulator: every scalar, step and tag equals metrics.jsonl (the
last record of each step, values as float32 as TensorBoard stores them), and a run resumed from
an older checkpoint redoes its steps without TensorBoard showing any step twice."""
import json
import math

import numpy as np
import pytest

from train_helpers import make_corpus, run_train, tiny_overrides

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

STEPS = 6


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory)


def expected_scalars(run_dir):
    """{tag: {step: value}} from metrics.jsonl by Loom's rule (runlog/record_scalars.h): every
    number but step/max_steps as <kind>/<field>, plus <kind>/val_perplexity; a later record of
    the same step replaces an earlier one (what the resumed run redid)."""
    want = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        kind = record.get("kind", "train")
        for key, value in record.items():
            if key in ("step", "max_steps") or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            want.setdefault(f"{kind}/{key}", {})[record["step"]] = value
        if "val_loss" in record:
            want.setdefault(f"{kind}/val_perplexity", {})[record["step"]] = math.exp(record["val_loss"])
    return want


def read_event_files(run_dir):
    acc = event_accumulator.EventAccumulator(str(run_dir), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_event_files_hold_metrics_jsonl_and_a_resume_shows_each_step_once(corpus, tmp_path):
    overrides = tiny_overrides(corpus, tmp_path, steps=STEPS,
                               extra=["trainer.val_check_interval=2",
                                      "exp_manager.checkpoint_callback_params.every_n_steps=2"])
    run_train(overrides, "--stop-after-steps", "4")  # saves 2 and 4
    first = read_event_files(tmp_path)
    assert [s for s, _ in first["train/loss"]] == [1, 2, 3, 4]
    # Resume from the older checkpoint: steps 3 and 4 are trained again and logged a second time
    # in metrics.jsonl; TensorBoard keeps only the new ones.
    done = run_train(overrides, "--iteration", "2")
    assert "resumed from" in done.stderr
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 2
    steps_logged = [json.loads(l)["step"] for l in (tmp_path / "metrics.jsonl").read_text().splitlines()
                    if json.loads(l)["kind"] == "train"]
    assert steps_logged == [1, 2, 3, 4, 3, 4, 5, 6]

    got = read_event_files(tmp_path)
    want = expected_scalars(tmp_path)
    assert set(got) == set(want)
    for tag in ("train/loss", "train/lr", "train/grad_norm", "train/loss_scale", "train/tokens_per_s",
                "train/model_tflops_per_device", "train/max_rss_mib", "train/eta_s",
                "validation/val_loss", "validation/val_perplexity"):
        assert tag in got, tag
    for tag, series in got.items():
        steps = [s for s, _ in series]
        assert steps == sorted(set(steps)), f"{tag}: steps {steps} repeated or out of order"
        assert dict(series) == {s: float(np.float32(v)) for s, v in want[tag].items()}, tag
    assert [s for s, _ in got["train/loss"]] == list(range(1, STEPS + 1))
    assert [s for s, _ in got["validation/val_loss"]] == [0, 2, 4, 6]
    # The resumed steps are the second run's values, not the first's.
    assert dict(got["train/elapsed_s"])[3] != dict(first["train/elapsed_s"])[3]


def test_loom_eval_writes_its_scores_at_the_checkpoint_iteration(corpus, tmp_path):
    import subprocess
    from test_data_helpers import ROOT, loom_binary
    run_dir = tmp_path / "run"
    run_train(tiny_overrides(corpus, run_dir, steps=2))
    out = tmp_path / "results.json"
    tasks = ",".join(f"{kind}:{ROOT / 'data' / 'eval' / (name + '.jsonl')}" for name, kind in
                     (("shakespeare_lambada", "lambada"), ("shakespeare_speaker", "mc")))
    done = subprocess.run([str(loom_binary()), "eval", "--checkpoint", str(run_dir), "--tasks", tasks, "--limit", "8",
                           "--output", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "loom eval: 16/16 requests (100%)" in done.stderr or "requests (100%)" in done.stderr
    results = json.loads(out.read_text())["results"]
    got = read_event_files(run_dir)
    want = {}
    for task, metrics_ in results.items():
        for key, value in metrics_.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                want[f"eval/{task}/{key.split(',')[0]}"] = value
    assert want and set(want) <= set(got)
    for tag, value in want.items():
        assert got[tag] == [(2, float(np.float32(value)))], tag
