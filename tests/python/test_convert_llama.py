"""`loom convert` with Llama-family models (docs/design/llama.md): a LlamaForCausalLM of a tiny
random LlamaConfig built by transformers (grouped-query attention, an untied output layer, a
tokenizer.json) imported at t=2 p=2 with transformers' fp32 logits within 1e-5; exported back
bit-identical (HF -> Loom -> HF) and loading in transformers with Loom's logits; tied
embeddings with plain multi-head attention; Qwen2ForCausalLM (Q/K/V biases, model.qkv_bias) the
same ways, tied and untied; and config.json fields Loom cannot represent refused naming the field."""
import json
import shutil
import subprocess

import pytest
import torch
from safetensors.torch import load_file

from test_convert import convert, loom_logits
from test_data_helpers import ROOT, loom_binary
from test_data_tokenizers_more import train_hf

IDS = [5, 17, 250, 3, 99, 1000, 42, 7, 12, 0, 480, 31]
# Llama 3.1's rope scaling with a short original context, so that at head_dim 16 and base 1000
# the frequencies fall in all three bands (kept, interpolated, divided by the factor).
LLAMA31 = {"head_dim": 16, "rope_scaling": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                                            "high_freq_factor": 4.0, "original_max_position_embeddings": 32}}


def random_llama(tmp_path, name, kv_heads=2, tie=False, qwen2=False, mistral=False, **extra):
    """A LlamaForCausalLM (Qwen2ForCausalLM with `qwen2`, MistralForCausalLM with `mistral`) of a
    random config saved with save_pretrained, a byte-level BPE tokenizer.json (trained here) of the
    model's vocabulary beside it. `extra`: more config fields."""
    import transformers
    family = "Qwen2" if qwen2 else "Mistral" if mistral else "Llama"
    config_class = getattr(transformers, family + "Config")
    model_class = getattr(transformers, family + "ForCausalLM")
    out = tmp_path / name
    out.mkdir()
    tokenizer = train_hf("llama3", False)
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                           "eos_token": "<|endoftext|>"}))
    torch.manual_seed(11)
    config = config_class(vocab_size=tokenizer.get_vocab_size(), hidden_size=32, intermediate_size=48,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=kv_heads,
                          max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=1000.0,
                          tie_word_embeddings=tie, attention_dropout=0.0, **extra)
    model = model_class(config).eval()
    # RMSNorm weights away from 1 and Qwen2's Q/K/V biases away from 0, so a misplaced norm or
    # bias shows.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(out)
    return out, model


def hf_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def assert_transformers_logits(run, model, tmp_path):
    """The imported run's fp32 logits equal the HF model's within 1e-5; returns Loom's."""
    ours = loom_logits(run, IDS, tmp_path)
    want = hf_logits(model, IDS)
    assert ours.shape == want.shape
    assert (ours - want).abs().max().item() <= 1e-5, (ours - want).abs().max().item()
    return ours


def export_bit_identical(run, hf_dir, tmp_path):
    """`loom convert --to hf` of the run writes the imported tensors back bit for bit (names,
    dtypes, values); returns the export's folder and its config.json."""
    back = tmp_path / "back"
    convert("--to", "hf", back, "--checkpoint", run)
    got, orig = load_file(str(back / "model.safetensors")), load_file(str(hf_dir / "model.safetensors"))
    assert sorted(got) == sorted(orig)
    for name in orig:
        assert got[name].dtype == orig[name].dtype, name
        assert torch.equal(got[name], orig[name]), name
    return back, json.loads((back / "config.json").read_text())


def test_import_gqa_untied_llama_has_transformers_logits_and_exports_bit_identical(tmp_path):
    from transformers import LlamaForCausalLM
    hf_dir, model = random_llama(tmp_path, "hf_llama")
    run = tmp_path / "imported"
    convert("--from", "hf", hf_dir, "--output", run, "--tensor-parallel", "2", "--pipeline-parallel", "2")
    recipe = (run / "config.yaml").read_text()
    for line in ("normalization: rmsnorm", "position_embedding_type: rope", "activation: fast-swiglu",
                 "num_query_groups: 2", "bias: false", "share_embeddings_and_output_weights: false",
                 "library: huggingface"):
        assert line in recipe, line
    assert (run / "tokenizer" / "tokenizer.json").read_bytes() == (hf_dir / "tokenizer.json").read_bytes()
    assert (run / "tokenizer" / "tokenizer_config.json").is_file()
    ours = assert_transformers_logits(run, model, tmp_path)

    # HF -> Loom -> HF: the same tensors, bit for bit, and transformers loads the folder.
    back, config = export_bit_identical(run, hf_dir, tmp_path)
    assert config["num_key_value_heads"] == 2 and config["tie_word_embeddings"] is False
    assert (back / "tokenizer.json").read_bytes() == (hf_dir / "tokenizer.json").read_bytes()
    reloaded = LlamaForCausalLM.from_pretrained(back, local_files_only=True).eval()
    exported = hf_logits(reloaded, IDS)
    assert (exported - ours).abs().max().item() <= 1e-5


def test_import_tied_multi_head_llama_has_transformers_logits(tmp_path):
    hf_dir, model = random_llama(tmp_path, "hf_tied", kv_heads=4, tie=True)
    run = tmp_path / "imported"
    convert("--from", "hf", hf_dir, "--output", run, "--tensor-parallel", "2")
    assert_transformers_logits(run, model, tmp_path)
    export_bit_identical(run, hf_dir, tmp_path)


def test_head_dim_and_llama31_rope_scaling_have_transformers_logits_both_ways(tmp_path):
    from transformers import LlamaForCausalLM
    hf_dir, model = random_llama(tmp_path, "hf_llama31", **LLAMA31)
    assert model.model.layers[0].self_attn.q_proj.weight.shape == (4 * 16, 32)  # a·d = 64 != hidden 32
    run = tmp_path / "imported"
    convert("--from", "hf", hf_dir, "--output", run, "--tensor-parallel", "2", "--pipeline-parallel", "2")
    recipe = (run / "config.yaml").read_text()
    for line in ("kv_channels: 16", "rope_scaling: true", "rope_scaling_factor: 4", "old_context_len: 32"):
        assert line in recipe, line
    ours = assert_transformers_logits(run, model, tmp_path)
    want = hf_logits(model, IDS)
    # Without the scaling the logits differ: the test sees it.
    plain, _ = random_llama(tmp_path, "hf_plain", head_dim=16)
    assert (hf_logits(LlamaForCausalLM.from_pretrained(plain, local_files_only=True).eval(), IDS) - want).abs().max() > 1e-4

    back, config = export_bit_identical(run, hf_dir, tmp_path)
    assert config["head_dim"] == 16 and config["rope_parameters"]["rope_type"] == "llama3"
    reloaded = LlamaForCausalLM.from_pretrained(back, local_files_only=True).eval()
    assert reloaded.config.rope_parameters["original_max_position_embeddings"] == 32
    assert (hf_logits(reloaded, IDS) - ours).abs().max().item() <= 1e-5


@pytest.mark.parametrize("tie,layout", [(False, ("--tensor-parallel", "2", "--pipeline-parallel", "2")),
                                        (True, ("--tensor-parallel", "2"))])
def test_qwen2_imports_with_transformers_logits_and_exports_bit_identical(tmp_path, tie, layout):
    from transformers import Qwen2ForCausalLM
    hf_dir, model = random_llama(tmp_path, "hf_qwen2", tie=tie, qwen2=True)
    assert "model.layers.0.self_attn.q_proj.bias" in load_file(str(hf_dir / "model.safetensors"))
    run = tmp_path / "imported"
    convert("--from", "hf", hf_dir, "--output", run, *layout)
    recipe = (run / "config.yaml").read_text()
    for line in ("bias: false", "qkv_bias: true", "num_query_groups: 2",
                 f"share_embeddings_and_output_weights: {'true' if tie else 'false'}"):
        assert line in recipe, line
    ours = assert_transformers_logits(run, model, tmp_path)

    back, config = export_bit_identical(run, hf_dir, tmp_path)
    assert config["model_type"] == "qwen2" and config["architectures"] == ["Qwen2ForCausalLM"]
    assert config["tie_word_embeddings"] is tie
    reloaded = Qwen2ForCausalLM.from_pretrained(back, local_files_only=True).eval()
    assert (hf_logits(reloaded, IDS) - ours).abs().max().item() <= 1e-5


def test_qwen2_sliding_window_refused_naming_the_field(tmp_path):
    hf_dir, _ = random_llama(tmp_path, "hf_qwen2", qwen2=True)
    config = json.loads((hf_dir / "config.json").read_text())
    config["use_sliding_window"] = True
    (hf_dir / "config.json").write_text(json.dumps(config))
    done = convert("--from", "hf", hf_dir, "--output", tmp_path / "run", check=False)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "config.json" in done.stderr and "use_sliding_window" in done.stderr, done.stderr[-3000:]


def test_mistral_imports_with_transformers_logits_and_exports_as_the_llama_it_equals(tmp_path):
    """A MistralForCausalLM whose sliding window covers its whole context (64 positions: every
    query sees all its causal keys) is Llama's model: transformers' logits over the full 64
    positions in, the same tensors out as a LlamaForCausalLM with those logits."""
    from transformers import LlamaForCausalLM
    hf_dir, model = random_llama(tmp_path, "hf_mistral", mistral=True, sliding_window=64)
    assert model.config.model_type == "mistral"
    run = tmp_path / "imported"
    convert("--from", "hf", hf_dir, "--output", run, "--tensor-parallel", "2")
    ids = (IDS * 8)[:64]
    ours = loom_logits(run, ids, tmp_path)
    assert (ours - hf_logits(model, ids)).abs().max().item() <= 1e-5
    back, config = export_bit_identical(run, hf_dir, tmp_path)
    assert config["architectures"] == ["LlamaForCausalLM"]
    reloaded = LlamaForCausalLM.from_pretrained(back, local_files_only=True).eval()
    assert (hf_logits(reloaded, ids) - ours).abs().max().item() <= 1e-5


@pytest.mark.parametrize("edit,needle", [
    ({"sliding_window": 63}, "sliding_window 63 is shorter than max_position_embeddings 64"),
    # No key: transformers' MistralConfig default of 4096.
    ({"sliding_window": None, "max_position_embeddings": 8192}, "sliding_window 4096 is shorter than "
                                                                "max_position_embeddings 8192"),
])
def test_mistral_window_shorter_than_the_context_refused_naming_the_field(tmp_path, edit, needle):
    hf_dir, _ = random_llama(tmp_path, "hf_mistral", mistral=True, sliding_window=None)
    config = json.loads((hf_dir / "config.json").read_text())
    for key, value in edit.items():
        if value is None:
            config.pop(key)
        else:
            config[key] = value
    (hf_dir / "config.json").write_text(json.dumps(config))
    done = convert("--from", "hf", hf_dir, "--output", tmp_path / "run", check=False)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "config.json: " + needle in done.stderr, done.stderr[-3000:]
    assert not (tmp_path / "run" / "checkpoints").exists()


def sentencepiece_llama(tmp_path):
    """A LlamaForCausalLM with a SentencePiece tokenizer as Llama 2, Mistral 7B and TinyLlama
    ship it: tokenizer.model (BPE with byte fallback, trained here) and the tokenizer.json
    transformers converts from it (byte_fallback: not byte-level BPE)."""
    import sentencepiece
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaTokenizerFast
    out = tmp_path / "hf_sp"
    out.mkdir()
    lines = (ROOT / "data" / "tinyshakespeare.txt").read_text()[:100000].splitlines()
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_prefix=str(out / "tokenizer"),
                                             vocab_size=600, model_type="bpe", byte_fallback=True, unk_id=0, bos_id=1,
                                             eos_id=2, pad_id=-1, character_coverage=1.0, minloglevel=2)
    (out / "tokenizer.vocab").unlink()
    tokenizer = LlamaTokenizerFast.from_pretrained(out, local_files_only=True)
    tokenizer.save_pretrained(out)
    assert json.loads((out / "tokenizer.json").read_text())["model"]["byte_fallback"] is True
    torch.manual_seed(13)
    config = LlamaConfig(vocab_size=600, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, bos_token_id=1,
                         eos_token_id=2)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(out)
    return out, model, tokenizer


def test_a_sentencepiece_llama_imports_generates_and_exports_its_tokenizer(tmp_path):
    import sentencepiece
    from transformers import AutoTokenizer
    hf_dir, model, tokenizer = sentencepiece_llama(tmp_path)
    run = tmp_path / "imported"
    convert("--from", "hf", hf_dir, "--output", run, "--tensor-parallel", "2")
    assert "library: sentencepiece" in (run / "config.yaml").read_text()
    prompt = "ROMEO: But soft, what light"
    ids = tokenizer(prompt)["input_ids"]
    assert ids and ids[0] != 1  # no BOS: Loom's ids are SentencePiece's encode
    ours = loom_logits(run, ids, tmp_path)
    assert (ours - hf_logits(model, ids)).abs().max().item() <= 1e-5
    with torch.no_grad():
        want = model.generate(torch.tensor([ids]), max_new_tokens=10, do_sample=False, eos_token_id=2, pad_token_id=2)
    done = subprocess.run([str(loom_binary()), "generate", "--checkpoint", str(run), "--prompt", prompt,
                           "--max-new-tokens", "10", "--greedy"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    # SentencePiece's own decoding of transformers' tokens (transformers renders an ill-formed run
    # of byte-fallback tokens with one U+FFFD per byte, SentencePiece per maximal subpart).
    sp = sentencepiece.SentencePieceProcessor(model_file=str(hf_dir / "tokenizer.model"))
    assert done.stdout == sp.decode([i for i in want[0].tolist() if i != 2]) + "\n", done.stdout

    back, _ = export_bit_identical(run, hf_dir, tmp_path)
    for f in ("tokenizer.model", "tokenizer.json", "tokenizer_config.json"):
        assert (back / f).read_bytes() == (hf_dir / f).read_bytes(), f
    assert AutoTokenizer.from_pretrained(back, local_files_only=True)(prompt)["input_ids"] == ids


@pytest.mark.parametrize("field,value,needle", [
    ("rope_parameters", {"rope_type": "yarn", "rope_theta": 500000.0, "factor": 8.0}, "rope_parameters.rope_type"),
    ("rope_parameters", {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0}, "low_freq_factor"),
    ("hidden_act", "gelu", "hidden_act"),
    ("attention_bias", True, "attention_bias"),
    ("head_dim", 16, "q_proj.weight has shape [32, 32], expected [64, 32]"),
])
def test_import_unrepresentable_llama_config_named(tmp_path, field, value, needle):
    hf_dir, _ = random_llama(tmp_path, "hf_bad")
    config = json.loads((hf_dir / "config.json").read_text())
    config[field] = value
    (hf_dir / "config.json").write_text(json.dumps(config))
    done = convert("--from", "hf", hf_dir, "--output", tmp_path / "run", check=False)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "config.json" in done.stderr and needle in done.stderr, done.stderr[-3000:]
    assert not (tmp_path / "run" / "checkpoints").exists()
