#!/usr/bin/env python3
"""loom::paged_attention on CPU beside ATen's scaled_dot_product_attention on the same keys.

    python tools/bench_paged_attention.py --lib build/lib/libloom_ops.so [--threads 2]

Decode-step shapes of GPT-2 small (12 heads, head size 64, blocks of 16): `rows` requests each
attend one new query over `context` cached positions, the serving engine's step per layer; then
prefill chunks: one row's last `new` positions attend causally over its `context`.
The peer is SDPA over the same keys and values held contiguously per request ([rows, heads,
context, 64], made once, outside the timing): what an engine without paging would run. Both
outputs are compared before timing. Prints a Markdown table of milliseconds per call (median of
repeats); the CPU ISA of the loom kernel follows ATen's (ATEN_CPU_CAPABILITY lowers it).
"""
import argparse
import statistics
import time

import torch


def median_ms(fn, repeats=15, calls=20):
    for _ in range(3):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e3)
    return statistics.median(samples)


def case(rows, context, heads=12, d=64, block=16, dtype=torch.float32):
    blocks_per_row = (context + block - 1) // block
    pool = rows * blocks_per_row + 1
    keys = torch.randn(pool, heads, block, d, dtype=dtype)
    values = torch.randn(pool, heads, block, d, dtype=dtype)
    # Rows own shuffled, non-adjacent blocks, as a pool does after a while of serving.
    order = torch.randperm(pool - 1)[: rows * blocks_per_row] + 1
    tables = order.view(rows, blocks_per_row).to(torch.long)
    lens = torch.full((rows,), context, dtype=torch.long)
    q = torch.randn(rows, heads, 1, d, dtype=dtype)
    # Contiguous [rows, heads, context, d] copies for SDPA.
    k_rows = keys[tables].permute(0, 2, 1, 3, 4).reshape(rows, heads, blocks_per_row * block, d)[:, :, :context]
    v_rows = values[tables].permute(0, 2, 1, 3, 4).reshape(rows, heads, blocks_per_row * block, d)[:, :, :context]
    k_rows, v_rows = k_rows.contiguous(), v_rows.contiguous()
    scale = d ** -0.5
    loom = lambda: torch.ops.loom.paged_attention(q, keys, values, tables, lens, scale, None)
    sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(q, k_rows, v_rows, scale=scale)
    torch.testing.assert_close(loom(), sdpa(), rtol=1e-4, atol=1e-5)
    return median_ms(loom), median_ms(sdpa)


def prefill_case(new, context, heads=12, d=64, block=16):
    """One row whose last `new` positions are a prefill chunk (causal among themselves)."""
    blocks = (context + block - 1) // block
    keys = torch.randn(blocks + 1, heads, block, d)
    values = torch.randn(blocks + 1, heads, block, d)
    tables = (torch.randperm(blocks) + 1).view(1, blocks)
    lens = torch.tensor([context])
    q = torch.randn(1, heads, new, d)
    k_row = keys[tables[0]].permute(1, 0, 2, 3).reshape(1, heads, blocks * block, d)[:, :, :context].contiguous()
    v_row = values[tables[0]].permute(1, 0, 2, 3).reshape(1, heads, blocks * block, d)[:, :, :context].contiguous()
    # query i sits at position context - new + i and sees keys up to it
    mask = torch.arange(context).view(1, context) <= (context - new + torch.arange(new)).view(new, 1)
    scale = d ** -0.5
    loom = lambda: torch.ops.loom.paged_attention(q, keys, values, tables, lens, scale, None)
    sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(q, k_row, v_row, attn_mask=mask, scale=scale)
    torch.testing.assert_close(loom(), sdpa(), rtol=1e-4, atol=1e-5)
    return median_ms(loom, repeats=5, calls=3), median_ms(sdpa, repeats=5, calls=3)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", default="build/lib/libloom_ops.so")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", default="1,16", help="comma-separated requests per step")
    ap.add_argument("--contexts", default="96,512,2048", help="comma-separated cached positions")
    args = ap.parse_args()
    torch.ops.load_library(args.lib)
    torch.set_num_threads(args.threads)
    print(f"CPU capability (ATen): {torch.backends.cpu.get_cpu_capability()}, threads {args.threads}\n")
    print("| rows | context | loom paged ms | SDPA contiguous ms | loom / SDPA |")
    print("|---:|---:|---:|---:|---:|")
    for rows in map(int, args.rows.split(",")):
        for context in map(int, args.contexts.split(",")):
            ours, peer = case(rows, context)
            print(f"| {rows} | {context} | {ours:.3f} | {peer:.3f} | {ours / peer:.2f} |")
    print("\n| prefill chunk: new queries | context | loom paged ms | SDPA contiguous ms | loom / SDPA |")
    print("|---:|---:|---:|---:|---:|")
    for new, context in ((16, 96), (32, 64), (64, 128), (128, 256), (512, 900)):
        ours, peer = prefill_case(new, context)
        print(f"| {new} | {context} | {ours:.3f} | {peer:.3f} | {ours / peer:.2f} |")


if __name__ == "__main__":
    main()
