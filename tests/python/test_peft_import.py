"""`loom convert --from peft` (docs/design/lora.md, "PEFT export and import"): adapters made by
Hugging Face `peft` (random A and B) over a model imported with `--from hf` become a Loom adapter
checkpoint whose merged model (`--merge-lora`, exported with `--to hf`) gives the PEFT model's
logits within 1e-5: GPT-2's Conv1D modules (fan_in_fan_out), and a Llama whose q_proj and v_proj
have their own A (stacked into the fused QKV adapter), rsLoRA's scale and adapters on one layer
only. A GPT-2 adapter survives import then `--to peft` tensor for tensor; what Loom's adapters
cannot represent is refused naming the field or tensor."""
import copy
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from test_convert import convert, random_gpt2
from test_convert_llama import random_llama


def peft_adapter(model, out, **settings):
    """A PEFT LoRA adapter of `model` with random A and B (init_lora_weights=False), saved to `out`;
    returns the PeftModel."""
    from peft import LoraConfig, get_peft_model
    torch.manual_seed(3)
    adapted = get_peft_model(copy.deepcopy(model), LoraConfig(init_lora_weights=False, **settings)).eval()
    adapted.save_pretrained(out)
    return adapted


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def import_and_merge(tmp_path, base, adapter):
    """--from peft over the Loom run `base`, --merge-lora, --to hf: the merged model's HF
    directory and the import's message."""
    adapters, merged, merged_hf = (tmp_path / n for n in ("adapters", "merged", "merged_hf"))
    done = convert("--from", "peft", adapter, "--base", base, "--output", adapters)
    convert("--merge-lora", "--checkpoint", adapters, "--output", merged)
    convert("--to", "hf", merged_hf, "--checkpoint", merged)
    return merged_hf, done.stderr


@pytest.fixture(scope="module")
def gpt2_adapter(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("peft_gpt2")
    hf_dir, model = random_gpt2(tmp)
    adapted = peft_adapter(model, tmp / "adapter", r=4, lora_alpha=8, target_modules=["c_attn", "c_fc"],
                           fan_in_fan_out=True)
    convert("--from", "hf", hf_dir, "--output", tmp / "base")
    return hf_dir, tmp / "adapter", adapted, tmp / "base"


def test_a_gpt2_adapter_from_peft_gives_the_peft_models_logits(gpt2_adapter, tmp_path):
    from transformers import GPT2LMHeadModel
    hf_dir, adapter, adapted, base = gpt2_adapter
    merged_hf, message = import_and_merge(tmp_path, base, adapter)
    assert "4 modules" in message and "rank-4" in message, message
    ids = torch.randint(0, 50257, (2, 24), generator=torch.Generator().manual_seed(0))
    want = logits(adapted, ids)
    got = logits(GPT2LMHeadModel.from_pretrained(merged_hf).eval(), ids)
    plain = logits(GPT2LMHeadModel.from_pretrained(hf_dir).eval(), ids)
    assert (got - want).abs().max().item() < 1e-5
    assert (plain - want).abs().max().item() > 1e-3  # the adapter changes the model


def test_a_llama_adapter_with_own_q_and_v_matrices_rslora_and_one_layer(tmp_path):
    """q_proj and v_proj have distinct A: the fused QKV adapter stacks them (rank 8 from r = 4)."""
    from transformers import LlamaForCausalLM
    hf_dir, model = random_llama(tmp_path, "llama_hf")
    adapted = peft_adapter(model, tmp_path / "adapter", r=4, lora_alpha=16, use_rslora=True,
                           target_modules=["q_proj", "v_proj", "down_proj"], layers_to_transform=[1])
    convert("--from", "hf", hf_dir, "--output", tmp_path / "base")
    merged_hf, message = import_and_merge(tmp_path, tmp_path / "base", tmp_path / "adapter")
    assert "3 modules" in message and "rank-8" in message, message
    ids = torch.randint(0, model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    want = logits(adapted, ids)
    got = logits(LlamaForCausalLM.from_pretrained(merged_hf).eval(), ids)
    assert (got - want).abs().max().item() < 1e-5
    assert (logits(model, ids) - want).abs().max().item() > 1e-3


def test_import_then_export_gives_back_peft_tensors(gpt2_adapter, tmp_path):
    _, adapter, _, base = gpt2_adapter
    convert("--from", "peft", adapter, "--base", base, "--output", tmp_path / "adapters")
    convert("--to", "peft", tmp_path / "again", "--checkpoint", tmp_path / "adapters")
    want, got = load_file(adapter / "adapter_model.safetensors"), load_file(tmp_path / "again" / "adapter_model.safetensors")
    assert sorted(got) == sorted(want)
    for name in want:
        assert torch.equal(got[name], want[name]), name
    config = json.loads((tmp_path / "again" / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8 and sorted(config["target_modules"]) == ["attn.c_attn", "mlp.c_fc"]


def edit_config(adapter, **fields):
    config = json.loads((adapter / "adapter_config.json").read_text())
    config.update(fields)
    (adapter / "adapter_config.json").write_text(json.dumps(config))


def add_lm_head_adapter(adapter):
    tensors = load_file(adapter / "adapter_model.safetensors")
    tensors["base_model.model.lm_head.lora_A.weight"] = torch.zeros(4, 32)
    save_file(tensors, adapter / "adapter_model.safetensors")


def shrink_a_b(adapter):
    tensors = load_file(adapter / "adapter_model.safetensors")
    name = "base_model.model.transformer.h.1.mlp.c_fc.lora_B.weight"
    tensors[name] = tensors[name][:50].contiguous()
    save_file(tensors, adapter / "adapter_model.safetensors")


@pytest.mark.parametrize("edit, needle", [
    (lambda a: edit_config(a, use_dora=True), "use_dora is true: DoRA"),
    (lambda a: edit_config(a, bias="lora_only"), "bias is \"lora_only\""),
    (lambda a: edit_config(a, peft_type="IA3"), "peft_type is \"IA3\", expected \"LORA\""),
    (lambda a: edit_config(a, rank_pattern={"c_fc": 8}), "rank_pattern"),
    (lambda a: edit_config(a, use_rslora="yes"), "use_rslora must be true or false"),
    (lambda a: edit_config(a, peft_type=3), "peft_type is 3, expected \"LORA\""),
    (lambda a: (a / "adapter_config.json").unlink(), "adapter_config.json does not exist"),
    (add_lm_head_adapter, "base_model.model.lm_head.lora_A.weight adapts no linear"),
    (shrink_a_b, "[50, 4], expected a floating tensor [96, 4]"),
])
def test_what_loom_cannot_represent_is_named(gpt2_adapter, tmp_path, edit, needle):
    _, adapter, _, base = gpt2_adapter
    bad = tmp_path / "adapter"
    shutil.copytree(adapter, bad)
    edit(bad)
    done = convert("--from", "peft", bad, "--base", base, "--output", tmp_path / "out", check=False)
    assert done.returncode == 2 and needle in done.stderr, done.stderr
    assert not (tmp_path / "out" / "checkpoints").exists()


def test_flags_are_checked(gpt2_adapter, tmp_path):
    _, adapter, _, _ = gpt2_adapter
    done = convert("--from", "peft", adapter, "--output", tmp_path / "out", check=False)
    assert done.returncode == 2 and "--from peft DIR needs --base RUN" in done.stderr, done.stderr
    done = convert("--to", "hf", tmp_path / "x", "--checkpoint", tmp_path, "--base", tmp_path, check=False)
    assert done.returncode == 2 and "--base goes with --from peft only" in done.stderr, done.stderr
    done = convert("--from", "hf", tmp_path, "--output", tmp_path / "x", "--base-model", "gpt2", check=False)
    assert done.returncode == 2 and "--base-model goes with --to peft only" in done.stderr, done.stderr
