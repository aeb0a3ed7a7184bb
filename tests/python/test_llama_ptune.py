"""README's Llama walkthrough, p-tuning part (docs/design/ptuning.md, docs/design/llama.md): a
Hugging Face LlamaForCausalLM imported with `loom convert --from hf` is the frozen base of a
p-tuning run that takes the base's own tokenizer; the run at t=2 × p=2 with SP on the stand-in
device (the GPU code path) equals the single-process CPU run (losses, gradient norms, validation,
the inference table), the base stays bit-identical, and `loom generate --prompt-checkpoint`
gives the same greedy answers at t=1 and t=2."""
import json
import os
import subprocess

from ptune_helpers import (METHODS, base_digests, directory_bytes, layout_overrides, run_ptune, write_recipe,
                           write_task)
from test_convert_llama import random_llama
from test_data_helpers import ROOT, loom_binary
from test_ptune import assert_same_run
from test_standin_lane import standin_library


def test_ptune_on_an_imported_llama_matches_single_process_on_the_standin(tmp_path):
    hf_dir, _ = random_llama(tmp_path, "llama-hf")
    base = tmp_path / "llama"
    imported = subprocess.run([str(loom_binary()), "convert", "--from", "hf", str(hf_dir), "--output", str(base)],
                              cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert imported.returncode == 0, imported.stderr
    base_bytes = directory_bytes(base / "checkpoints")
    train, valid = write_task(tmp_path / "task")
    recipe = write_recipe(tmp_path / "ptune.yaml", base, train, valid, gpt2_tokenizer=False)
    reference = tmp_path / "ref"
    ref_log = run_ptune(recipe, METHODS["tpmlp"] + layout_overrides(reference)).stderr
    shape = json.loads((reference / "checkpoints" / "iter_0000004" / "metadata.json").read_text())["layout"]["model"]
    assert (shape["normalization"], shape["activation"], shape["num_query_groups"]) == ("rmsnorm", "fast-swiglu", 2)

    run = tmp_path / "t2p2"
    done = subprocess.run([str(loom_binary()), "ptune", str(recipe), *METHODS["tpmlp"],
                           *layout_overrides(run, 2, 2, 1), "trainer.accelerator=gpu"],
                          cwd=ROOT, env={**os.environ, "LOOM_DEVICE_PLUGIN": str(standin_library())},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-6000:]
    assert "standin:" in done.stderr
    assert_same_run(run, reference)
    whole, before, after = base_digests(done.stderr)
    assert whole and whole == base_digests(ref_log)[0]
    assert before and sorted(before) == sorted(after)
    assert directory_bytes(base / "checkpoints") == base_bytes

    # Generation with the learnt prompt: greedy answers at t=2 are the single-process ones.
    answers = [generate(reference, valid, *layout) for layout in ([], ["--tensor-parallel", "2"])]
    assert len(answers[0]) == 16 and all(r["taskname"] == "mood" for r in answers[0])
    assert [r["prediction"] for r in answers[1]] == [r["prediction"] for r in answers[0]]


def generate(run_dir, records, *flags):
    done = subprocess.run([str(loom_binary()), "generate", "--prompt-checkpoint", str(run_dir), "--input", str(records),
                           "--greedy", "--max-new-tokens", "3", *flags], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads(l) for l in done.stdout.splitlines()]
