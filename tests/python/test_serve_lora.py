"""`loom serve --lora NAME=DIR ...` (docs/serving.md, "LoRA adapters"): a tiny base and two
adapters trained on it by `loom finetune` (different ranks and targets) served together. Greedy
requests of the base and both adapters sent at once (completions, streamed completions, chat
completions, through the openai client) give exactly the tokens of the base served alone and of
each adapter folded into its base by `loom convert --merge-lora` and served alone, at t=1 and
at t=2 x p=2 (CPU ranks), and with speculative decoding (n-gram drafts, or the base as an
adapter-free draft model); /metrics shows that requests of several models shared a forward;
/v1/models lists the base and the adapters; an unknown model gets 404 naming the served ones;
the prefix cache keeps each model's blocks apart; bad --lora flags and adapters of another
checkpoint are refused before serving, naming them."""
import concurrent.futures
import subprocess

import openai
import pytest
import requests

from ptune_helpers import make_base
from serve_helpers import Server
from test_data_helpers import ROOT, loom_binary
from test_finetune_lora import write_recipe
from train_helpers import make_corpus, run_loom

# The last prompt fills a 16-position KV block: sent to each model in turn, it shows that the
# prefix cache keeps each model's keys and values apart (a block of the base's reused by an
# adapter would change the adapter's answer).
LONG = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\n"
PROMPTS = ["ROMEO:", "First Citizen:\nBefore we", "O", "What light through", LONG]
MAX_TOKENS = 10
# A plain template: the messages' contents one after another (the tiny run ships none).
TEMPLATE = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
MESSAGES = [{"role": "user", "content": "KING HENRY:"}]
# Two adapters: every linear at rank 4, and the QKV and fc2 linears at rank 2 (another lr).
ADAPTERS = {
    "shy": ["model.peft.lora_tuning.adapter_dim=4", "model.peft.lora_tuning.alpha=8", "model.optim.lr=0.1"],
    "bold": ["model.peft.lora_tuning.adapter_dim=2", "model.peft.lora_tuning.alpha=6",
             "model.peft.lora_tuning.target_modules=[attention_qkv,mlp_fc2]", "model.optim.lr=0.05"],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    corpus = make_corpus(tmp_path_factory)
    base = make_base(corpus, tmp_path_factory.mktemp("lora_serve_base") / "base")
    recipe = write_recipe(tmp_path_factory.mktemp("lora_serve_recipe") / "lora.yaml", base)
    template = tmp_path_factory.mktemp("lora_serve_chat") / "chat.jinja"
    template.write_text(TEMPLATE)
    out = {"base": base, "template": template, "adapters": {}, "merged": {}}
    for name, overrides in ADAPTERS.items():
        run = tmp_path_factory.mktemp(f"lora_{name}") / name
        run_loom("finetune", recipe, [f"exp_manager.explicit_log_dir={run}",
                                      "model.peft.lora_tuning.adapter_dropout=0.0", *overrides])
        merged = tmp_path_factory.mktemp(f"merged_{name}") / name
        run_loom("convert", "--merge-lora", ["--checkpoint", str(run), "--output", str(merged)])
        out["adapters"][name], out["merged"][name] = run, merged
    return out


def lora_flags(runs):
    return [f for name, run in runs["adapters"].items() for f in ("--lora", f"{name}={run}")]


def ask(url, model, kind, prompt=None):
    """One greedy request of `kind` (completion, stream, chat): the generated text and the
    model the response names."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
    if kind == "chat":
        out = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0)
        return out.choices[0].message.content, out.model
    if kind == "stream":
        chunks = list(client.completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                                stream=True))
        assert len({c.model for c in chunks}) == 1
        return "".join(c.choices[0].text for c in chunks if c.choices), chunks[0].model
    out = client.completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)
    return out.choices[0].text, out.model


def long_logprobs(url, model):
    """LONG's greedy continuation and its tokens' log-probabilities (they show a reused block of
    another model's keys and values, which the tiny models' texts may not)."""
    r = requests.post(url + "/v1/completions", json={"model": model, "prompt": LONG, "max_tokens": MAX_TOKENS,
                                                     "temperature": 0, "logprobs": 0}, timeout=120)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return choice["text"], choice["logprobs"]["token_logprobs"]


def jobs(models):
    """Every (model, kind, prompt) a test sends: each prompt as a completion, the first two
    streamed too, and one chat."""
    out = []
    for model in models:
        out += [(model, "completion", p) for p in PROMPTS]
        out += [(model, "stream", p) for p in PROMPTS[:2]]
        out.append((model, "chat", None))
    return out


def alone(runs, checkpoint, model_name):
    """The answers of `checkpoint` served alone (no adapters), one request at a time."""
    with Server(checkpoint, "--model-name", model_name, "--chat-template", runs["template"]) as s:
        out = {(model_name, kind, p): ask(s.url, model_name, kind, p)[0] for _, kind, p in jobs([model_name])}
        out[(model_name, "logprobs")] = long_logprobs(s.url, model_name)
        return out


@pytest.fixture(scope="module")
def expected(runs):
    out = alone(runs, runs["base"], "base")
    for name, merged in runs["merged"].items():
        out.update(alone(runs, merged, name))
    # The adapters moved off the base: otherwise equality with the merged models would prove nothing.
    for name in ADAPTERS:
        assert any(out[(name, k, p)] != out[("base", k, p)] for _, k, p in jobs(["base"])), name
    assert any(out[("shy", k, p)] != out[("bold", k, p)] for _, k, p in jobs(["base"]))
    return out


def metric(url, name):
    for line in requests.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(name + " not in /metrics")


def served_together(runs, expected, *layout):
    with Server(runs["base"], "--model-name", "base", "--chat-template", runs["template"], "--max-batch", 32,
                *lora_flags(runs), *layout) as s:
        for model in ["base", *ADAPTERS]:  # one after another: each could reuse the blocks of the one before
            text, logprobs = long_logprobs(s.url, model)
            want_text, want_logprobs = expected[(model, "logprobs")]
            assert text == want_text, model
            assert logprobs == pytest.approx(want_logprobs, abs=1e-4), model
        todo = jobs(["base", *ADAPTERS])
        with concurrent.futures.ThreadPoolExecutor(len(todo)) as pool:
            got = list(pool.map(lambda j: ask(s.url, *j), todo))
        for job, (text, model) in zip(todo, got):
            assert model == job[0]
            assert text == expected[job], job
        assert metric(s.url, "loom:prefix_cache_hits_total") >= 16  # LONG's first block, per model
        counters = {name: metric(s.url, name) for name in
                    ["loom:lora_mixed_steps_total", "loom:spec_decode_num_draft_tokens_total"]}
        assert s.terminate() == 0
    return counters


def test_adapters_and_base_batched_together_answer_as_the_merged_models(runs, expected):
    # Requests of several models shared forwards.
    assert served_together(runs, expected)["loom:lora_mixed_steps_total"] > 0


def test_at_t2_p2_too(runs, expected):
    assert served_together(runs, expected, "--tensor-parallel", 2, "--pipeline-parallel", 2)[
        "loom:lora_mixed_steps_total"] > 0


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_with_speculative_decoding_too(runs, expected, method):
    """Prompt-lookup drafts, or the base as a draft model (it runs without adapters; the adapted
    model verifies its drafts): the same greedy answers."""
    flags = ["--speculative-method", method, "--num-speculative-tokens", 3]
    if method == "draft":
        flags += ["--draft-checkpoint", runs["base"]]
    counters = served_together(runs, expected, *flags)
    assert counters["loom:lora_mixed_steps_total"] > 0 and counters["loom:spec_decode_num_draft_tokens_total"] > 0


def test_models_listed_and_an_unknown_model_refused(runs):
    with Server(runs["base"], "--model-name", "base", *lora_flags(runs)) as s:
        models = requests.get(s.url + "/v1/models", timeout=10).json()["data"]
        assert [m["id"] for m in models] == ["base", *ADAPTERS]
        assert [m["parent"] for m in models] == [None, "base", "base"]
        r = requests.post(s.url + "/v1/completions", json={"model": "shyy", "prompt": "O", "max_tokens": 2},
                          timeout=30)
        assert r.status_code == 404 and "'base', 'shy', 'bold'" in r.text and "shyy" in r.text, r.text


def serve_fails(checkpoint, *flags):
    done = subprocess.run([str(loom_binary()), "serve", "--checkpoint", str(checkpoint), "--port", "0", *map(str, flags)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    return done.stderr


def test_bad_lora_flags_are_refused_naming_them(runs):
    shy = runs["adapters"]["shy"]
    assert "--lora shy: expected NAME=DIR" in serve_fails(runs["base"], "--lora", "shy")
    assert "--lora =x: expected NAME=DIR" in serve_fails(runs["base"], "--lora", "=x")
    err = serve_fails(runs["base"], "--lora", f"a={shy}", "--lora", f"a={runs['adapters']['bold']}")
    assert "given to two adapters" in err and "--lora a=" in err
    assert "the base model's id" in serve_fails(runs["base"], "--model-name", "m", "--lora", f"m={shy}")
    assert "is not a LoRA adapter checkpoint" in serve_fails(runs["base"], "--lora", f"x={runs['base']}")
    err = serve_fails(runs["base"], "--lora", f"x={runs['base']}/missing")
    assert f"--lora x={runs['base']}/missing: checkpoint directory" in err, err
    # An adapter over another checkpoint (here its own merged run): both are named.
    err = serve_fails(runs["merged"]["shy"], "--lora", f"a={shy}")
    assert "the adapters were trained on" in err and str(runs["base"]) in err and str(runs["merged"]["shy"]) in err, err
    # The positional checkpoint is still refused as an adapter checkpoint.
    assert "--merge-lora" in serve_fails(shy)
