"""`loom finetune` (LoRA, docs/design/lora.md) end to end on a tiny frozen base trained for two
steps: every layout (t=2 with sequence parallelism, p=2, t=2 x p=2 with full recompute) trains
the same adapters as one process, loss by loss and weight by weight; only adapters are saved and
the base stays bit-identical; a resume continues exactly; `loom convert --merge-lora` writes
W + (alpha/r)·B A into a run that `loom generate` reads; bad peft fields are named before any
rank starts; Hugging Face `peft` loads the `--to peft` export over the `--to hf` export of the
base and gives the merged model's logits (GPT-2, and a Llama-family model imported from
transformers). The data is SFT records (tests/python/sft_helpers.py)."""
import json
import math
import subprocess

import pytest
import torch

from ptune_helpers import base_digests, directory_bytes, make_base
from sft_helpers import word_records, write_jsonl
from test_data_helpers import ROOT, loom_binary
from train_helpers import full_parameters, make_corpus, metrics, run_loom


def write_recipe(path, base_dir, train=None):
    """A LoRA recipe over `base_dir` training on the JSONL file `train` (None: the word task of
    sft_helpers, written beside the recipe)."""
    if train is None:
        train = write_jsonl(path.parent / "train.jsonl", word_records(40, 1))
    path.write_text(f"""trainer:
  devices: 1
  accelerator: cpu
  precision: 32
  max_steps: 4
  log_every_n_steps: 1
  val_check_interval: 4
  limit_val_batches: 1
exp_manager:
  checkpoint_callback_params:
    every_n_steps: 4
model:
  micro_batch_size: 2
  global_batch_size: 8
  restore_from_path: {base_dir}
  peft:
    peft_scheme: lora
    lora_tuning:
      target_modules: [all]
      adapter_dim: 4
      alpha: 8
      adapter_dropout: 0.1
  data:
    train_ds:
      file_names: [{train}]
      max_seq_length: 32
    validation_ds:
      file_names: [{train}]
  optim:
    lr: 1.0e-2
    sched:
      warmup_steps: 1
""")
    return path


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    corpus = make_corpus(tmp_path_factory)
    base = make_base(corpus, tmp_path_factory.mktemp("lora_base"))
    recipe = write_recipe(tmp_path_factory.mktemp("lora_recipe") / "lora.yaml", base)
    return {"base": base, "recipe": recipe, "base_bytes": directory_bytes(base / "checkpoints")}


def layout(run_dir, t=1, p=1, recompute=None):
    granularity = recompute or ("selective" if t > 1 else "null")
    return [f"trainer.devices={t * p}", f"exp_manager.explicit_log_dir={run_dir}",
            f"model.tensor_model_parallel_size={t}", f"model.pipeline_model_parallel_size={p}",
            f"model.sequence_parallel={'true' if t > 1 else 'false'}",
            f"model.activations_checkpoint_granularity={granularity}"]


def finetune(setup, overrides, *flags, check=True):
    return run_loom("finetune", setup["recipe"], overrides, *flags, check=check)


_reference = {}


def reference(setup, tmp_path_factory):
    if "run" not in _reference:
        run_dir = tmp_path_factory.mktemp("lora_reference")
        _reference["log"] = finetune(setup, layout(run_dir)).stderr
        _reference["run"] = run_dir
    return _reference["run"], _reference["log"]


def is_adapter(name):
    return ".lora_a." in name or ".lora_b." in name


@pytest.mark.parametrize("t,p,recompute", [(2, 1, None), (1, 2, None), (2, 2, "full")],
                         ids=["t2-sp", "p2", "t2p2-sp-full-recompute"])
def test_layout_trains_the_adapters_of_one_process(setup, tmp_path_factory, tmp_path, t, p, recompute):
    ref_dir, ref_log = reference(setup, tmp_path_factory)
    extra = ["model.activations_checkpoint_method=uniform", "model.activations_checkpoint_num_layers=1"] if recompute else []
    done = finetune(setup, layout(tmp_path, t, p, recompute) + extra)
    got, want = metrics(tmp_path), metrics(ref_dir)
    assert [r["step"] for r in got] == [1, 2, 3, 4]
    for g, w in zip(got, want):
        assert math.isclose(g["loss"], w["loss"], rel_tol=1e-5), (g["step"], g["loss"], w["loss"])
        assert math.isclose(g["grad_norm"], w["grad_norm"], rel_tol=1e-4), (g["step"], g["grad_norm"], w["grad_norm"])
    theirs, ours = full_parameters(ref_dir, 4), full_parameters(tmp_path, 4)
    assert sorted(ours) == sorted(theirs) and len(ours) == 4 * 2 * 4, sorted(ours)
    assert all(is_adapter(n) for n in ours)  # adapter checkpoints: the base is never written
    for name, tensor in theirs.items():
        torch.testing.assert_close(ours[name], tensor, rtol=1e-4, atol=1e-6, msg=name)
    # The base is frozen for real: the same checkpoint read, every rank's slice unchanged, its files untouched.
    whole, before, after = base_digests(done.stderr)
    assert whole and whole == base_digests(ref_log)[0], done.stderr[-3000:]
    assert before and sorted(before) == sorted(after), done.stderr[-3000:]
    assert directory_bytes(setup["base"] / "checkpoints") == setup["base_bytes"]


def test_adapters_learn_and_a_resume_is_exact(setup, tmp_path_factory, tmp_path):
    ref_dir, _ = reference(setup, tmp_path_factory)
    losses = [r["loss"] for r in metrics(ref_dir)]
    adapters = full_parameters(ref_dir, 4)
    assert any(t.abs().max() > 0 for n, t in adapters.items() if ".lora_b." in n)  # B moved off zero
    # Stopped after 2 steps, then resumed: the same adapters as the uninterrupted run.
    finetune(setup, layout(tmp_path), "--stop-after-steps", "2")
    done = finetune(setup, layout(tmp_path))
    assert "resumed from" in done.stderr
    assert [r["loss"] for r in metrics(tmp_path)][-2:] == pytest.approx(losses[-2:], rel=1e-6)
    for name, tensor in adapters.items():
        torch.testing.assert_close(full_parameters(tmp_path, 4)[name], tensor, rtol=0, atol=0, msg=name)
    # A resume with other adapters is refused: the checkpoint records them.
    bad = finetune(setup, layout(tmp_path) + ["trainer.max_steps=6", "model.peft.lora_tuning.adapter_dim=8"], check=False)
    assert bad.returncode != 0 and "lora" in bad.stderr, bad.stderr[-2000:]


def test_merged_run_holds_the_merged_weights_and_generates(setup, tmp_path_factory, tmp_path):
    ref_dir, _ = reference(setup, tmp_path_factory)
    merged = tmp_path / "merged"
    done = run_loom("convert", "--merge-lora", ["--checkpoint", str(ref_dir), "--output", str(merged)])
    assert "(16 linears)" in done.stderr, done.stderr
    base = full_parameters(setup["base"], 2)
    adapters = full_parameters(ref_dir, 4)
    out = full_parameters(merged, 0)
    assert sorted(n for n in out if n != "output_layer.weight") == sorted(n for n in base if n != "output_layer.weight")
    for name, w in base.items():
        linear = name[: -len(".weight")]
        if linear + ".lora_a.weight" in adapters:
            a, b = adapters[linear + ".lora_a.weight"], adapters[linear + ".lora_b.weight"]
            w = w + (8 / 4) * b @ a
        torch.testing.assert_close(out[name], w, rtol=1e-6, atol=1e-7, msg=name)
    # Bytes: a tiny model may stop inside a UTF-8 sequence.
    gen = subprocess.run([str(loom_binary()), "generate", "--checkpoint", str(merged), "--prompt", "ROMEO:", "--greedy",
                          "--max-new-tokens", "4"], cwd=ROOT, capture_output=True, timeout=300)
    assert gen.returncode == 0 and gen.stdout.startswith(b"ROMEO:"), gen.stderr[-2000:]
    scores = tmp_path / "eval.json"
    run_loom("eval", "--checkpoint", [str(merged), "--tasks", f"lambada:{ROOT / 'data' / 'eval' / 'shakespeare_lambada.jsonl'}",
                                      "--limit", "4", "--output", str(scores)])
    assert "lambada" in scores.read_text()
    # The merged run is its own run: training it continues it, in its own directory.
    assert f"explicit_log_dir: {merged}" in (merged / "config.yaml").read_text()
    base_iterations = sorted(p.name for p in (setup["base"] / "checkpoints").iterdir())
    run_loom("train", merged / "config.yaml", ["trainer.max_steps=1", "trainer.val_check_interval=1",
                                                "exp_manager.checkpoint_callback_params.every_n_steps=1"])
    assert (merged / "checkpoints" / "iter_0000001").is_dir()
    assert sorted(p.name for p in (setup["base"] / "checkpoints").iterdir()) == base_iterations
    # The adapter run itself is no model to run or export: every such command names the merge.
    for args in (["generate", "--checkpoint", str(ref_dir), "--prompt", "ROMEO:"],
                 ["convert", "--to", "hf", str(tmp_path / "hf"), "--checkpoint", str(ref_dir)]):
        refused = subprocess.run([str(loom_binary()), *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert refused.returncode == 2 and "loom convert --merge-lora --checkpoint" in refused.stderr, refused.stderr
    # Not an adapter checkpoint: named.
    bad = run_loom("convert", "--merge-lora", ["--checkpoint", str(setup["base"]), "--output", str(tmp_path / "x")],
                   check=False)
    assert bad.returncode == 2 and "not a LoRA adapter checkpoint" in bad.stderr, bad.stderr


@pytest.mark.parametrize("override,expected", [
    ("model.peft.lora_tuning.target_modules=[attention_qkv,mlp_fc3]", "model.peft.lora_tuning.target_modules"),
    ("model.peft.lora_tuning.adapter_dim=0", "model.peft.lora_tuning.adapter_dim"),
    ("model.peft.lora_tuning.alpha=-1", "model.peft.lora_tuning.alpha"),
    ("model.peft.lora_tuning.adapter_dropout=1.5", "model.peft.lora_tuning.adapter_dropout"),
    ("model.peft.peft_scheme=ia3", "model.peft.peft_scheme"),
    ("model.hidden_size=64", "not a key of a fine-tuning recipe"),
    ("model.restore_from_path=/nonexistent/run", "model.restore_from_path"),
])
def test_bad_input_is_named_before_any_rank_starts(setup, tmp_path, override, expected):
    done = finetune(setup, layout(tmp_path) + [override], check=False)
    assert done.returncode == 2, done.stderr[-2000:]
    assert expected in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "metrics.jsonl").exists()


def test_peft_loads_the_exported_adapter_with_the_merged_models_logits(setup, tmp_path_factory, tmp_path):
    from peft import PeftModel
    from transformers import GPT2LMHeadModel
    ref_dir, _ = reference(setup, tmp_path_factory)
    base_hf, merged_hf, adapter = tmp_path / "base_hf", tmp_path / "merged_hf", tmp_path / "peft"
    run_loom("convert", "--merge-lora", ["--checkpoint", str(ref_dir), "--output", str(tmp_path / "merged")])
    run_loom("convert", "--to", ["hf", str(merged_hf), "--checkpoint", str(tmp_path / "merged")])
    run_loom("convert", "--to", ["hf", str(base_hf), "--checkpoint", str(setup["base"])])
    done = run_loom("convert", "--to", ["peft", str(adapter), "--checkpoint", str(ref_dir), "--base-model", str(base_hf)])
    assert "16 modules" in done.stderr, done.stderr
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8 and config["fan_in_fan_out"] is True
    assert config["base_model_name_or_path"] == str(base_hf)
    adapted = PeftModel.from_pretrained(GPT2LMHeadModel.from_pretrained(base_hf), adapter).eval()
    from peft import AutoPeftModelForCausalLM  # finds the base by base_model_name_or_path
    auto = AutoPeftModelForCausalLM.from_pretrained(adapter).eval()
    merged = GPT2LMHeadModel.from_pretrained(merged_hf).eval()
    ids = torch.randint(0, 50257, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got, want = adapted(ids).logits, merged(ids).logits
        plain = GPT2LMHeadModel.from_pretrained(base_hf).eval()(ids).logits
        auto_got = auto(ids).logits
    assert (got - want).abs().max().item() < 1e-5
    assert (auto_got - want).abs().max().item() < 1e-5
    assert (plain - want).abs().max().item() > 1e-3  # the adapter changes the model


def test_peft_export_of_a_llama_adapter_has_the_merged_models_logits(tmp_path):
    """The Llama-family names: the fused QKV adapter as q/k/v_proj adapters sharing A (grouped-query
    attention: 2 K/V heads for 4 query heads), the SwiGLU fc1 adapter as gate/up_proj adapters."""
    from peft import PeftModel
    from test_convert_llama import random_llama
    from transformers import LlamaForCausalLM
    hf_dir, _ = random_llama(tmp_path, "llama_hf")
    base = tmp_path / "llama_base"
    run_loom("convert", "--from", ["hf", str(hf_dir), "--output", str(base)])
    # The records laid out with the base's own tokenizer (the imported tokenizer.json).
    recipe = write_recipe(tmp_path / "lora.yaml", base)
    run_dir = tmp_path / "llama_lora"
    run_loom("finetune", recipe, layout(run_dir) + ["trainer.max_steps=2", "trainer.val_check_interval=2",
                                                    "exp_manager.checkpoint_callback_params.every_n_steps=2"])
    merged, merged_hf, adapter = tmp_path / "merged", tmp_path / "merged_hf", tmp_path / "peft"
    run_loom("convert", "--merge-lora", ["--checkpoint", str(run_dir), "--output", str(merged)])
    run_loom("convert", "--to", ["hf", str(merged_hf), "--checkpoint", str(merged)])
    done = run_loom("convert", "--to", ["peft", str(adapter), "--checkpoint", str(run_dir)])
    assert "14 modules" in done.stderr, done.stderr  # 2 layers x (q, k, v, o, gate, up, down)
    adapted = PeftModel.from_pretrained(LlamaForCausalLM.from_pretrained(hf_dir), adapter).eval()
    want_model = LlamaForCausalLM.from_pretrained(merged_hf).eval()
    ids = torch.randint(0, want_model.config.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got, want = adapted(ids).logits, want_model(ids).logits
    assert (got - want).abs().max().item() < 1e-5
