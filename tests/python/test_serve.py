"""`loom serve` through real HTTP clients (`requests` and the `openai` package): OpenAI's
completions (text, lists, token ids, echo + logprobs + max_tokens 0 as lm-eval's
local-completions model sends them, seeds, stop strings, server-sent events), NeMo's
PUT /generate, the same answers as `loom generate` and under t = 2 × p = 2, concurrent requests
equal to sequential ones (also with a KV pool small enough to preempt, with prefix caching
off, and with ngram speculation, whose drafts /metrics counts), every bad input of the issue answered with a 4xx naming the field while the server keeps
serving, hostile input (deep nesting, numbers past a double, sampling
values that would make logits non-finite, huge prompts, slow headers, chunked bodies past the
limit, a half-close) refused or answered and memory returning to its baseline after it, the API
key (flag, file, environment), SIGTERM finishing the requests in flight, a dead
rank ending the server, and a soak (8 clients × 25 requests; LOOM_SERVE_SOAK_FULL=1 or
tools/test.sh --full: 64 × 500) with every response complete and the memory bounded. The HTTP
server at t = 2 × p = 2 runs with the full switch only: CI checks the same equality in the
engine (loom_test_serve, t=2 × p=2 = t=p=1), keeping this file within its CI time."""
import concurrent.futures
import csv
import json
import math
import os
import signal
import socket
import subprocess
import threading
import time

import openai
import pytest
import requests

from ptune_helpers import METHODS, layout_overrides, run_ptune, write_recipe, write_task
from serve_helpers import Server, wait_exit
from test_data_helpers import ROOT, loom_binary
from train_helpers import make_corpus, run_train, tiny_overrides

PROMPTS = ["To be, or not to be", "ROMEO:", "First Citizen:\nBefore we proceed", "O", "What light through yonder"]
FULL_SOAK = os.environ.get("LOOM_SERVE_SOAK_FULL") == "1"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    corpus = make_corpus(tmp_path_factory)
    out = tmp_path_factory.mktemp("serve_run") / "run"
    run_train(tiny_overrides(corpus, out, steps=10, extra=["model.max_position_embeddings=64"]))
    return out


@pytest.fixture(scope="module")
def server(run_dir):
    with Server(run_dir, "--max-batch", 8) as s:
        yield s


def complete(url, **body):
    r = requests.post(url + "/v1/completions", json={"prompt": "ROMEO:", "max_tokens": 8, "temperature": 0, **body},
                      timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def loom_generate(run_dir, prompt, n):
    done = subprocess.run([str(loom_binary()), "generate", "--checkpoint", str(run_dir), "--prompt", prompt,
                           "--max-new-tokens", str(n), "--greedy"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(prompt)
    return done.stdout[len(prompt):-1]  # the continuation (print adds a newline)


def test_health_models_and_the_openai_client(server, run_dir):
    assert requests.get(server.url + "/health", timeout=10).json() == {"status": "ok"}
    models = requests.get(server.url + "/v1/models", timeout=10).json()
    assert models["data"][0]["id"] == "run" and models["data"][0]["max_model_len"] == 64
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    out = client.completions.create(model="run", prompt=PROMPTS[0], max_tokens=10, temperature=0)
    assert out.choices[0].text == loom_generate(run_dir, PROMPTS[0], 10)
    assert out.choices[0].finish_reason in ("length", "stop")
    assert out.usage.prompt_tokens == len(complete(server.url, prompt=PROMPTS[0], max_tokens=0, echo=True,
                                                   logprobs=0)["choices"][0]["logprobs"]["tokens"])
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens


def test_concurrent_requests_equal_sequential_ones(server):
    bodies = [{"prompt": p, "max_tokens": 6 + i % 7, "temperature": 0, "logprobs": 2} for i, p in
              enumerate(PROMPTS * 4)]
    bodies += [{"prompt": p, "max_tokens": 10, "temperature": 0.9, "top_k": 40, "top_p": 0.95, "seed": 11 + i}
               for i, p in enumerate(PROMPTS)]
    sequential = [complete(server.url, **b)["choices"][0] for b in bodies]
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        concurrent_ = list(pool.map(lambda b: complete(server.url, **b)["choices"][0], bodies))
    for a, b in zip(concurrent_, sequential):
        assert a["text"] == b["text"]
        if a["logprobs"]:
            assert a["logprobs"]["tokens"] == b["logprobs"]["tokens"]
            for x, y in zip(a["logprobs"]["token_logprobs"], b["logprobs"]["token_logprobs"]):
                assert abs(x - y) < 1e-4


def test_a_tiny_kv_pool_and_no_prefix_caching_answer_as_the_default(server, run_dir):
    """Requests sharing a system prompt, sent together: a pool of 4 blocks of 16 positions
    (--max-kv-tokens 64, so running requests preempt each other), --no-prefix-caching and a
    step budget of 8 tokens (--max-num-batched-tokens 8 = --max-batch: the prompts are
    prefilled in chunks beside the decoding requests) and the fixed-shape decode steps forced on
    (--cuda-graphs on: eager buckets on the CPU) give the default server's greedy answers."""
    system = "First Citizen:\nBefore we proceed any further, hear me speak. "
    bodies = [{"prompt": system + p, "max_tokens": 8, "temperature": 0, "logprobs": 1} for p in PROMPTS]
    expected = [complete(server.url, **b)["choices"][0] for b in bodies]
    for flags in (["--max-kv-tokens", 64], ["--no-prefix-caching"], ["--max-num-batched-tokens", 8],
                  ["--cuda-graphs", "on"]):
        with Server(run_dir, "--max-batch", 8, *flags) as s:
            with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
                got = list(pool.map(lambda b: complete(s.url, **b)["choices"][0], bodies))
            metrics = requests.get(s.url + "/metrics", timeout=30).text
            assert s.terminate() == 0
        bucket_steps = [float(line.split()[1]) for line in metrics.splitlines()
                        if line.startswith("loom:decode_bucket_steps_total ")]
        # Only the forced runner runs decode steps at buckets on the CPU (auto: CUDA only).
        assert (bucket_steps[0] > 0) == ("--cuda-graphs" in flags), (flags, bucket_steps)
        for a, b in zip(got, expected):
            assert a["text"] == b["text"], flags
            assert a["logprobs"]["token_logprobs"] == pytest.approx(b["logprobs"]["token_logprobs"], abs=1e-4)


def test_ngram_speculation_answers_as_the_default_and_counts_its_drafts(server, run_dir):
    """`--speculative-method ngram`: greedy and seeded sampled completions of repetitive and
    plain prompts, sent together, equal the default server's (the verification keeps the
    target's tokens), and /metrics counts drafted and accepted tokens."""
    repeated = "To be, or not to be: " * 4
    bodies = [{"prompt": p, "max_tokens": 16, "temperature": 0, "logprobs": 1} for p in [repeated, *PROMPTS]]
    bodies.append({"prompt": repeated, "max_tokens": 16, "temperature": 0.8, "top_p": 0.9, "seed": 7})
    expected = [complete(server.url, **b)["choices"][0] for b in bodies]
    with Server(run_dir, "--max-batch", 8, "--speculative-method", "ngram", "--num-speculative-tokens", 3) as s:
        with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
            got = list(pool.map(lambda b: complete(s.url, **b)["choices"][0], bodies))
        metrics = requests.get(s.url + "/metrics", timeout=30).text
        assert s.terminate() == 0
    for a, b in zip(got, expected):
        assert a["text"] == b["text"]
        if b.get("logprobs"):
            assert a["logprobs"]["token_logprobs"] == pytest.approx(b["logprobs"]["token_logprobs"], abs=1e-4)
    counters = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines()
                if line.startswith("loom:spec_decode_num_")}
    assert counters["loom:spec_decode_num_draft_tokens_total"] > 0
    assert 0 < counters["loom:spec_decode_num_accepted_tokens_total"] <= counters["loom:spec_decode_num_draft_tokens_total"]


def test_a_draft_model_equal_to_the_served_one_accepts_every_draft(server, run_dir):
    """`--speculative-method draft --draft-checkpoint RUN` with the served run as its own draft:
    greedy completions equal the default server's and every drafted token is accepted."""
    bodies = [{"prompt": p, "max_tokens": 12, "temperature": 0} for p in ["To be, or not to be: " * 3, *PROMPTS[:3]]]
    expected = [complete(server.url, **b)["choices"][0]["text"] for b in bodies]
    with Server(run_dir, "--max-batch", 4, "--speculative-method", "draft", "--draft-checkpoint", run_dir,
                "--num-speculative-tokens", 3) as s:
        with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
            got = list(pool.map(lambda b: complete(s.url, **b)["choices"][0]["text"], bodies))
        metrics = requests.get(s.url + "/metrics", timeout=30).text
        assert s.terminate() == 0
    assert got == expected
    counters = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines()
                if line.startswith("loom:spec_decode_num_")}
    assert counters["loom:spec_decode_num_draft_tokens_total"] > 0
    assert counters["loom:spec_decode_num_accepted_tokens_total"] == counters["loom:spec_decode_num_draft_tokens_total"]


def test_lm_eval_loglikelihood_shape(server):
    """local-completions sends token ids, echo, logprobs and max_tokens 0 (or 1) and reads
    token_logprobs[ctxlen:] and top_logprobs; the echoed prompt's log-probabilities equal those
    of the same tokens when they were generated."""
    nemo = requests.put(server.url + "/generate", json={"sentences": [PROMPTS[2]], "tokens_to_generate": 6,
                                                         "greedy": True, "compute_logprob": True,
                                                         "end_strings": []}, timeout=60).json()
    ids, generated_lp = nemo["token_ids"][0], nemo["logprob"][0]
    context = complete(server.url, prompt=PROMPTS[2], max_tokens=0, echo=True, logprobs=1)["choices"][0]
    ctx_ids_len = len(context["logprobs"]["tokens"])
    assert len(ids) == ctx_ids_len + 6
    body = {"model": "run", "prompt": [ids, ids[:ctx_ids_len]], "max_tokens": 0, "echo": True, "logprobs": 1,
            "temperature": 0, "seed": 1234}
    out = requests.post(server.url + "/v1/completions", json=body, timeout=60).json()
    full, ctx = out["choices"][0], out["choices"][1]
    assert [c["index"] for c in out["choices"]] == [0, 1]
    lp = full["logprobs"]["token_logprobs"]
    assert lp[0] is None and len(lp) == len(ids) and all(x <= 0 for x in lp[1:])
    assert ctx["logprobs"]["token_logprobs"] == pytest.approx(lp[:ctx_ids_len], abs=1e-5, nan_ok=True)
    # Scored in one prefill = scored token by token while they were generated.
    assert lp[1:] == pytest.approx(generated_lp, abs=1e-4)
    continuation = lp[ctx_ids_len:]
    # Greedy tokens are each the argmax: is_greedy as lm-eval computes it.
    for tok, top in zip(continuation, full["logprobs"]["top_logprobs"][ctx_ids_len:]):
        assert tok == pytest.approx(max(top.values()), abs=1e-6)
    assert full["text"] == nemo["sentences"][0]
    # max_tokens 1 (newer lm-eval): the same prompt values, one more token at the end.
    one = requests.post(server.url + "/v1/completions", json={**body, "prompt": ids, "max_tokens": 1}, timeout=60)
    assert one.json()["choices"][0]["logprobs"]["token_logprobs"][:-1] == pytest.approx(lp, abs=1e-5, nan_ok=True)


def test_seed_stop_and_streaming(server):
    body = {"prompt": PROMPTS[1], "max_tokens": 16, "temperature": 1.0, "seed": 77}
    a, b = complete(server.url, **body), complete(server.url, **body)
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
    other = complete(server.url, **{**body, "seed": 78})
    assert other["choices"][0]["text"] != a["choices"][0]["text"]
    # A stop string cuts the text before it and ends the request.
    text = complete(server.url, prompt=PROMPTS[0], max_tokens=16)["choices"][0]["text"]
    stop = text[3:5]
    cut = complete(server.url, prompt=PROMPTS[0], max_tokens=16, stop=[stop])["choices"][0]
    assert cut["text"] == text[:text.index(stop)] and cut["finish_reason"] == "stop"
    # Server-sent events through the openai client: the chunks add up to the whole text.
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    chunks = list(client.completions.create(model="run", prompt=PROMPTS[1], max_tokens=16, temperature=1.0, seed=77,
                                            stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == a["choices"][0]["text"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == a["choices"][0]["finish_reason"]
    assert chunks[-1].usage.completion_tokens == a["usage"]["completion_tokens"]


def test_streamed_logprobs_add_up_to_the_whole_response(server):
    """OpenAI's completions stream: each chunk's logprobs hold the tokens whose text it carries
    (the echoed prompt in the first ones), text_offset relative to the whole text; together they
    are the non-streamed response's logprobs."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    for extra in ({}, {"echo": True}, {"stop": [" t"]}):
        body = dict(model="run", prompt=PROMPTS[4], max_tokens=12, temperature=0.8, seed=5, logprobs=3, **extra)
        whole = client.completions.create(**body).choices[0]
        chunks = [c.choices[0] for c in client.completions.create(**body, stream=True) if c.choices]
        assert "".join(c.text for c in chunks) == whole.text
        assert all(c.logprobs is not None for c in chunks)
        streamed = {key: sum((getattr(c.logprobs, key) for c in chunks), [])
                    for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
        assert streamed["tokens"] == whole.logprobs.tokens
        assert streamed["text_offset"] == whole.logprobs.text_offset
        assert streamed["token_logprobs"] == pytest.approx(whole.logprobs.token_logprobs, abs=1e-6, nan_ok=True)
        for a, b in zip(streamed["top_logprobs"], whole.logprobs.top_logprobs):
            assert (a is None) == (b is None) and (a is None or a == pytest.approx(b, abs=1e-6))
        # Tokens are sent with (or after) the text they spell, never ahead of it (offsets are
        # bytes; compared where text and tokens are ASCII).
        if whole.text.isascii() and all(t.isascii() for t in whole.logprobs.tokens):
            sent_text = 0
            for c in chunks:
                sent_text += len(c.text)
                assert all(o + len(t) <= sent_text for o, t in zip(c.logprobs.text_offset, c.logprobs.tokens)) or \
                    c is chunks[-1]
        if "echo" in extra:
            assert chunks[0].logprobs.token_logprobs[0] is None


@pytest.fixture(scope="module")
def prompt_run(run_dir, tmp_path_factory):
    """A p-tuning run (4 steps) of the 'mood' task on the served checkpoint, and records of its
    validation set without their answers."""
    folder = tmp_path_factory.mktemp("ptune")
    train, valid = write_task(folder)
    out = folder / "run"
    run_ptune(write_recipe(folder / "ptune.yaml", run_dir, train, valid), METHODS["mlp"] + layout_overrides(out))
    records = [{k: v for k, v in json.loads(line).items() if k not in ("label", "taskname")}
               for line in valid.read_text().splitlines()[:6]]
    return out, records


def test_learned_prompts_are_served_as_loom_generate_runs_them(prompt_run, run_dir, tmp_path):
    """Requests naming a task (OpenAI's taskname, NeMo's task_ids) get what `loom generate
    --prompt-checkpoint` generates for the same records, also when they share the batch with
    each other and with plain requests."""
    run, records = prompt_run
    inputs = tmp_path / "records.jsonl"
    inputs.write_text("".join(json.dumps({"taskname": "mood", **r}) + "\n" for r in records))
    done = subprocess.run([str(loom_binary()), "generate", "--prompt-checkpoint", str(run), "--input", str(inputs),
                           "--greedy", "--max-new-tokens", "4"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    expected = [json.loads(line)["prediction"] for line in done.stdout.splitlines()]
    assert len(expected) == len(records)
    with Server(run_dir, "--prompt-checkpoint", run, "--max-batch", 8) as s:
        task_bodies = [{"taskname": "mood", "prompt": r, "max_tokens": 4, "temperature": 0} for r in records]
        plain_bodies = [{"prompt": p, "max_tokens": 6, "temperature": 0} for p in PROMPTS]
        single = [complete(s.url, **b)["choices"][0]["text"] for b in task_bodies + plain_bodies]
        assert single[:len(records)] == expected
        # Mixed in one batch: tasks and plain prompts at once, and a NeMo request with both.
        nemo_body = {"sentences": [records[0], PROMPTS[1]], "task_ids": ["mood", None], "tokens_to_generate": 4,
                     "greedy": True, "compute_logprob": True}
        with concurrent.futures.ThreadPoolExecutor(len(single) + 1) as pool:
            nemo_reply = pool.submit(lambda: requests.put(s.url + "/generate", json=nemo_body, timeout=120).json())
            mixed = list(pool.map(lambda b: complete(s.url, **b)["choices"][0]["text"], task_bodies + plain_bodies))
            nemo = nemo_reply.result()
        assert mixed == single
        assert nemo["sentences"][0].endswith(":" + expected[0]) and records[0]["text"] in nemo["sentences"][0]
        assert "<|endoftext|>" not in nemo["sentences"][0]  # the virtual positions are not shown
        assert len(nemo["logprob"][0]) == len(nemo["token_ids"][0]) - 1
        assert nemo["sentences"][1].startswith(PROMPTS[1])
        # A list of records in one request, by task index.
        both = complete(s.url, taskname=0, prompt=records[:2], max_tokens=4)
        assert [c["text"] for c in both["choices"]] == expected[:2]
        for body, field in [({"taskname": "nope", "prompt": records[0]}, "taskname"),
                            ({"taskname": "mood", "prompt": {"txt": "x"}}, "prompt"),
                            ({"taskname": "mood", "prompt": records[0], "echo": True}, "echo"),
                            ({"taskname": "mood", "prompt": {"text": 3}}, "prompt.text")]:
            r = requests.post(s.url + "/v1/completions", json=body, timeout=60)
            assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
        r = requests.put(s.url + "/generate", json={**nemo_body, "task_ids": ["mood"]}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "task_ids"


def test_nemo_generate(server, run_dir):
    body = {"sentences": PROMPTS[:3], "tokens_to_generate": 8, "greedy": True, "compute_logprob": True,
            "end_strings": ["<|endoftext|>"], "add_BOS": False, "all_probs": False, "temperature": 1.0, "top_k": 0,
            "top_p": 0.9, "repetition_penalty": 1.0, "min_tokens_to_generate": 0, "random_seed": 3}
    out = requests.put(server.url + "/generate", json=body, timeout=120).json()
    assert set(out) == {"sentences", "tokens", "logprob", "token_ids", "offsets"}
    for i, prompt in enumerate(PROMPTS[:3]):
        assert out["sentences"][i] == prompt + loom_generate(run_dir, prompt, 8)
        assert "".join(out["tokens"][i]) == out["sentences"][i]
        assert len(out["logprob"][i]) == len(out["token_ids"][i]) - 1
        assert out["offsets"][i][0] == 0 and out["offsets"][i] == sorted(out["offsets"][i])
    with_probs = requests.put(server.url + "/generate", json={**body, "all_probs": True}, timeout=120).json()
    assert len(with_probs["full_logprob"][0]) == len(with_probs["logprob"][0])


def huge_body():
    return b'{"prompt": "' + b"a" * (100 << 20) + b'"}'


BAD = [
    ("malformed JSON", b'{"prompt": "x", ', 400, "body"),
    ("not an object", b'[1, 2]', 400, "body"),
    ("wrong type", json.dumps({"prompt": "x", "max_tokens": "ten"}).encode(), 400, "max_tokens"),
    ("unknown field", json.dumps({"prompt": "x", "max_tokenz": 3}).encode(), 400, "max_tokenz"),
    ("prompt past the context", json.dumps({"prompt": list(range(65))}).encode(), 400, "prompt"),
    ("max_tokens past the context", json.dumps({"prompt": "x", "max_tokens": 64}).encode(), 400, "max_tokens"),
    ("negative max_tokens", json.dumps({"prompt": "x", "max_tokens": -1}).encode(), 400, "max_tokens"),
    ("token id outside the vocabulary", json.dumps({"prompt": [1, 60000]}).encode(), 400, "prompt"),
    ("invalid UTF-8", b'{"prompt": "\xff\xfe bad"}', 400, "body"),
    ("temperature below 0", json.dumps({"prompt": "x", "temperature": -1}).encode(), 400, "temperature"),
    ("top_p 0", json.dumps({"prompt": "x", "top_p": 0}).encode(), 400, "top_p"),
    ("logprobs past 20", json.dumps({"prompt": "x", "logprobs": 50}).encode(), 400, "logprobs"),
    ("another model", json.dumps({"prompt": "x", "model": "gpt-4"}).encode(), 404, "model"),
    ("100 MB body", None, 413, "body"),
    ("taskname without learned prompts", json.dumps({"prompt": {"text": "x"}, "taskname": "mood"}).encode(), 400,
     "taskname"),
    # Hostile input (issue 35): each is refused before any work, naming the field.
    ("a million nested lists as the prompt", b'{"prompt": ' + b"[" * 1_000_000 + b"]" * 1_000_000 + b"}", 400,
     "prompt"),
    ("nested objects", b'{"stream_options": ' + b'{"a": ' * 40 + b"1" + b"}" * 41, 400, "stream_options"),
    ("an integer of 100,000 digits", b'{"prompt": "x", "max_tokens": ' + b"9" * 100_000 + b"}", 400, "max_tokens"),
    ("temperature 1e400", b'{"prompt": "x", "temperature": 1e400}', 400, "temperature"),
    ("a number past a double in a nested field", b'{"prompt": "x", "stream_options": {"include_usage": -1e999}}', 400,
     "stream_options.include_usage"),
    ("repetition_penalty 1e-300", json.dumps({"prompt": "ROMEO:", "max_tokens": 2, "temperature": 0,
                                               "repetition_penalty": 1e-300}).encode(), 400, "repetition_penalty"),
    ("a subnormal temperature", json.dumps({"prompt": "x", "temperature": 1e-320}).encode(), 400, "temperature"),
    ("5 stop strings", json.dumps({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}).encode(), 400, "stop"),
    ("a stop string of 2 KB", json.dumps({"prompt": "x", "stop": ["s" * 2048]}).encode(), 400, "stop"),
    ("a 7 MB one-word prompt", json.dumps({"prompt": "a" * (7 << 20)}).encode(), 400, "prompt"),
    ("a million token ids", json.dumps({"prompt": [0] * 1_000_000}).encode(), 400, "prompt"),
    ("129 prompts", json.dumps({"prompt": ["x"] * 129}).encode(), 400, "prompt"),
]


@pytest.mark.parametrize("name,body,status,field", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_refused_and_the_next_request_served(server, name, body, status, field):
    r = requests.post(server.url + "/v1/completions", data=huge_body() if body is None else body,
                      headers={"Content-Type": "application/json"}, timeout=120)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == field and field in error["message"]
    assert complete(server.url, max_tokens=2)["choices"][0]["finish_reason"] in ("length", "stop")


def test_bad_nemo_input_names_the_field(server):
    for body, field in [({"sentences": "x"}, "sentences"), ({"sentences": ["x"], "tokens_to_generate": 1.5},
                                                              "tokens_to_generate"),
                        ({"sentences": ["x"], "greedy": "yes"}, "greedy"), ({"prompts": ["x"]}, "prompts"),
                        ({"sentences": [{"text": "x"}], "task_ids": ["mood"]}, "task_ids[0]"),
                        # NeMo sets no limit on end_strings: this server takes 16.
                        ({"sentences": ["x"], "end_strings": [f"e{i}" for i in range(17)]}, "end_strings"),
                        ({"sentences": ["x"], "end_strings": ["e" * 1025]}, "end_strings"),
                        ({"sentences": ["x"], "temperature": 1e-300}, "temperature"),
                        ({"sentences": ["a" * (7 << 20)]}, "sentences")]:
        r = requests.put(server.url + "/generate", json=body, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    sixteen = requests.put(server.url + "/generate", json={"sentences": ["x"], "tokens_to_generate": 2,
                                                            "end_strings": [f"e{i}" for i in range(16)]}, timeout=30)
    assert sixteen.status_code == 200, sixteen.text
    r = requests.put(server.url + "/generate", data=b'{"sentences": ["x"], "tokens_to_generate": 1e400}', timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tokens_to_generate", r.text


def port_of(server):
    return int(server.url.rsplit(":", 1)[1])


def raw_request(body, path="/v1/completions", method="POST"):
    return (f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def read_all(sock):
    received = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return received
        received += chunk


def test_a_request_followed_by_a_half_close_is_answered(server):
    """The client shuts its sending side after the request (as `nc -N` does): it is answered."""
    body = json.dumps({"prompt": "ROMEO:", "max_tokens": 3, "temperature": 0}).encode()
    with socket.create_connection(("127.0.0.1", port_of(server)), timeout=60) as s:
        s.sendall(raw_request(body))
        s.shutdown(socket.SHUT_WR)
        reply = read_all(s)
    head, _, payload = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), reply[:300]
    assert json.loads(payload)["usage"]["completion_tokens"] == 3


def test_a_chunked_body_over_the_limit_is_refused_while_reading(server):
    """A chunked body passing --max-body-mb (8 MiB) gets 413 naming `body` once the limit is passed;
    its bytes are dropped, not kept (the server's memory does not grow by the 100 MB sent)."""
    pid = server.ranks()[0]
    before = server.rss_kib(pid)
    sent = [0]

    def chunks():
        yield b'{"prompt": "'
        for _ in range(100):
            sent[0] += 1 << 20
            yield b"a" * (1 << 20)
        yield b'"}'

    r = requests.post(server.url + "/v1/completions", data=chunks(), headers={"Content-Type": "application/json"},
                      timeout=120)
    assert r.status_code == 413, r.text
    assert r.json()["error"]["param"] == "body" and "chunked" in r.json()["error"]["message"]
    assert (server.rss_kib(pid) - before) / 1024 < 50
    # A chunked body within the limit is read as any other.
    small = json.dumps({"prompt": "ROMEO:", "max_tokens": 2, "temperature": 0}).encode()
    ok = requests.post(server.url + "/v1/completions", data=iter([small[:5], small[5:]]),
                       headers={"Content-Type": "application/json"}, timeout=60)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2, ok.text


def test_slow_header_clients_do_not_starve_service(run_dir):
    """200 connections sending their headers a byte every 0.24 s: a normal request meanwhile is
    answered at once, and each slow one gets 408 at the header deadline (--header-timeout-s 2)."""
    with Server(run_dir, "--header-timeout-s", 2) as s:
        port = port_of(s)
        head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Pad: " + b"p" * 100
        slow = []
        for _ in range(200):  # each starts its request at once (a silent connection is closed silently)
            slow.append(socket.create_connection(("127.0.0.1", port), timeout=30))
            slow[-1].sendall(head[:1])
        stop = threading.Event()

        def dribble():
            for i in range(1, len(head)):
                for c in slow:
                    try:
                        c.send(head[i:i + 1])
                    except OSError:
                        pass
                if stop.wait(0.24):
                    return

        sender = threading.Thread(target=dribble)
        sender.start()
        try:
            time.sleep(0.5)
            start = time.time()
            r = requests.post(s.url + "/v1/completions", json={"prompt": "ROMEO:", "max_tokens": 2, "temperature": 0},
                              timeout=20)
            assert r.status_code == 200, r.text
            assert time.time() - start < 1.5, f"answered after {time.time() - start:.1f} s"
            refused = 0
            replies = []
            for c in slow:
                c.settimeout(5)
                reply = read_all(c)
                replies.append(reply)
                refused += reply.startswith(b"HTTP/1.1 408") and b'"headers"' in reply
            assert refused == len(slow), [r[:60] for r in replies if not r.startswith(b"HTTP/1.1 408")][:5]
        finally:
            stop.set()
            sender.join()
            for c in slow:
                c.close()
        assert requests.get(s.url + "/health", timeout=10).json() == {"status": "ok"}


def test_memory_returns_to_its_baseline_after_hostile_requests(server):
    """A few seconds of hostile requests from 8 clients (huge prompts and token lists, deep nesting,
    huge numbers, bodies at the limit): every one is refused, and the server's resident memory
    returns to within 64 MiB of where it was."""
    pid = server.ranks()[0]
    complete(server.url, max_tokens=2)
    baseline = server.rss_kib(pid)
    bodies = [json.dumps({"prompt": "a" * (7 << 20)}).encode(),
              json.dumps({"prompt": [0] * 1_500_000}).encode(),
              json.dumps({"prompt": [[1, 2]] * 600_000}).encode(),
              b'{"prompt": ' + b"[" * 2_000_000 + b"]" * 2_000_000 + b"}",
              b'{"prompt": "x", "max_tokens": ' + b"7" * 4_000_000 + b"}",
              json.dumps({"sentences": ["b" * (1 << 20)] * 7}).encode()]
    statuses = []

    def client(c):
        session = requests.Session()
        for i in range(6):
            body = bodies[(c + i) % len(bodies)]
            method = session.put if b"sentences" in body else session.post
            r = method(server.url + ("/generate" if b"sentences" in body else "/v1/completions"), data=body,
                       headers={"Content-Type": "application/json"}, timeout=120)
            statuses.append(r.status_code)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(client, range(8)))
    assert set(statuses) == {400}, statuses
    time.sleep(0.5)
    grown_mib = (server.rss_kib(pid) - baseline) / 1024
    assert grown_mib < 64, f"the server kept {grown_mib:.0f} MiB after the hostile requests"
    assert complete(server.url, max_tokens=2)["usage"]["completion_tokens"] == 2


def test_a_client_leaving_mid_stream_does_not_stop_the_server(server):
    body = json.dumps({"prompt": PROMPTS[0], "max_tokens": 40, "stream": True, "temperature": 0}).encode()
    for _ in range(3):
        s = socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])), timeout=30)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        received = b""
        while b"data:" not in received:  # the headers, then the first event
            chunk = s.recv(4096)
            assert chunk, received
            received += chunk
        s.close()
    assert complete(server.url, max_tokens=3)["choices"][0]["text"] is not None
    assert requests.get(server.url + "/health", timeout=10).status_code == 200


def test_api_key_from_a_file_or_the_environment(run_dir, tmp_path):
    """--api-key-file and $LOOM_API_KEY keep the key out of the process list; --help says why."""
    help_text = subprocess.run([str(loom_binary()), "serve", "--help"], capture_output=True, text=True,
                               timeout=60).stdout
    assert "--api-key-file" in help_text and "process list" in help_text and "LOOM_API_KEY" in help_text
    key_file = tmp_path / "key"
    key_file.write_text("open-sesame-7\n")
    for flags, env in ((["--api-key-file", key_file], None), ([], {"LOOM_API_KEY": "open-sesame-7"})):
        with Server(run_dir, *flags, env=env) as s:
            with open(f"/proc/{s.proc.pid}/cmdline", "rb") as f:
                assert b"open-sesame-7" not in f.read()
            body = {"prompt": "x", "max_tokens": 1}
            assert requests.post(s.url + "/v1/completions", json=body, timeout=30).status_code == 401
            wrong = requests.post(s.url + "/v1/completions", json=body, headers={"Authorization": "Bearer open"},
                                  timeout=30)
            assert wrong.status_code == 401
            right = requests.post(s.url + "/v1/completions", json=body,
                                  headers={"Authorization": "Bearer open-sesame-7"}, timeout=30)
            assert right.status_code == 200, right.text
    empty = tmp_path / "empty"
    empty.write_text("\n")
    done = subprocess.run([str(loom_binary()), "serve", "--checkpoint", str(run_dir), "--api-key-file", str(empty)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--api-key-file" in done.stderr


def test_api_key_and_sigterm_finishing_requests_in_flight(run_dir):
    server = Server(run_dir, "--api-key", "sesame", "--max-batch", 4)
    try:
        assert requests.get(server.url + "/health", timeout=10).status_code == 401
        r = requests.post(server.url + "/v1/completions", json={"prompt": "x"},
                          headers={"Authorization": "Bearer wrong"}, timeout=10)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        auth = {"Authorization": "Bearer sesame"}
        results = []

        def slow():
            results.append(requests.post(server.url + "/v1/completions", headers=auth, timeout=120,
                                         json={"prompt": PROMPTS[0], "max_tokens": 40, "temperature": 0,
                                               "min_tokens": 40}))

        threads = [threading.Thread(target=slow) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        assert server.terminate() == 0
        for t in threads:
            t.join()
        assert [r.status_code for r in results] == [200] * 4
        assert all(r.json()["usage"]["completion_tokens"] == 40 for r in results)
    finally:
        server.stop()


@pytest.mark.skipif(not FULL_SOAK, reason="with LOOM_SERVE_SOAK_FULL=1 / tools/test.sh --full (CI: the engine's "
                                         "t=2 x p=2 equality in loom_test_serve)")
def test_tp2_pp2_server_answers_as_the_single_process_one(server, run_dir):
    bodies = [{"prompt": p, "max_tokens": 8, "temperature": 0, "logprobs": 1, "echo": True} for p in PROMPTS]
    expected = [complete(server.url, **b)["choices"][0] for b in bodies]
    with Server(run_dir, "--tensor-parallel", 2, "--pipeline-parallel", 2) as parallel:
        with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
            got = list(pool.map(lambda b: complete(parallel.url, **b)["choices"][0], bodies))
        assert parallel.terminate() == 0
    for a, b in zip(got, expected):
        assert a["text"] == b["text"]
        assert a["logprobs"]["token_logprobs"] == pytest.approx(b["logprobs"]["token_logprobs"], abs=1e-4, nan_ok=True)


def test_a_dead_rank_ends_the_server_promptly(run_dir):
    with Server(run_dir, "--tensor-parallel", 2) as s:
        ranks = s.ranks()
        assert len(ranks) == 2
        os.kill(max(ranks), signal.SIGKILL)
        code = wait_exit(s.proc, 60)
        assert code is not None and code != 0, "".join(s.log)[-3000:]


def test_soak(server):
    clients, per_client = (64, 500) if FULL_SOAK else (8, 25)
    pid = server.ranks()[0]
    complete(server.url, max_tokens=4)
    before = server.rss_kib(pid)
    failures = []

    def client(c):
        session = requests.Session()
        for i in range(per_client):
            n = 1 + (c + i) % 6
            r = session.post(server.url + "/v1/completions", timeout=300,
                             json={"prompt": PROMPTS[(c + i) % len(PROMPTS)], "max_tokens": n,
                                   "temperature": 0.7, "seed": i, "min_tokens": n})
            body = r.json() if r.status_code == 200 else None
            if not body or body["usage"]["completion_tokens"] != n or body["choices"][0]["finish_reason"] != "length":
                failures.append((c, i, r.status_code, r.text[:200]))

    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    assert not failures, failures[:5]
    grown_mib = (server.rss_kib(pid) - before) / 1024
    assert grown_mib < 200, f"the server grew by {grown_mib:.0f} MiB over the soak"
    assert requests.get(server.url + "/health", timeout=10).json() == {"status": "ok"}


def plan_infer(*args, timeout=600):
    return subprocess.run([str(loom_binary()), "plan", "infer", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def cpu_profile(tmp_path_factory):
    out = tmp_path_factory.mktemp("calibrate") / "cpu.json"
    done = subprocess.run([str(loom_binary()), "plan", "calibrate", "--devices", "2", "--out", str(out),
                           "--seconds", "0.1"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def test_plan_infer_measures_the_best_layouts_through_the_engine(run_dir, cpu_profile, tmp_path):
    """`loom plan infer --measure 2` serves the two best predicted layouts of the checkpoint on
    CPU ranks (the engine's benchmark rounds) and prints measured beside predicted figures; with
    a deadline no run can meet, each run is classified as a timeout and the next one still runs."""
    plan = ["--checkpoint", run_dir, "--profile", cpu_profile, "--nodes", 1, "--gpus-per-node", 2,
            "--prompt-tokens", 12, "--output-tokens", 6, "--tp", "1,2", "--pp", 1, "--batch", "2,4"]
    ranked = tmp_path / "ranked.csv"
    table = tmp_path / "measured.csv"
    done = plan_infer(*plan, "--csv", ranked, "--measure", 2, "--measure-rounds", 2, "--measure-csv", table,
                      "--measure-dir", tmp_path / "runs")
    assert done.returncode == 0, done.stderr[-4000:]
    predicted = list(csv.DictReader(ranked.open()))
    rows = list(csv.DictReader(table.open()))
    assert [(r["tp"], r["pp"], r["batch"]) for r in rows] == [(p["tp"], p["pp"], p["batch"]) for p in predicted[:2]]
    for i, r in enumerate(rows, 1):
        assert r["status"] == "ok", done.stderr[-3000:]
        p = predicted[i - 1]
        # The plan's CSV has 3 (ms) and 2 (tokens/s) decimals.
        assert float(r["predicted_ttft_ms"]) == pytest.approx(float(p["ttft_ms"]), rel=1e-3, abs=1e-3)
        assert float(r["predicted_tokens_per_s"]) == pytest.approx(float(p["tokens_per_s_replica"]), rel=1e-3,
                                                                   abs=0.01)
        for figure, column in (("ttft", "ttft_ms"), ("token", "token_ms"), ("tokens_per_s", "tokens_per_s")):
            meas, pred = float(r["measured_" + column]), float(r["predicted_" + column])
            assert meas > 0
            assert float(r[f"{figure}_error"]) == pytest.approx((meas - pred) / pred, rel=1e-3, abs=1e-4)
        # The engine ran exactly the planned workload: 2 rounds of `batch` requests of 6 tokens.
        bench = json.loads((tmp_path / "runs" / f"layout-{i}.json").read_text())
        batch = int(r["batch"])
        assert bench["requests"] == 2 * batch and bench["generated_tokens"] == 2 * batch * 6
        assert float(r["measured_tokens_per_s"]) == pytest.approx(bench["tokens_per_s"], rel=1e-3)
    assert "TTFT ms (pred / meas / err)" in done.stderr and "mean absolute error over 2" in done.stderr

    failed = plan_infer(*plan, "--measure", 2, "--measure-timeout", 0.3, "--measure-csv", table,
                        "--measure-dir", tmp_path / "late")
    assert failed.returncode == 1, failed.stderr[-3000:]
    rows = list(csv.DictReader(table.open()))
    assert [r["status"] for r in rows] == ["timeout", "timeout"], failed.stderr[-3000:]
    assert "[measure 2/2]" in failed.stderr and "no measured run succeeded" in failed.stderr
    # Bad input is named before any run.
    bad = plan_infer(*plan, "--measure", 2, "--size", 1)
    assert bad.returncode == 2 and "either by --checkpoint or by --size" in bad.stderr
    bad = plan_infer("--size", 1, "--prompt-tokens", 8, "--output-tokens", 8, "--measure", 1)
    assert bad.returncode == 2 and "--measure needs --checkpoint" in bad.stderr


def test_bad_flags_exit_2_naming_the_flag(run_dir, tmp_path):
    """Bad input ends `loom serve` with status 2, whether the flag is checked before the ranks
    start or only by the engine on the rank (its std::invalid_argument)."""
    def serve(*flags):
        return subprocess.run([str(loom_binary()), "serve", *map(str, flags)], cwd=ROOT, capture_output=True,
                              text=True, timeout=300)
    for flags, expected in [(["--checkpoint", run_dir, "--max-batch", 0], "--max-batch"),
                            (["--checkpoint", run_dir, "--max-num-batched-tokens", 3],
                             "--max-num-batched-tokens: expected an integer >= --max-batch (16)"),
                            (["--checkpoint", tmp_path / "none"], str(tmp_path / "none")),
                            ([], "--checkpoint DIR (or --prompt-checkpoint DIR) is required"),
                            (["--checkpoint", run_dir, "--prompt-checkpoint", tmp_path], "--prompt-checkpoint"),
                            (["--checkpoint", run_dir, "--max-batch", 2, "--bench-out", tmp_path / "b.json",
                              "--bench-batch", 3, "--bench-prompt-tokens", 8, "--bench-output-tokens", 4],
                             "--bench-batch 3"),
                            (["--checkpoint", run_dir, "--bench-out", tmp_path / "b.json", "--bench-prompt-tokens", 60,
                              "--bench-output-tokens", 8], "exceed the model's context of 64 tokens"),
                            (["--checkpoint", run_dir, "--cuda-graphs", "yes"],
                             "--cuda-graphs: expected auto, on or off, found 'yes'"),
                            (["--checkpoint", run_dir, "--cuda-graphs", "on", "--pipeline-parallel", 2],
                             "--cuda-graphs on: the fixed-shape decode steps need --pipeline-parallel 1"),
                            (["--checkpoint", run_dir, "--speculative-method", "eagle"],
                             "--speculative-method: expected none, ngram or draft, found 'eagle'"),
                            (["--checkpoint", run_dir, "--speculative-method", "draft"],
                             "--draft-checkpoint goes with --speculative-method draft"),
                            (["--checkpoint", run_dir, "--speculative-method", "ngram", "--num-speculative-tokens", 0],
                             "--num-speculative-tokens: expected an integer >= 1"),
                            (["--checkpoint", run_dir, "--speculative-method", "ngram", "--prompt-lookup-min", 3,
                              "--prompt-lookup-max", 2], "--prompt-lookup-max: expected an integer >= --prompt-lookup-min"),
                            (["--checkpoint", run_dir, "--num-speculative-tokens", 3],
                             "need --speculative-method ngram or draft")]:
        done = serve(*flags)
        assert done.returncode == 2 and expected in done.stderr, (flags, done.returncode, done.stderr[-2000:])
    done = serve("--checkpoint", run_dir, "--bench-out", tmp_path / "b.json", "--bench-batch", 2,
                 "--bench-prompt-tokens", 8, "--bench-output-tokens", 4, "--bench-rounds", 1)
    assert done.returncode == 0, done.stderr[-2000:]
    bench = json.loads((tmp_path / "b.json").read_text())
    assert bench["requests"] == 2 and bench["generated_tokens"] == 8 and bench["tokens_per_s"] > 0
    assert bench["ttft_ms"] <= bench["request_ms"]
