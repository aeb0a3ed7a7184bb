#!/usr/bin/env python3
"""Serving benchmark: `loom serve` driven by N concurrent streaming clients (1 ... 64) on a fixed
request mix, beside the same model (same weights, converted in this script by `loom convert --to hf`)
through Hugging Face transformers' `generate` in one process with the same threads, on the same
prompts. Prints one table row per concurrency: requests/s, output tokens/s, time to first token
and per-token latency (p50/p99), then the transformers rows (one request at a time, and static
batches of 16) on the weights `loom convert --to hf` wrote.

  .venv/bin/python tools/bench_serve.py [--checkpoint RUN] [--concurrency 1,4,16,64]
      [--prompt-tokens 32] [--output-tokens 32] [--requests 64] [--threads 2]

Without --checkpoint it trains a small model first (2 steps of recipes/gpt3_tiny_cpu.yaml at
hidden 256, 4 layers: the figures measure speed, not quality). Every request asks for exactly
--output-tokens greedy tokens (min_tokens = max_tokens), so both sides do the same work; the
first prompt's greedy tokens are compared between the two, as a check of the weight mapping.

  .venv/bin/python tools/bench_serve.py --speculation [--checkpoint RUN] [--concurrency 1,4]
      [--num-speculative-tokens 4]

runs only the repetitive-text workload (prompts that repeat a phrase) on the same server
without and with `--speculative-method ngram` and prints both rows per level, the acceptance
and the ratio of output tokens/s."""
import argparse
import concurrent.futures
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))

import requests  # noqa: E402
import torch  # noqa: E402

from serve_helpers import Server  # noqa: E402


def train_small(out):
    """A 4-layer, hidden-256 GPT trained for 2 steps on the bundled corpus."""
    from test_data_helpers import preprocess
    prefix = out / "corpus"
    done = preprocess(ROOT / "data" / "tinyshakespeare.txt", prefix, "--append-eod")
    assert done.returncode == 0, done.stderr
    run = out / "run"
    overrides = [f"exp_manager.explicit_log_dir={run}", "trainer.devices=1", "trainer.max_steps=2",
                 "trainer.val_check_interval=2", "trainer.limit_val_batches=1",
                 "exp_manager.checkpoint_callback_params.every_n_steps=2", "model.num_layers=4",
                 "model.hidden_size=256", "model.ffn_hidden_size=1024", "model.num_attention_heads=8",
                 "model.encoder_seq_length=256", "model.micro_batch_size=1", "model.global_batch_size=2",
                 "model.tensor_model_parallel_size=1", "model.pipeline_model_parallel_size=1",
                 "model.optim.sched.warmup_steps=1", f"model.data.data_prefix=[1.0,{prefix}_text_document]"]
    from test_data_helpers import loom_binary
    done = subprocess.run([str(loom_binary()), "train", str(ROOT / "recipes" / "gpt3_tiny_cpu.yaml"), *overrides],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    return run


def hf_model(run, out, threads):
    """The run's weights as a Hugging Face GPT2LMHeadModel: `loom convert --to hf` writes the
    directory (QKV regrouped, Conv1D transposed, vocabulary padding trimmed), transformers
    loads it."""
    import transformers
    from test_data_helpers import loom_binary
    done = subprocess.run([str(loom_binary()), "convert", "--to", "hf", str(out), "--checkpoint", str(run)], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    torch.set_num_threads(threads)
    return transformers.GPT2LMHeadModel.from_pretrained(str(out), torch_dtype=torch.float32).eval()


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))] if xs else float("nan")


def stream_one(url, prompt, n):
    """One streamed completion: (time to first token, per-token latency after it, tokens, text)."""
    start = time.perf_counter()
    first, text = None, ""
    with requests.post(url + "/v1/completions", stream=True, timeout=600,
                       json={"prompt": prompt, "max_tokens": n, "min_tokens": n, "temperature": 0, "stream": True,
                             "stream_options": {"include_usage": True}}) as r:
        r.raise_for_status()
        usage = None
        for line in r.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            if chunk["choices"] and first is None:
                first = time.perf_counter()
            if chunk["choices"]:
                text += chunk["choices"][0]["text"]
    end = time.perf_counter()
    tokens = usage["completion_tokens"]
    return first - start, (end - first) / max(tokens - 1, 1), tokens, text


def bench_server(url, prompts, n, concurrency, total):
    jobs = [prompts[i % len(prompts)] for i in range(total)]
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda p: stream_one(url, p, n), jobs))
    wall = time.perf_counter() - start
    ttft = [r[0] for r in results]
    tpot = [r[1] for r in results]
    return {"rps": total / wall, "tps": sum(r[2] for r in results) / wall, "ttft": ttft, "tpot": tpot}


def bench_hf(model, prompts, n, batch, total):
    ttft, tpot, tokens = [], [], 0
    start = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, total, batch):
            ids = torch.tensor([prompts[(i + k) % len(prompts)] for k in range(min(batch, total - i))])  # host: bench input
            t0 = time.perf_counter()
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=1, min_new_tokens=1, do_sample=False,
                           pad_token_id=0)
            t1 = time.perf_counter()
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                                 do_sample=False, pad_token_id=0)  # equal lengths: no padding
            t2 = time.perf_counter()
            # The first-token run is repeated inside the full one; per-token latency excludes it.
            ttft += [t1 - t0] * ids.shape[0]
            tpot += [(t2 - t0 - (t1 - t0) * 1) / max(n - 1, 1)] * ids.shape[0]
            tokens += (out.shape[1] - ids.shape[1]) * ids.shape[0]
    wall = time.perf_counter() - start
    return {"rps": total / wall, "tps": tokens / wall, "ttft": ttft, "tpot": tpot}


def row(name, r):
    ms = lambda x: 1000 * x  # noqa: E731
    return (f"| {name} | {r['rps']:.2f} | {r['tps']:.1f} | {ms(percentile(r['ttft'], 50)):.0f} | "
            f"{ms(percentile(r['ttft'], 99)):.0f} | {ms(percentile(r['tpot'], 50)):.1f} | "
            f"{ms(percentile(r['tpot'], 99)):.1f} |")


def spec_counters(url):
    """(drafted, accepted) tokens so far, from GET /metrics."""
    values = {}
    for line in requests.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("loom:spec_decode_num_"):
            name, value = line.split()
            values[name] = float(value)
    return (values.get("loom:spec_decode_num_draft_tokens_total", 0.0),
            values.get("loom:spec_decode_num_accepted_tokens_total", 0.0))


def bench_speculation(run, ids, args, levels):
    """The repetitive-text workload: prompts that are a 12-token phrase of the corpus repeated
    (a form, a list, code: text whose continuation is in its context), greedy, the same server
    without and with prompt-lookup speculation; output tokens/s and the ratio per level."""
    prompts = []
    for i in range(16):
        phrase = ids[i * 997 + 5000: i * 997 + 5012]
        prompts.append((phrase * (args.prompt_tokens // len(phrase) + 1))[:args.prompt_tokens])
    print(f"repetitive workload: model {run}, {args.prompt_tokens} prompt tokens (a 12-token phrase repeated), "
          f"{args.output_tokens} greedy output tokens, {args.requests} requests per level, {args.threads} threads")
    print("| server, clients | requests/s | output tokens/s | TTFT p50 ms | TTFT p99 ms | per-token p50 ms | "
          "per-token p99 ms |")
    print("|---|---|---|---|---|---|---|")
    env = {"OMP_NUM_THREADS": str(args.threads)}
    results, texts = {}, {}
    for name, flags in (("plain", ()), ("ngram", ("--speculative-method", "ngram", "--num-speculative-tokens",
                                                  args.num_speculative_tokens))):
        with Server(run, "--max-batch", args.max_batch, *flags, env=env) as server:
            texts[name] = stream_one(server.url, prompts[0], args.output_tokens)[3]
            before = spec_counters(server.url)
            for c in levels:
                r = bench_server(server.url, prompts, args.output_tokens, c, args.requests)
                results[(name, c)] = r
                print(row(f"loom serve {name}, {c}", r), flush=True)
            drafted, accepted = (a - b for a, b in zip(spec_counters(server.url), before))
            if name == "ngram":
                print(f"ngram: {accepted:.0f} of {drafted:.0f} drafted tokens accepted "
                      f"({accepted / max(drafted, 1):.2f})")
    for c in levels:
        ratio = results[("ngram", c)]["tps"] / results[("plain", c)]["tps"]
        print(f"{c} clients: speculation gives {ratio:.2f}x the output tokens/s")
    print(f"first prompt's greedy text {'equal' if texts['plain'] == texts['ngram'] else 'DIFFERENT'} "
          f"with and without speculation")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", type=pathlib.Path, help="a Loom run directory (default: train a small model)")
    ap.add_argument("--concurrency", default="1,4,16,64")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--requests", type=int, default=64, help="requests per concurrency level")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--speculation", action="store_true",
                    help="only the repetitive-text workload, without and with --speculative-method ngram")
    ap.add_argument("--num-speculative-tokens", type=int, default=4)
    args = ap.parse_args()

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="loom_bench_serve_"))
    run = args.checkpoint or train_small(tmp)
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    tok = Tokenizer(models.BPE.from_file(str(ROOT / "data" / "gpt2-vocab.json"), str(ROOT / "data" / "gpt2-merges.txt")))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = (ROOT / "data" / "tinyshakespeare.txt").read_text()[:200000]
    ids = tok.encode(text).ids
    prompts = [ids[i * 997: i * 997 + args.prompt_tokens] for i in range(16)]

    levels = [int(c) for c in args.concurrency.split(",")]
    if args.speculation:
        bench_speculation(run, ids, args, levels)
        return
    print(f"model {run}, {args.prompt_tokens} prompt tokens, {args.output_tokens} output tokens, "
          f"{args.requests} requests per level, {args.threads} threads")
    print("| clients | requests/s | output tokens/s | TTFT p50 ms | TTFT p99 ms | per-token p50 ms | per-token p99 ms |")
    print("|---|---|---|---|---|---|---|")
    env = {"OMP_NUM_THREADS": str(args.threads)}
    with Server(run, "--max-batch", args.max_batch, env=env) as server:
        served_first = stream_one(server.url, prompts[0], args.output_tokens)[3]
        for c in levels:
            print(row(f"loom serve, {c}", bench_server(server.url, prompts, args.output_tokens, c, args.requests)),
                  flush=True)
    if args.skip_hf:
        return
    model = hf_model(run, tmp / "hf", args.threads)
    with torch.inference_mode():
        hf_ids = model.generate(torch.tensor([prompts[0]]), max_new_tokens=args.output_tokens,  # host: bench input
                                min_new_tokens=args.output_tokens, do_sample=False, pad_token_id=0)[0]
    hf_text = tok.decode(hf_ids[args.prompt_tokens:].tolist())
    hf_requests = min(args.requests, 32)
    print(row("transformers generate, 1 at a time", bench_hf(model, prompts, args.output_tokens, 1, hf_requests)))
    print(row("transformers generate, batches of 16", bench_hf(model, prompts, args.output_tokens, 16, hf_requests)))
    print(f"first prompt's greedy text {'equal' if hf_text == served_first else 'DIFFERENT'} in loom serve and "
          f"transformers")


if __name__ == "__main__":
    main()
