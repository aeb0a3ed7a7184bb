#!/usr/bin/env python3
"""Serving benchmark (issue 30's peers, docs/serving.md "Beside the peers"): `loom serve`,
llama.cpp's `llama-server` and transformers on the same weights (a seeded random GPT-2 of the
chosen shape, tools/serve_peers.py), the same prompts and the same threads, in one run.

  .venv/bin/python tools/bench_serve.py [--shape tiny|gpt2-small] [--threads 2]
      [--concurrency 1,4,16,64] [--requests 64] [--prompt-tokens 32] [--output-tokens 32]
      [--workloads clients,shared-prefix,long-among-short,repetitive]
      [--llama-server PATH --llama-cpp DIR] [--skip-transformers] [--json FILE]
      [--speculative-tokens 4] [--keep]

Workloads (every request asks for exactly its output tokens: min_tokens on Loom, ignore_eos on
llama.cpp, min_new_tokens in transformers; greedy):
- clients: N concurrent streaming clients (each level of --concurrency), beside transformers'
  `generate` one request at a time, in static batches of 16, and its continuous batching
  (`generate_batch`) where the installed version has it;
- shared-prefix: 32 requests sharing a 512-token system prompt, 4 at a time: TTFT with Loom's
  prefix caching on and off (llama.cpp: its prompt cache);
- long-among-short: 8 decoding clients, then one 900-token prompt joins: the decoders' longest
  gap between two streamed tokens (a stall) and their per-token p99;
- repetitive: prompts that repeat a phrase, Loom without and with prompt-lookup (n-gram)
  speculation (`--speculative-method ngram`).
The first prompt's greedy text is compared across the three: a check of the weight mapping.
The llama.cpp rows need --llama-server (the built binary) and --llama-cpp (its source, for
convert_hf_to_gguf.py); without them they are left out and the table says so."""
import argparse
import concurrent.futures
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))
sys.path.insert(0, str(ROOT / "tools"))

import requests  # noqa: E402

from serve_helpers import Server  # noqa: E402
import serve_peers  # noqa: E402

SYSTEM_PROMPT_TOKENS = 512
LONG_PROMPT_TOKENS = 900


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))] if xs else float("nan")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Peer:
    """A server under test: its URL and the request fields that force exactly n output tokens."""

    def __init__(self, name, url, force):
        self.name, self.url, self.force = name, url, force

    def payload(self, prompt, n):
        return {"prompt": prompt, "max_tokens": n, "temperature": 0, "stream": True, **self.force(n)}


def loom_peer(url):
    return Peer("loom serve", url, lambda n: {"min_tokens": n})


def llama_peer(url, cache_prompt=True):
    return Peer("llama.cpp server", url, lambda n: {"ignore_eos": True, "cache_prompt": cache_prompt})


def stream_one(peer, prompt, n):
    """One streamed completion: start, the arrival time of every streamed piece, and the text."""
    start = time.perf_counter()
    arrivals, text = [], ""
    with requests.post(peer.url + "/v1/completions", stream=True, timeout=900, json=peer.payload(prompt, n)) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                arrivals.append(time.perf_counter())
                text += chunk["choices"][0]["text"]
    return {"start": start, "arrivals": arrivals, "text": text, "tokens": n}


def summarize(results, wall):
    """requests/s, output tokens/s, TTFT and per-token latency (a request's mean time per token
    after its first), and the longest gap between two streamed pieces."""
    done = [r for r in results if r["arrivals"]]
    return {"rps": len(results) / wall, "tps": sum(r["tokens"] for r in results) / wall,
            "ttft": [r["arrivals"][0] - r["start"] for r in done],
            "tpot": [(r["arrivals"][-1] - r["arrivals"][0]) / max(r["tokens"] - 1, 1) for r in done],
            "max_gap": max((b - a for r in done for a, b in zip(r["arrivals"], r["arrivals"][1:])), default=0.0)}


def run_clients(peer, prompts, n, concurrency):
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda p: stream_one(peer, p, n), prompts))
    return summarize(results, time.perf_counter() - start)


def bench_transformers_static(model, prompt_ids, n, batch):
    import torch
    ttft, tpot, tokens = [], [], 0
    generating = 0.0  # seconds of the n-token generate calls: the figures' wall time
    with torch.inference_mode():
        for i in range(0, len(prompt_ids), batch):
            ids = torch.tensor(prompt_ids[i:i + batch])  # host: bench input
            kw = dict(attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0)
            # TTFT: a 1-token generate of the same batch, timed apart and not in the wall time.
            t0 = time.perf_counter()
            model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw)
            first = time.perf_counter() - t0
            t1 = time.perf_counter()
            out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)  # equal lengths: no padding
            whole = time.perf_counter() - t1
            generating += whole
            ttft += [first] * ids.shape[0]
            tpot += [max(whole - first, 0.0) / max(n - 1, 1)] * ids.shape[0]
            tokens += (out.shape[1] - ids.shape[1]) * ids.shape[0]
    return {"rps": len(prompt_ids) / generating, "tps": tokens / generating, "ttft": ttft, "tpot": tpot}


def bench_transformers_continuous(model, prompt_ids, n):
    """transformers' own continuous batching (GenerationMixin.generate_batch): throughput only."""
    import transformers
    config = transformers.GenerationConfig(max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=-1,
                                           pad_token_id=0)
    start = time.perf_counter()
    out = model.generate_batch(inputs=[list(p) for p in prompt_ids], generation_config=config, progress_bar=False)
    wall = time.perf_counter() - start
    tokens = sum(len(r.generated_tokens) for r in out.values())
    return {"rps": len(prompt_ids) / wall, "tps": tokens / wall, "ttft": [], "tpot": []}


def ms(x):
    return f"{1000 * x:.0f}" if x == x else "-"


def row(name, r):
    return (f"| {name} | {r['rps']:.2f} | {r['tps']:.1f} | {ms(percentile(r['ttft'], 50))} | "
            f"{ms(percentile(r['ttft'], 99))} | {1000 * percentile(r['tpot'], 50):.1f} | "
            f"{1000 * percentile(r['tpot'], 99):.1f} |")


HEADER = ("| side | requests/s | output tokens/s | TTFT p50 ms | TTFT p99 ms | per-token p50 ms | per-token p99 ms |\n"
          "|---|---|---|---|---|---|---|")


def tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    tok = Tokenizer(models.BPE.from_file(str(ROOT / "data" / "gpt2-vocab.json"), str(ROOT / "data" / "gpt2-merges.txt")))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


class Bench:
    def __init__(self, args, tmp):
        self.args, self.tmp = args, tmp
        self.tok = tokenizer()
        self.corpus = self.tok.encode((ROOT / "data" / "tinyshakespeare.txt").read_text()).ids
        self.hf_dir = serve_peers.make_weights(tmp / "hf", args.shape)
        self.run = serve_peers.import_into_loom(self.hf_dir, tmp / "loom")
        self.gguf = None
        if args.llama_server:
            self.gguf = serve_peers.to_gguf(self.hf_dir, args.llama_cpp, tmp / "model-f32.gguf")
        self.results = {}
        self.env = {"OMP_NUM_THREADS": str(args.threads)}

    def prompts(self, count, length, offset=0):
        """`count` token-id prompts of `length` tokens from the corpus (from token `offset`, 997
        apart, wrapping around), decoded to text (the servers take text)."""
        stride, span = 997, len(self.corpus) - length
        if span <= 0:
            raise ValueError(f"prompts of {length} tokens do not fit the {len(self.corpus)}-token corpus")
        starts = [(offset + i * stride) % span for i in range(count)]
        ids = [self.corpus[s:s + length] for s in starts]
        assert all(len(p) == length for p in ids)
        return ids, [self.tok.decode(p) for p in ids]

    def loom(self, *flags):
        return Server(self.run, "--max-batch", self.args.max_batch, *flags, env=self.env)

    def llama(self, slots, extra=()):
        return serve_peers.LlamaServer(self.args.llama_server, self.gguf, slots, self.args.threads, free_port(),
                                       self.tmp, extra)

    def record(self, workload, name, r):
        self.results.setdefault(workload, {})[name] = {k: v for k, v in r.items()}
        print(row(name, r), flush=True)

    def clients(self):
        a = self.args
        levels = [int(c) for c in a.concurrency.split(",")]
        ids, texts = self.prompts(a.requests, a.prompt_tokens)
        print(f"\n### clients: {a.requests} requests per level, {a.prompt_tokens} prompt + {a.output_tokens} output "
              f"tokens\n\n{HEADER}")
        first = {}
        # Each level sends prompts of its own, so no side starts a level with the previous
        # level's prompts in its cache.
        level_texts = {c: self.prompts(a.requests, a.prompt_tokens, offset=1 + k * 31)[1] for k, c in enumerate(levels)}
        with self.loom() as server:
            peer = loom_peer(server.url)
            first["loom serve"] = stream_one(peer, texts[0], a.output_tokens)["text"]
            for c in levels:
                self.record("clients", f"loom serve, {c} clients", run_clients(peer, level_texts[c], a.output_tokens, c))
        if self.gguf:
            with self.llama(max(levels)) as server:
                peer = llama_peer(server.url)
                first["llama.cpp server"] = stream_one(peer, texts[0], a.output_tokens)["text"]
                for c in levels:
                    self.record("clients", f"llama.cpp server, {c} clients",
                                run_clients(peer, level_texts[c], a.output_tokens, c))
        else:
            print("| llama.cpp server | not run: no --llama-server | | | | | |")
        if not a.skip_transformers:
            import torch
            model = serve_peers.load_transformers(self.hf_dir, a.threads)
            with torch.inference_mode():
                out = model.generate(torch.tensor([ids[0]]), max_new_tokens=a.output_tokens,  # host: bench input
                                     min_new_tokens=a.output_tokens, do_sample=False, pad_token_id=0)[0]
            first["transformers"] = self.tok.decode(out[len(ids[0]):].tolist())
            some = ids[:min(a.requests, 32)]
            self.record("clients", "transformers generate, 1 at a time",
                        bench_transformers_static(model, some, a.output_tokens, 1))
            self.record("clients", "transformers generate, static batches of 16",
                        bench_transformers_static(model, some, a.output_tokens, 16))
            if hasattr(model, "generate_batch"):
                try:
                    self.record("clients", "transformers generate_batch (continuous)",
                                bench_transformers_continuous(model, ids, a.output_tokens))
                except Exception as e:  # an optional peer: its failure is reported, not fatal
                    print(f"| transformers generate_batch | failed: {type(e).__name__}: {str(e)[:120]} | | | | | |")
        texts_seen = set(first.values())
        print(f"\nfirst prompt's greedy text: {'equal' if len(texts_seen) == 1 else 'DIFFERENT'} across "
              f"{', '.join(first)}")
        self.results["first_text_equal"] = len(texts_seen) == 1

    def shared_prefix(self):
        system_ids, _ = self.prompts(1, SYSTEM_PROMPT_TOKENS, offset=50000)
        ids, _ = self.prompts(32, 16)
        texts = [self.tok.decode(system_ids[0] + p) for p in ids]
        print(f"\n### shared-prefix: 32 requests, a {SYSTEM_PROMPT_TOKENS}-token system prompt + 16 tokens, "
              f"8 output tokens, 4 at a time\n\n{HEADER}")
        for name, flags in [("loom serve, prefix caching", ()), ("loom serve, no prefix caching",
                                                                  ("--no-prefix-caching",))]:
            with self.loom(*flags) as server:
                self.record("shared-prefix", name, run_clients(loom_peer(server.url), texts, 8, 4))
        if self.gguf:
            for name, cache in [("llama.cpp server, prompt cache", True), ("llama.cpp server, no prompt cache", False)]:
                with self.llama(4) as server:
                    self.record("shared-prefix", name, run_clients(llama_peer(server.url, cache), texts, 8, 4))

    def long_among_short(self):
        _, short = self.prompts(8, 32)
        _, long_prompt = self.prompts(1, LONG_PROMPT_TOKENS, offset=20000)
        print(f"\n### long-among-short: 8 clients decoding 64 tokens, a {LONG_PROMPT_TOKENS}-token prompt joins "
              f"after 0.5 s\n\n| side | decoders' longest gap ms | decoders' per-token p99 ms | long prompt's TTFT ms |\n"
              f"|---|---|---|---|")
        sides = [("loom serve", self.loom, loom_peer)]
        if self.gguf:
            sides.append(("llama.cpp server", lambda: self.llama(9), llama_peer))
        for name, start, make_peer in sides:
            with start() as server:
                peer = make_peer(server.url)
                with concurrent.futures.ThreadPoolExecutor(9) as pool:
                    decoders = [pool.submit(stream_one, peer, p, 64) for p in short]
                    time.sleep(0.5)
                    long_one = pool.submit(stream_one, peer, long_prompt[0], 4).result()
                    got = summarize([d.result() for d in decoders], 1.0)
                ttft = long_one["arrivals"][0] - long_one["start"]
                self.results.setdefault("long-among-short", {})[name] = {"max_gap": got["max_gap"], "ttft": ttft,
                                                                         "tpot_p99": percentile(got["tpot"], 99)}
                print(f"| {name} | {1000 * got['max_gap']:.0f} | {1000 * percentile(got['tpot'], 99):.1f} | "
                      f"{1000 * ttft:.0f} |", flush=True)

    def repetitive(self):
        """Text whose continuation is in its context (a form, a list, code): prompts that repeat a
        12-token phrase of the corpus, greedy, the same server without and with prompt-lookup
        (n-gram) speculation; the drafted and accepted counts from /metrics."""
        a = self.args
        phrases, _ = self.prompts(16, 12, offset=5000)
        prompts = [(p * (a.prompt_tokens // 12 + 1))[:a.prompt_tokens] for p in phrases]
        texts = [self.tok.decode(p) for p in prompts]
        print(f"\n### repetitive: 16 requests, a 12-token phrase repeated to {a.prompt_tokens} tokens, 64 output "
              f"tokens, 4 at a time; speculation: ngram, {a.speculative_tokens} tokens\n\n{HEADER}")
        first = {}
        for name, flags in [("loom serve", ()), ("loom serve, ngram speculation",
                                                 ("--speculative-method", "ngram", "--num-speculative-tokens",
                                                  a.speculative_tokens))]:
            with self.loom(*flags) as server:
                peer = loom_peer(server.url)
                first[name] = stream_one(peer, texts[0], 64)["text"]
                before = spec_counters(server.url)
                self.record("repetitive", name, run_clients(peer, texts, 64, 4))
                drafted, accepted = (x - y for x, y in zip(spec_counters(server.url), before))
        print(f"\nngram: {accepted:.0f} of {drafted:.0f} drafted tokens accepted ({accepted / max(drafted, 1):.2f}); "
              f"first prompt's greedy text {'equal' if len(set(first.values())) == 1 else 'DIFFERENT'} "
              f"with and without speculation")


def spec_counters(url):
    """(drafted, accepted) speculative tokens so far, from GET /metrics."""
    values = {}
    for line in requests.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("loom:spec_decode_num_"):
            name, value = line.split()
            values[name] = float(value)
    return (values.get("loom:spec_decode_num_draft_tokens_total", 0.0),
            values.get("loom:spec_decode_num_accepted_tokens_total", 0.0))


def ratios(results):
    """The issue's targets as measured ratios (None where a side did not run)."""
    c = results.get("clients", {})
    get = lambda name, key: c.get(name, {}).get(key)  # noqa: E731
    out = {}
    loom16, hf16, cpp16 = get("loom serve, 16 clients", "tps"), get(
        "transformers generate, static batches of 16", "tps"), get("llama.cpp server, 16 clients", "tps")
    if loom16 and hf16:
        out["16 clients: loom / transformers static-16 output tokens/s (target >= 1.5)"] = loom16 / hf16
    if loom16 and cpp16:
        out["16 clients: loom / llama.cpp output tokens/s (target >= 1.0)"] = loom16 / cpp16
    t16 = get("loom serve, 16 clients", "tpot")
    if t16:
        out["16 clients: loom per-token p99 / p50 (target <= 2)"] = percentile(t16, 99) / percentile(t16, 50)
    l1, c1 = get("loom serve, 1 clients", "tpot"), get("llama.cpp server, 1 clients", "tpot")
    if l1 and c1:
        out["1 client: loom / llama.cpp per-token p50 (target <= 1.2)"] = percentile(l1, 50) / percentile(c1, 50)
    h1 = get("transformers generate, 1 at a time", "ttft")
    if l1 and h1:
        out["1 client: loom / transformers TTFT p99 (target <= 1)"] = (
            percentile(get("loom serve, 1 clients", "ttft"), 99) / percentile(h1, 99))
    sp = results.get("shared-prefix", {})
    if "loom serve, prefix caching" in sp:
        out["shared prefix: TTFT p50 without / with caching (target >= 3)"] = (
            percentile(sp["loom serve, no prefix caching"]["ttft"], 50) /
            percentile(sp["loom serve, prefix caching"]["ttft"], 50))
    rep = results.get("repetitive", {})
    if len(rep) == 2:
        plain, spec = rep["loom serve"]["tps"], [v for k, v in rep.items() if k != "loom serve"][0]["tps"]
        out["repetitive: with / without speculation output tokens/s (target >= 1.5)"] = spec / plain
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(serve_peers.SHAPES), default="gpt2-small")
    ap.add_argument("--concurrency", default="1,4,16,64")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--requests", type=int, default=64, help="requests per concurrency level")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--workloads", default="clients,shared-prefix,long-among-short,repetitive")
    ap.add_argument("--llama-server", type=pathlib.Path, help="llama.cpp's built llama-server")
    ap.add_argument("--llama-cpp", type=pathlib.Path, help="llama.cpp's source (convert_hf_to_gguf.py, gguf-py)")
    ap.add_argument("--skip-transformers", action="store_true")
    ap.add_argument("--speculative-tokens", type=int, default=4, help="drafted tokens per step (repetitive workload)")
    ap.add_argument("--json", type=pathlib.Path, help="write every measured figure here")
    ap.add_argument("--keep", action="store_true", help="keep the weights, the Loom run and the GGUF (printed path)")
    args = ap.parse_args()
    if bool(args.llama_server) != bool(args.llama_cpp):
        ap.error("--llama-server and --llama-cpp go together")

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="loom_bench_serve_"))
    try:
        run_bench(args, tmp)
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def run_bench(args, tmp):
    bench = Bench(args, tmp)
    layers, hidden, heads = serve_peers.SHAPES[args.shape]
    print(f"model: random GPT-2 '{args.shape}' ({layers} layers, hidden {hidden}, {heads} heads), fp32; "
          f"{args.threads} threads per side; {os.cpu_count()} cores")
    for name in args.workloads.split(","):
        getattr(bench, name.replace("-", "_"))()
    print("\n### ratios\n")
    for k, v in ratios(bench.results).items():
        print(f"- {k}: {v:.2f}")
    if args.json:
        args.json.write_text(json.dumps(bench.results, indent=1))


if __name__ == "__main__":
    main()
