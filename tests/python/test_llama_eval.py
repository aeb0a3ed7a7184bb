"""`loom eval` on a Llama-family model equals lm-evaluation-harness's `hf` model on its Hugging
Face export: a tiny random LlamaForCausalLM (grouped-query attention, untied output, a
tokenizer.json) imported at t=2, scored by `loom eval` at the run's layout, and its `loom convert
--to hf` folder scored by the harness over the same task files (test_eval.py's custom tasks),
the first LIMIT documents of each: identical accuracies, the rest within 1e-4 relative."""
import json

from test_convert import convert
from test_convert_llama import random_llama
from test_eval import TASKS, assert_harness_numbers, loom_eval, require_harness, run_harness, task_spec

LIMIT = 24


def test_llama_eval_equals_the_harness_on_the_export(tmp_path):
    require_harness()
    hf_dir, _ = random_llama(tmp_path, "hf_llama")
    run = tmp_path / "run"
    convert("--from", "hf", hf_dir, "--output", run, "--tensor-parallel", "2")
    export = tmp_path / "export"
    convert("--to", "hf", export, "--checkpoint", run)
    iters = 1000
    harness = run_harness(export, tmp_path, TASKS, iters, limit=LIMIT)
    out = tmp_path / "loom.json"
    loom_eval(run, "--tasks", task_spec(), "--limit", LIMIT, "--bootstrap-iters", iters, "--output", out,
              "--batch-size", 8)
    ours = json.loads(out.read_text())
    assert all(ours["n-samples"][name]["effective"] == LIMIT for name in TASKS)
    assert assert_harness_numbers(harness, ours, TASKS) == 4 + 4 + 4 + 6
