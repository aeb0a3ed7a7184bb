"""`loom generate --greedy` and `loom serve` (greedy /v1/completions) on Llama-family models
imported from Hugging Face give exactly the tokens of transformers' `generate` (greedy) on the
same weights: a tiny random LlamaForCausalLM (2 K/V heads for 4 query heads, untied output) and
a Qwen2ForCausalLM (Q/K/V biases, tied) and a Llama 3.1-style model (head_dim 16 != hidden / heads,
llama3 rope scaling), imported at t=2 so each rank holds one query group, and
decoded at t=1 and t=2. Serve batches prompts of different lengths, so each row's rotary
positions come from its own place in the cache."""
import subprocess

import pytest
import torch

from serve_helpers import Server
from test_convert import convert
from test_convert_llama import LLAMA31, random_llama
from test_data_helpers import ROOT, loom_binary

PROMPTS = ["The quick brown fox", "Once upon a time, in a land far", "To be"]
NEW = 12


@pytest.fixture(scope="module", params=["llama", "qwen2", "llama31"])
def imported(request, tmp_path_factory):
    """(Loom run imported at t=2, the transformers model, its tokenizer, the end-of-text id)."""
    from tokenizers import Tokenizer
    tmp = tmp_path_factory.mktemp(request.param)
    extra = LLAMA31 if request.param == "llama31" else {}
    hf_dir, model = random_llama(tmp, "hf", qwen2=request.param == "qwen2", **extra)
    run = tmp / "run"
    convert("--from", "hf", hf_dir, "--output", run, "--tensor-parallel", "2")
    tokenizer = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    return run, model, tokenizer, tokenizer.token_to_id("<|endoftext|>")


def byte_of_char():
    """GPT-2's byte-level alphabet inverted: the byte each of its 256 characters stands for."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{chr(b): b for b in printable}, **{chr(256 + n): b for n, b in enumerate(others)}}


def token_bytes(tokenizer, ids):
    """The bytes of byte-level BPE tokens: a random model's continuation may split UTF-8
    characters, which a text decode would replace."""
    table = byte_of_char()
    return b"".join(bytes(table[c] for c in tokenizer.id_to_token(i)) for i in ids)


def hf_greedy(model, ids, eod):
    """transformers' greedy continuation of `ids`: NEW tokens, or fewer and then `eod` (the end
    of text, which both stop at and neither prints)."""
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=NEW, do_sample=False, eos_token_id=eod,
                             pad_token_id=eod)
    return out[0, len(ids):].tolist()


def text_tokens(tokens, eod):
    return tokens[:tokens.index(eod)] if eod in tokens else tokens


@pytest.mark.parametrize("t", [1, 2])
def test_generate_greedy_equals_transformers(imported, t):
    run, model, tokenizer, eod = imported
    for prompt in PROMPTS:
        want = token_bytes(tokenizer, text_tokens(hf_greedy(model, tokenizer.encode(prompt).ids, eod), eod))
        done = subprocess.run([str(loom_binary()), "generate", "--checkpoint", str(run), "--prompt", prompt,
                               "--max-new-tokens", str(NEW), "--greedy", "--tensor-parallel", str(t)],
                              cwd=ROOT, capture_output=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:].decode(errors="replace")
        assert done.stdout == prompt.encode() + want + b"\n", (prompt, done.stdout, want)


def test_serve_greedy_completions_equal_transformers(imported):
    import requests
    run, model, tokenizer, eod = imported
    prompts = [tokenizer.encode(p).ids for p in PROMPTS]
    want = [hf_greedy(model, ids, eod) for ids in prompts]
    with Server(run, "--tensor-parallel", 2, "--max-batch", len(prompts)) as server:
        r = requests.post(server.url + "/v1/completions", timeout=300,
                          json={"prompt": prompts, "max_tokens": NEW, "temperature": 0})
        assert r.status_code == 200, r.text
        body = r.json()
        assert server.terminate() == 0
    assert body["usage"]["completion_tokens"] == sum(len(text_tokens(w, eod)) for w in want)
    for choice, tokens in zip(sorted(body["choices"], key=lambda c: c["index"]), want):
        # JSON text: bytes that split a UTF-8 character read as U+FFFD, as Python replaces them.
        assert choice["text"] == token_bytes(tokenizer, text_tokens(tokens, eod)).decode(errors="replace")
        assert choice["finish_reason"] == ("stop" if eod in tokens else "length")
