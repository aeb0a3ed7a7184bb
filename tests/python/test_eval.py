"""`loom eval` end to end on a tiny model trained here (tests/python/train_helpers.py) and the
bundled task files (data/eval, tools/make_eval_tasks.py):
- layout independence: t=2 × p=2 at batch 3 gives the t=1 batch-8 per-document
  log-likelihoods (fp32 reduction-order tolerance) and the same accuracies; with
  LOOM_EVAL_FULL=1 or tools/test.sh --full also × d=2 (8 CPU ranks), p=2 alone and batch 1;
- bad input exits 2 naming the file:line and field, the kind, the checkpoint;
- the check that matters: lm-evaluation-harness (its `hf` model, offline) on the checkpoint
  exported by `loom convert --to hf`, with the same files as custom tasks that include the
  harness's own lambada_openai / hellaswag / wikitext task YAMLs, reports the same numbers:
  identical accuracies, perplexities within 1e-4 relative."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from test_data_helpers import ROOT, loom_binary
from train_helpers import make_corpus, run_train, tiny_overrides

EVAL = ROOT / "data" / "eval"
TASKS = {
    "shakespeare_lambada": "lambada",
    "shakespeare_hellaswag": "hellaswag",
    "shakespeare_speaker": "mc",
    "shakespeare_pages": "wikitext",
}
LIMIT = 40  # documents per task in the layout tests (the parity test runs the whole files)


def task_spec(names=TASKS):
    return ",".join(f"{kind}:{EVAL / (name + '.jsonl')}" for name, kind in names.items())


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """The tiny recipe (4 layers, hidden 32, 32 positions) trained 20 steps at t=1 p=1."""
    corpus = make_corpus(tmp_path_factory)
    run = tmp_path_factory.mktemp("eval_model")
    run_train(tiny_overrides(corpus, run, steps=20, global_batch=4))
    return run


def loom_eval(checkpoint, *flags, check=True, timeout=900):
    done = subprocess.run([str(loom_binary()), "eval", "--checkpoint", str(checkpoint), *map(str, flags)],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if check:
        assert done.returncode == 0, f"loom eval failed ({done.returncode}):\n{done.stderr[-6000:]}"
    return done


def evaluate(model, out_dir, *flags):
    out = out_dir / "results.json"
    loom_eval(model, "--tasks", task_spec(), "--limit", LIMIT, "--bootstrap-iters", 1000, "--output", out,
              "--log-samples", *flags)
    samples = {name: [json.loads(line) for line in (out_dir / f"results_samples_{name}.jsonl").read_text().splitlines()]
               for name in TASKS}
    return json.loads(out.read_text()), samples


def assert_same_scores(ref, other, rel=1e-5):
    (ref_results, ref_samples), (results, samples) = ref, other
    for name in TASKS:
        assert len(samples[name]) == len(ref_samples[name]) == LIMIT
        for a, b in zip(ref_samples[name], samples[name]):
            assert a["doc"] == b["doc"]
            for ra, rb in zip(a["resps"], b["resps"]):
                assert rb[0] == pytest.approx(ra[0], rel=rel, abs=1e-5), (name, a["doc_id"])
                assert ra[1:] == rb[1:], (name, a["doc_id"])  # is_greedy
        for metric, value in ref_results["results"][name].items():
            if metric.startswith("acc") and "stderr" not in metric:
                assert results["results"][name][metric] == value, (name, metric)
            elif isinstance(value, float):
                assert results["results"][name][metric] == pytest.approx(value, rel=rel), (name, metric)


def test_layouts_and_batch_sizes_give_the_same_scores(model, tmp_path):
    ref_dir, dir8, dir_p2, dir_b1 = (tmp_path / n for n in ("t1", "t2p2d2", "p2", "b1"))
    for d in (ref_dir, dir8, dir_p2, dir_b1):
        d.mkdir()
    ref = evaluate(model, ref_dir, "--batch-size", 8)
    results = ref[0]
    assert set(results["results"]) == set(TASKS)
    assert results["n-samples"]["shakespeare_lambada"] == {"original": 200, "effective": LIMIT}
    lam = results["results"]["shakespeare_lambada"]
    assert lam["perplexity,none"] > 1 and 0 <= lam["acc,none"] <= 1 and lam["acc_stderr,none"] >= 0
    assert results["results"]["shakespeare_pages"]["word_perplexity_stderr,none"] == "N/A"
    # A model 20 steps from random may prefer one speaker whatever the line (accuracy 0 on 40
    # documents happens): only the range is asserted; the layouts below must agree exactly.
    assert 0 <= results["results"]["shakespeare_speaker"]["acc,none"] <= 1

    # CI: t=2 x p=2 (4 ranks, batch 3: a layout and a batch size other than the reference's);
    # LOOM_EVAL_FULL=1 / tools/test.sh --full: t=2 x p=2 x d=2 (8 ranks), p=2 alone, batch 1.
    full = os.environ.get("LOOM_EVAL_FULL") == "1"
    assert_same_scores(ref, evaluate(model, dir8, "--tensor-parallel", 2, "--pipeline-parallel", 2,
                                     "--data-parallel", 2 if full else 1, "--batch-size", 3))
    if full:
        assert_same_scores(ref, evaluate(model, dir_p2, "--pipeline-parallel", 2, "--batch-size", 5))
        assert_same_scores(ref, evaluate(model, dir_b1, "--batch-size", 1))


def test_bad_input_exits_2_naming_what_is_wrong(model, tmp_path):
    def fails(*flags, expect):
        done = loom_eval(model, *flags, check=False)
        assert done.returncode == 2, done.stderr
        assert expect in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and "terminate called" not in done.stderr

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "one two"}\n{"text": "three\n')
    fails("--tasks", f"lambada:{bad}", expect=f"{bad}:2: not valid JSON")
    field = tmp_path / "field.jsonl"
    field.write_text('{"context": "c", "choices": ["a", "b"], "gold": 1}\n{"context": "c", "choice": ["a"], "gold": 0}\n')
    fails("--tasks", f"mc:{field}", expect=f'{field}:2: field "choices" is missing')
    gold = tmp_path / "gold.jsonl"
    gold.write_text('{"goal": "g", "sol1": "a", "sol2": "b", "label": 2}\n')
    fails("--tasks", f"piqa:{gold}", expect=f'{gold}:1: field "label": gold index 2 is out of range for 2 choices')
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    fails("--tasks", f"wikitext:{empty}", expect="holds no documents")
    fails("--tasks", f"boolq:{empty}", expect="unknown task kind 'boolq'")
    fails("--tasks", f"lambada:{tmp_path / 'missing.jsonl'}", expect="cannot open")
    # A line is held whole: an endless one is refused at 64 MiB instead of growing until memory runs out.
    fails("--tasks", "lambada:/dev/zero", expect="task zero: '/dev/zero' line 1: longer than 67108864 bytes")
    fails("--tasks", task_spec(), "--pipeline-parallel", 3, expect="--pipeline-parallel 3 does not fit")
    done = subprocess.run([str(loom_binary()), "eval", "--checkpoint", str(tmp_path / "nope"), "--tasks",
                           task_spec()], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and str(tmp_path / "nope") in done.stderr, done.stderr


HARNESS_TASKS = {
    # our task name: (the harness's own task YAML it includes, the split that YAML reads)
    "shakespeare_lambada": ("lambada/lambada_openai.yaml", "test"),
    "shakespeare_hellaswag": ("hellaswag/hellaswag.yaml", "validation"),
    "shakespeare_pages": ("wikitext/wikitext.yaml", "test"),
}
SPEAKER_YAML = """\
task: shakespeare_speaker
dataset_path: json
dataset_kwargs:
  data_files:
    test: {path}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{gold}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
"""


def require_harness():
    """lm_eval's task folder; skips the test when lm-eval is not installed."""
    try:
        import lm_eval  # noqa: F401  (tools/requirements-test.txt pins it)
    except ImportError as e:
        pytest.skip(f"lm-eval is not installed ({e}); tools/setup.sh installs tools/requirements-test.txt")
    return pathlib_of(lm_eval) / "tasks"


def run_harness(hf, tmp_path, names, iters, limit=None):
    """lm-evaluation-harness's `hf` model on the folder `hf` (fp32, CPU, offline) over our task
    files `names` as custom tasks that include the harness's own task YAMLs; its results and
    n-samples."""
    harness_tasks = require_harness()
    tasks_dir = tmp_path / "tasks"
    tasks_dir.mkdir()
    for name, (base, split) in HARNESS_TASKS.items():
        (tasks_dir / f"{name}.yaml").write_text(textwrap.dedent(f"""\
            include: {harness_tasks / base}
            task: {name}
            tag: []
            dataset_path: json
            dataset_name: null
            dataset_kwargs:
              data_files:
                {split}: {EVAL / (name + '.jsonl')}
            training_split: null
            validation_split: {"validation" if split == "validation" else "null"}
            test_split: {"test" if split == "test" else "null"}
            """))
    (tasks_dir / "shakespeare_speaker.yaml").write_text(SPEAKER_YAML.format(path=EVAL / "shakespeare_speaker.jsonl"))

    out = tmp_path / "harness.json"
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_DATASETS_CACHE=str(tmp_path / "datasets_cache"), TOKENIZERS_PARALLELISM="false")
    # The harness's own entry point, simple_evaluate (the pinned 0.4.13's command line has no
    # --bootstrap_iters), in a child process so the offline switches hold from its first import.
    script = textwrap.dedent(f"""\
        import json
        from lm_eval import simple_evaluate
        from lm_eval.tasks import TaskManager
        r = simple_evaluate(model="hf", model_args="pretrained={hf},dtype=float32", device="cpu", batch_size=8,
                            tasks={sorted(names)!r}, bootstrap_iters={iters}, log_samples=False, limit={limit!r},
                            task_manager=TaskManager(include_path={str(tasks_dir)!r}))
        json.dump({{"results": r["results"], "n-samples": r["n-samples"]}}, open({str(out)!r}, "w"))
        """)
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=1800)
    assert done.returncode == 0, f"lm_eval failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return json.loads(out.read_text())


def assert_harness_numbers(harness, ours, names):
    """Loom's results equal the harness's: identical accuracies, the rest within 1e-4 relative,
    no metric of ours the harness lacks. Returns how many values were compared."""
    compared = 0
    for name in names:
        theirs, mine = harness["results"][name], ours["results"][name]
        assert harness["n-samples"][name]["effective"] == ours["n-samples"][name]["effective"]
        for key, value in theirs.items():
            if key == "alias" or key not in mine:
                continue
            if key.startswith("acc") and "stderr" not in key:
                assert mine[key] == value, (name, key, mine[key], value)
            elif value == "N/A":
                assert mine[key] == "N/A", (name, key)
            else:
                assert mine[key] == pytest.approx(value, rel=1e-4), (name, key, mine[key], value)
            compared += 1
        missing = {k for k in mine if k != "alias"} - set(theirs)
        assert not missing, (name, missing)
    return compared


def test_lm_evaluation_harness_gives_the_same_numbers(model, tmp_path):
    require_harness()
    hf = tmp_path / "hf"
    done = subprocess.run([str(loom_binary()), "convert", "--to", "hf", str(hf), "--checkpoint", str(model)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"loom convert --to hf failed:\n{done.stderr[-4000:]}"
    iters = 2000
    harness = run_harness(hf, tmp_path, TASKS, iters)
    loom_out = tmp_path / "loom.json"
    loom_eval(model, "--tasks", task_spec(), "--bootstrap-iters", iters, "--output", loom_out, "--batch-size", 8)
    compared = assert_harness_numbers(harness, json.loads(loom_out.read_text()), TASKS)
    assert compared == 4 + 4 + 4 + 6, compared  # lambada, two multiple-choice, wikitext: each metric and its stderr


def pathlib_of(module):
    import pathlib
    return pathlib.Path(module.__file__).parent


def test_rolling_windows_are_batched_and_their_cost_shown_before_scoring(model, tmp_path):
    page = tmp_path / "page.jsonl"
    page.write_text(json.dumps({"page": (ROOT / "data" / "tinyshakespeare.txt").read_text()[:20000]}) + "\n")
    out = tmp_path / "results.json"
    done = loom_eval(model, "--tasks", f"wikitext:{page}", "--max-length", 16, "--batch-size", 64, "--output", out,
                     "--log-samples")
    record = json.loads((tmp_path / "results_samples_page.jsonl").read_text().splitlines()[0])
    windows, tokens = record["windows"], record["tokens"]
    assert windows == -(-tokens // 16) and windows > 64  # every 16 tokens a window
    line = f"loom eval: {windows} requests in {-(-windows // 64)} batches of up to 64: {windows * 16} positions"
    assert line in done.stderr, done.stderr[-3000:]
    # The progress line appears before the first batch, the cost line before it.
    assert done.stderr.index(line) < done.stderr.index(f"loom eval: 0/{windows} requests"), done.stderr[-3000:]
