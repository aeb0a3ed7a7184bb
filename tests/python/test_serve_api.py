"""`loom serve`'s chat completions, Prometheus metrics, connection limit and the real
lm-evaluation-harness client (issue 30), on a tiny model trained here and imported back through
`loom convert --to hf` / `--from hf` so that it carries a chat template:
- POST /v1/chat/completions renders the messages as transformers' `apply_chat_template` does,
  for three templates written here to use the Jinja that real chat templates use (bos/eos
  tokens, slicing, `raise_exception`, `namespace`, `loop`, filters, `is defined`): the prompt's
  token count and the generated tokens' log-probabilities equal those of /v1/completions given
  transformers' rendering as token ids; the `openai` client, streamed and not; each malformed
  message and a server without a template answered 400 naming the field;
- GET /metrics parses with prometheus_client's text parser and its counters move by exactly
  what the requests did;
- 256 clients connecting at once (the default --max-connections) are all served, none reset;
  one more while 256 are held gets 503; a bad --max-connections or chat template exits 2 naming it;
- lm-evaluation-harness's `local-completions` model against the server gives `loom eval`'s
  per-document log-likelihoods and accuracy on the documents that fit the context (the harness
  scores at most context - 1 tokens through a server): through `simple_evaluate` (the entry
  point of `lm_eval`'s command line) in CI, through the `lm_eval` command itself with
  LOOM_SERVE_SOAK_FULL=1 (tools/test.sh --full)."""
import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time

import openai
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from serve_helpers import Server
from test_data_helpers import ROOT, loom_binary
from train_helpers import make_corpus, run_train, tiny_overrides

CONTEXT = 128
# tools/test.sh --full: lm-eval through its command line (~45 s more on 2 cores: it indexes every
# bundled task file first).
FULL = os.environ.get("LOOM_SERVE_SOAK_FULL") == "1"

# Written for this test; each uses Jinja the way published chat templates do.
TURNS = """{{- bos_token -}}
{%- if messages[0]['role'] == 'system' -%}
  {%- set system = messages[0]['content'] | trim -%}
  {%- set turns = messages[1:] -%}
{%- else -%}
  {%- set system = '' -%}
  {%- set turns = messages -%}
{%- endif -%}
{%- for m in turns -%}
  {%- if (m['role'] == 'user') != (loop.index0 % 2 == 0) -%}
    {{- raise_exception('Turns must alternate: user, assistant, user, ...') -}}
  {%- endif -%}
  {%- if m['role'] == 'user' -%}
    {{- '[USER] ' + (system + '\\n\\n' if loop.first and system else '') + m['content'] | trim + '\\n' -}}
  {%- else -%}
    {{- '[BOT] ' + m['content'] | trim + eos_token + '\\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '[BOT]' -}}{%- endif -%}
"""
BLOCKS = """{% set ns = namespace(n=0) %}
{% for message in messages %}
{% if message.role == 'user' %}{% set ns.n = ns.n + 1 %}{% endif %}
<{{ message.role }} turn="{{ ns.n }}">
{{ message.content }}
</{{ message.role }}>
{% if loop.last and add_generation_prompt %}
<assistant turn="{{ ns.n }}">
{% endif %}
{% endfor %}
"""
NAMED = """{%- for message in messages -%}
{%- if message.name is defined -%}{{ message.role | upper }} ({{ message.name }})
{%- else -%}{{ message.role | upper }}{%- endif -%}
: {{ message.content.replace('\\n', ' ') }} [{{ message.content | length }}]
{% endfor -%}
{%- if add_generation_prompt %}ASSISTANT:{% endif -%}
"""
CONVERSATIONS = [
    [{"role": "user", "content": "Who is there?"}],
    [{"role": "system", "content": " Speak as Hamlet. "}, {"role": "user", "content": "To be?"},
     {"role": "assistant", "content": "Or not to be."}, {"role": "user", "content": "That is\nthe question."}],
    [{"role": "user", "content": "Hail!", "name": "Horatio"}, {"role": "assistant", "content": "Well met."},
     {"role": "user", "content": "Peace, break thee off"}],
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    corpus = make_corpus(tmp_path_factory)
    out = tmp_path_factory.mktemp("serve_api_run") / "run"
    run_train(tiny_overrides(corpus, out, steps=10, extra=[f"model.max_position_embeddings={CONTEXT}"]))
    return out


def convert(*args):
    done = subprocess.run([str(loom_binary()), "convert", *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]


@pytest.fixture(scope="module")
def hf_dir(trained, tmp_path_factory):
    """The model as a Hugging Face folder whose tokenizer_config.json holds the TURNS template."""
    hf = tmp_path_factory.mktemp("serve_api_hf") / "hf"
    convert("--to", "hf", hf, "--checkpoint", trained)
    config = json.loads((hf / "tokenizer_config.json").read_text())
    (hf / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TURNS}, indent=2))
    return hf


@pytest.fixture(scope="module")
def run(hf_dir, tmp_path_factory):
    """The Hugging Face folder imported back: RUN/tokenizer/chat_template.jinja carries TURNS."""
    out = tmp_path_factory.mktemp("serve_api_import") / "run"
    convert("--from", "hf", hf_dir, "--output", out)
    assert (out / "tokenizer" / "chat_template.jinja").read_text() == TURNS
    return out


def test_the_chat_template_travels_back_with_an_export(run, tmp_path):
    from transformers import AutoTokenizer
    hf = tmp_path / "hf"
    convert("--to", "hf", hf, "--checkpoint", run)
    assert AutoTokenizer.from_pretrained(str(hf)).chat_template == TURNS


@pytest.fixture(scope="module")
def server(run):
    with Server(run, "--max-batch", 8) as s:
        yield s


@pytest.fixture(scope="module")
def hf_tokenizer(hf_dir):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(hf_dir))


def post(url, path, body, status=200):
    r = requests.post(url + path, json=body, timeout=120)
    assert r.status_code == status, r.text
    return r.json()


def assert_rendered_as_transformers(url, tokenizer, template, messages):
    """The server's prompt is transformers' rendering: same token count, and the greedy tokens'
    log-probabilities (which depend on every prompt token) equal those of /v1/completions given
    transformers' text as token ids."""
    text = tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    chat = post(url, "/v1/chat/completions", {"messages": messages, "max_tokens": 5, "min_tokens": 5,
                                              "temperature": 0, "logprobs": True, "top_logprobs": 2})
    plain = post(url, "/v1/completions", {"prompt": ids, "max_tokens": 5, "min_tokens": 5, "temperature": 0,
                                          "logprobs": 2})["choices"][0]
    assert chat["usage"]["prompt_tokens"] == len(ids), (text, chat)
    content = chat["choices"][0]["logprobs"]["content"]
    assert [c["token"] for c in content] == plain["logprobs"]["tokens"]
    assert [c["logprob"] for c in content] == pytest.approx(plain["logprobs"]["token_logprobs"], abs=1e-5)
    for c, top in zip(content, plain["logprobs"]["top_logprobs"]):
        assert {t["token"]: t["logprob"] for t in c["top_logprobs"]} == pytest.approx(top, abs=1e-5)
        assert all(bytes(t["bytes"]).decode("utf-8", "replace") == t["token"] for t in c["top_logprobs"])
    assert chat["choices"][0]["message"] == {"role": "assistant", "content": plain["text"]}
    return text


def test_chat_prompts_are_transformers_renderings(server, run, hf_tokenizer, tmp_path):
    # The imported run's own template (tokenizer_config.json's, carried by loom convert --from hf).
    texts = [assert_rendered_as_transformers(server.url, hf_tokenizer, TURNS, c) for c in CONVERSATIONS[:2]]
    assert texts[1].startswith("<|endoftext|>[USER] Speak as Hamlet.\n\nTo be?\n[BOT] Or not to be.<|endoftext|>\n")
    # Templates given with --chat-template.
    for template in (BLOCKS, NAMED):
        path = tmp_path / "template.jinja"
        path.write_text(template)
        with Server(run, "--chat-template", path) as other:
            for conversation in CONVERSATIONS:
                assert_rendered_as_transformers(other.url, hf_tokenizer, template, conversation)


def test_chat_with_the_openai_client_streamed_and_not(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    messages = CONVERSATIONS[1]
    whole = client.chat.completions.create(model="run", messages=messages, max_tokens=12, temperature=0)
    assert whole.object == "chat.completion" and whole.choices[0].message.role == "assistant"
    assert whole.choices[0].finish_reason in ("length", "stop")
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens
    chunks = list(client.chat.completions.create(model="run", messages=messages, max_tokens=12, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    finished = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finished == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    # Streamed log-probabilities add up to the whole response's.
    body = {"messages": messages, "max_tokens": 12, "temperature": 0, "logprobs": True, "top_logprobs": 1}
    full = post(server.url, "/v1/chat/completions", body)["choices"][0]["logprobs"]["content"]
    streamed = []
    with requests.post(server.url + "/v1/chat/completions", json={**body, "stream": True}, stream=True,
                       timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith(b"data: {"):
                choice = json.loads(line[6:])["choices"][0]
                streamed += (choice["logprobs"] or {}).get("content", [])
    assert [e["token"] for e in streamed] == [e["token"] for e in full]
    assert [e["logprob"] for e in streamed] == pytest.approx([e["logprob"] for e in full], abs=1e-6)


BAD_CHATS = [
    ("no messages", {}, "messages"),
    ("empty messages", {"messages": []}, "messages"),
    ("a message not an object", {"messages": ["hi"]}, "messages[0]"),
    ("no role", {"messages": [{"content": "hi"}]}, "messages[0].role"),
    ("empty role", {"messages": [{"role": "", "content": "hi"}]}, "messages[0].role"),
    ("no content", {"messages": [{"role": "user"}]}, "messages[0].content"),
    ("content a number", {"messages": [{"role": "user", "content": 7}]}, "messages[0].content"),
    ("an image part", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content[0]"),
    ("tool calls", {"messages": [{"role": "assistant", "content": "x", "tool_calls": []}]}, "messages[0].tool_calls"),
    ("name a number", {"messages": [{"role": "user", "content": "hi", "name": 3}]}, "messages[0].name"),
    ("turns that do not alternate", {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]},
     "messages"),
    ("both budgets", {"messages": CONVERSATIONS[0], "max_tokens": 2, "max_completion_tokens": 2},
     "max_completion_tokens"),
    ("top_logprobs without logprobs", {"messages": CONVERSATIONS[0], "top_logprobs": 2}, "top_logprobs"),
    ("a budget past the context", {"messages": CONVERSATIONS[0], "max_tokens": CONTEXT}, "max_tokens"),
    ("an unknown field", {"messages": CONVERSATIONS[0], "tools": []}, "tools"),
]


@pytest.mark.parametrize("name,body,field", BAD_CHATS, ids=[b[0] for b in BAD_CHATS])
def test_bad_chat_requests_name_the_field(server, name, body, field):
    r = requests.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field, r.text
    if name == "turns that do not alternate":
        assert "Turns must alternate" in r.json()["error"]["message"]
    post(server.url, "/v1/chat/completions", {"messages": CONVERSATIONS[0], "max_tokens": 1})  # still serving


@pytest.fixture(scope="module")
def plain_server(trained):
    """The trained run itself (no chat template), default flags."""
    with Server(trained) as s:
        yield s


def test_a_checkpoint_without_a_chat_template_refuses_chat(plain_server):
    r = requests.post(plain_server.url + "/v1/chat/completions", json={"messages": CONVERSATIONS[0]}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
    assert "no chat template" in r.json()["error"]["message"]
    post(plain_server.url, "/v1/completions", {"prompt": "ROMEO:", "max_tokens": 2})


def scrape(url):
    r = requests.get(url + "/metrics", timeout=30)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    samples = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            key = s.name + "".join(f"{{{k}={v}}}" for k, v in sorted(s.labels.items()) if k != "le")
            if "le" in s.labels:
                key += f"[le={s.labels['le']}]"
            samples[key] = s.value
    return samples


def test_metrics_count_what_the_requests_did(server):
    before = scrape(server.url)
    assert before["loom:kv_cache_capacity_tokens"] == 8 * CONTEXT  # --max-batch 8 x the context
    bodies = [{"prompt": p, "max_tokens": n, "min_tokens": n, "temperature": 0}
              for p, n in (("ROMEO:", 6), ("To be, or not to be", 3), ("O", 1), ("What light", 9))]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda b: post(server.url, "/v1/completions", b), bodies))
    chat = post(server.url, "/v1/chat/completions", {"messages": CONVERSATIONS[0], "max_tokens": 4, "min_tokens": 4})
    usages = [a["usage"] for a in answers] + [chat["usage"]]
    after = scrape(server.url)

    def moved(name):
        return after[name] - before.get(name, 0)

    assert moved("loom:prompt_tokens_total") == sum(u["prompt_tokens"] for u in usages)
    assert moved("loom:generation_tokens_total") == sum(u["completion_tokens"] for u in usages) == 6 + 3 + 1 + 9 + 4
    assert moved("loom:requests_finished_total{finished_reason=length}") == 5
    assert moved("loom:time_to_first_token_seconds_count") == 5
    assert moved("loom:inter_token_latency_seconds_count") == 5 + 2 + 0 + 8 + 3
    assert moved("loom:e2e_request_latency_seconds_count") == 5
    assert after["loom:time_to_first_token_seconds_bucket[le=+Inf]"] == after["loom:time_to_first_token_seconds_count"]
    assert moved("loom:time_to_first_token_seconds_sum") > 0
    for gauge in ("loom:num_requests_running", "loom:num_requests_waiting", "loom:kv_cache_usage_tokens",
                  "loom:kv_cache_usage_perc"):
        assert after[gauge] == 0, gauge
    assert after["loom:open_connections"] >= 1  # the scrape's own


def test_metrics_report_the_prefix_cache_hits(server):
    before = scrape(server.url)
    prompt = "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer " * 2
    first, second = (post(server.url, "/v1/completions", {"prompt": prompt, "max_tokens": 1, "temperature": 0})
                     for _ in range(2))
    assert first["choices"][0]["text"] == second["choices"][0]["text"]
    tokens = first["usage"]["prompt_tokens"]
    after = scrape(server.url)
    hits = after["loom:prefix_cache_hits_total"] - before.get("loom:prefix_cache_hits_total", 0)
    queried = after["loom:prefix_cache_queries_total"] - before.get("loom:prefix_cache_queries_total", 0)
    # The second request finds the first one's full 16-token blocks (its last token is always
    # computed: at most (tokens - 1) // 16 blocks).
    assert hits >= 16 * ((tokens - 1) // 16) >= 16, (hits, tokens)
    assert queried >= 2 * tokens and 0 < after["loom:prefix_cache_hit_rate"] <= 1


def wait_until_idle(url):
    """Until the server holds no connection but the scrape's own (closed ones leave the count)."""
    for _ in range(50):
        if scrape(url)["loom:open_connections"] == 1:
            return
        time.sleep(0.1)
    raise AssertionError("connections stay open")


def test_max_connections_clients_at_once_are_served_and_one_more_gets_503(plain_server):
    n = 256  # the default --max-connections
    s = plain_server
    host, port = s.url[len("http://"):].split(":")
    wait_until_idle(s.url)
    barrier = threading.Barrier(n)

    def connect(_):
        barrier.wait()
        return socket.create_connection((host, int(port)), timeout=30)

    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        held = list(pool.map(connect, range(n)))  # none refused or reset
    try:
        time.sleep(0.5)  # every one accepted and counted
        extra = socket.create_connection((host, int(port)), timeout=30)
        extra.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while chunk := extra.recv(65536):
            answer += chunk
        extra.close()
        assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
        assert b"--max-connections" in answer

        def ask(sock):
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            got = b""
            while chunk := sock.recv(65536):
                got += chunk
            return got

        with concurrent.futures.ThreadPoolExecutor(64) as pool:
            answers = list(pool.map(ask, held))
        assert all(a.startswith(b"HTTP/1.1 200") for a in answers), [a[:40] for a in answers if b" 200" not in a[:20]]
    finally:
        for sock in held:
            sock.close()
    # A burst of n real clients, each on its own connection, all answered.
    wait_until_idle(s.url)
    barrier = threading.Barrier(n)

    def complete(i):
        barrier.wait()
        return requests.post(s.url + "/v1/completions", json={"prompt": "ROMEO:", "max_tokens": 1, "seed": i},
                             timeout=120).status_code

    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        assert list(pool.map(complete, range(n))) == [200] * n


def test_lm_eval_local_completions_gives_loom_evals_scores(server, run, hf_dir, tmp_path):
    """lm-evaluation-harness's own client on the served model = `loom eval` on the checkpoint."""
    import lm_eval
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(hf_dir))
    docs = []
    for line in (ROOT / "data" / "eval" / "shakespeare_lambada.jsonl").read_text().splitlines():
        # The harness sends context + continuation, at most max_length - 1 tokens.
        if len(tokenizer(json.loads(line)["text"])["input_ids"]) <= CONTEXT - 1:
            docs.append(line)
        if len(docs) == 16:
            break
    data = tmp_path / "lambada_fit.jsonl"
    data.write_text("\n".join(docs) + "\n")
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    harness_yaml = os.path.join(os.path.dirname(lm_eval.__file__), "tasks", "lambada", "lambada_openai.yaml")
    (tasks / "lambada_fit.yaml").write_text(textwrap.dedent(f"""\
        include: {harness_yaml}
        task: lambada_fit
        tag: []
        dataset_path: json
        dataset_name: null
        dataset_kwargs:
          data_files:
            test: {data}
        training_split: null
        validation_split: null
        test_split: test
        """))
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_DATASETS_CACHE=str(tmp_path / "datasets_cache"), TOKENIZERS_PARALLELISM="false")
    model_args = (f"model=run,base_url={server.url}/v1/completions,tokenizer_backend=huggingface,"
                  f"tokenizer={hf_dir},max_length={CONTEXT},num_concurrent=4,max_retries=1")
    if FULL:  # the harness's command line, as a user runs it
        harness_out = tmp_path / "harness"
        done = subprocess.run([os.path.join(os.path.dirname(sys.executable), "lm_eval"), "--model",
                               "local-completions", "--model_args", model_args, "--tasks", "lambada_fit",
                               "--include_path", str(tasks), "--output_path", str(harness_out), "--log_samples"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"lm_eval failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
        samples = [json.loads(line) for line in next(harness_out.rglob("samples_lambada_fit_*.jsonl")).read_text()
                   .splitlines()]
        results = json.loads(next(harness_out.rglob("results_*.json")).read_text())["results"]["lambada_fit"]
    else:  # its entry point behind the command line, without indexing the ~10,000 bundled task files
        out = tmp_path / "harness.json"
        script = textwrap.dedent(f"""\
            import json
            from lm_eval import simple_evaluate
            from lm_eval.tasks import TaskManager
            r = simple_evaluate(model="local-completions", model_args={model_args!r}, tasks=["lambada_fit"],
                                log_samples=True, task_manager=TaskManager(include_path={str(tasks)!r},
                                                                           include_defaults=False))
            json.dump({{"results": r["results"], "samples": r["samples"]["lambada_fit"]}}, open({str(out)!r}, "w"),
                      default=str)
            """)
        done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, f"lm_eval failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
        harness = json.loads(out.read_text())
        samples, results = harness["samples"], harness["results"]["lambada_fit"]
    theirs = {s["doc_id"]: s for s in samples}

    loom_out = tmp_path / "loom.json"
    done = subprocess.run([str(loom_binary()), "eval", "--checkpoint", str(run), "--tasks", f"lambada:{data}",
                           "--output", str(loom_out), "--log-samples", "--bootstrap-iters", "0"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    ours = [json.loads(line) for line in (tmp_path / "loom_samples_lambada_fit.jsonl").read_text().splitlines()]
    assert len(ours) == len(theirs) == len(docs)
    for mine in ours:
        other = theirs[mine["doc_id"]]
        assert mine["doc"] == other["doc"]
        assert mine["resps"][0][0] == pytest.approx(float(other["resps"][0][0][0]), rel=1e-5, abs=1e-4)
        assert str(bool(mine["resps"][0][1])) == str(other["resps"][0][0][1])  # the harness logs "True"
    loom_results = json.loads(loom_out.read_text())["results"]
    mine = next(iter(loom_results.values()))
    assert mine["acc,none"] == results["acc,none"]
    assert mine["perplexity,none"] == pytest.approx(results["perplexity,none"], rel=1e-4)


def test_bad_connection_limit_or_chat_template_exit_2_naming_them(trained, tmp_path):
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}")
    missing = tmp_path / "missing.jinja"
    for flags, needle in ((["--max-connections", 0], "--max-connections"),
                          (["--chat-template", broken], str(broken)),
                          (["--chat-template", missing], str(missing))):
        done = subprocess.run([str(loom_binary()), "serve", "--checkpoint", str(trained), "--port", "0",
                               *map(str, flags)], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and needle in done.stderr, (flags, done.returncode, done.stderr[-2000:])
