#!/usr/bin/env python3
"""Bandwidth of the loom ops beside ATen's equivalents and a plain copy.

    python tools/bench_ops.py --lib build/lib/libloom_ops.so [--device cuda] [--out FILE]

Prints a Markdown table (op, shape, loom ms and GB/s, ATen ms and GB/s, speedup, fraction
of copy bandwidth) and checks the LayerNorm targets: fused forward+backward >= 80% of copy
bandwidth and >= 1.2x ATen's layer_norm. GB/s counts the bytes an op must move at least
(each input read once, each output written once), so the copy column is the ceiling.
Shapes are GPT-3 175B's per tensor-parallel rank (t = 8, s = 2048, b = 4, h = 12288,
a = 96): tokens 8192 x hidden 12288, MLP 8192 x 6144, attention 12 heads x 2048 x 2048 per
sequence. --device cpu runs the same code at small shapes in seconds (a dry run).
"""
import argparse
import pathlib
import statistics
import sys
import time

import torch

HIDDEN_TARGET_COPY = 0.80
HIDDEN_TARGET_ATEN = 1.20


class Timer:
    def __init__(self, device, warmup, iters):
        self.device, self.warmup, self.iters = device, warmup, iters

    def __call__(self, fn, calls=10):
        """Median over samples of the milliseconds per fn() call; a sample times `calls`
        back-to-back calls so that host launch overhead overlaps the kernels."""
        for _ in range(self.warmup):
            fn()
        times = []
        for _ in range(self.iters):
            if self.device == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(calls):
                    fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / calls)
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)


def gbps(nbytes, ms):
    return nbytes / (ms * 1e-3) / 1e9


def run(device, dtype, full):
    L = torch.ops.loom
    timer = Timer(device, warmup=3 if full else 1, iters=10 if full else 2)
    tokens, hidden, ffn = (8192, 12288, 6144) if full else (256, 1024, 512)
    heads, seq = (12, 2048) if full else (2, 128)
    esize = torch.tensor([], dtype=dtype).element_size()
    gen = torch.Generator(device=device).manual_seed(0)

    def rnd(*shape, dt=dtype):
        return torch.randn(*shape, device=device, dtype=dt, generator=gen)

    rows = []

    def row(name, shape, nbytes, loom_ms, aten_ms):
        rows.append(dict(op=name, shape=shape, bytes=nbytes, loom_ms=loom_ms, aten_ms=aten_ms))

    # copy bandwidth: read + write of a [tokens, hidden] tensor
    x = rnd(tokens, hidden)
    y = torch.empty_like(x)
    n = x.numel()
    copy_ms = timer(lambda: y.copy_(x))
    copy_gbps = gbps(2 * n * esize, copy_ms)

    # LayerNorm
    w, b = rnd(hidden), rnd(hidden)
    dy = rnd(tokens, hidden)
    shape = f"[{tokens}, {hidden}]"
    out, mean, rstd = L.layer_norm(x, w, b, 1e-5)
    loom_f = timer(lambda: L.layer_norm(x, w, b, 1e-5))
    aten_f = timer(lambda: torch.ops.aten.native_layer_norm(x, [hidden], w, b, 1e-5))
    row("layer_norm fwd", shape, 2 * n * esize, loom_f, aten_f)
    _, amean, arstd = torch.ops.aten.native_layer_norm(x, [hidden], w, b, 1e-5)

    def loom_fb():
        _, m, r = L.layer_norm(x, w, b, 1e-5)
        L.layer_norm_backward(dy, x, w, m, r)

    def aten_fb():
        _, m, r = torch.ops.aten.native_layer_norm(x, [hidden], w, b, 1e-5)
        torch.ops.aten.native_layer_norm_backward(dy, x, [hidden], m, r, w, b, [True, True, True])

    ln_fb_bytes = 5 * n * esize  # fwd: x, y; bwd: x, dy, dx
    loom_fb_ms, aten_fb_ms = timer(loom_fb), timer(aten_fb)
    row("layer_norm fwd+bwd", shape, ln_fb_bytes, loom_fb_ms, aten_fb_ms)

    # bias + dropout + residual (hidden dropout), p = 0.1
    res = rnd(tokens, hidden)
    row("bias_dropout_add fwd", shape, 3 * n * esize,
        timer(lambda: L.bias_dropout_add(x, b, res, 0.1, 1, 2, [], [])),
        timer(lambda: res + torch.nn.functional.dropout(x + b, 0.1, True)))
    row("dropout (= its backward)", shape, 2 * n * esize,
        timer(lambda: L.dropout(x, 0.1, 1, 2, [], [])),
        timer(lambda: torch.nn.functional.dropout(x, 0.1, True)))

    # bias + GeLU on the MLP's fc1 output
    h = rnd(tokens, ffn)
    hb, hg = rnd(ffn), rnd(tokens, ffn)
    nh = h.numel()
    row("bias_gelu fwd", f"[{tokens}, {ffn}]", 2 * nh * esize,
        timer(lambda: L.bias_gelu(h, hb)),
        timer(lambda: torch.nn.functional.gelu(h + hb, approximate="tanh")))
    row("bias_gelu bwd", f"[{tokens}, {ffn}]", 3 * nh * esize,
        timer(lambda: L.bias_gelu_backward(hg, h, hb)),
        timer(lambda: torch.ops.aten.gelu_backward(hg, h + hb, approximate="tanh")))

    # causal scaled softmax on attention scores of one sequence
    s = rnd(1, heads, seq, seq)
    ns = s.numel()
    causal = torch.ones(seq, seq, dtype=torch.bool, device=device).triu(1)
    sshape = f"[1, {heads}, {seq}, {seq}]"
    probs = L.scaled_masked_softmax(s, None, 0.088, True)
    row("scaled_masked_softmax fwd (causal)", sshape, 2 * ns * esize,
        timer(lambda: L.scaled_masked_softmax(s, None, 0.088, True)),
        timer(lambda: torch.softmax((s * 0.088).masked_fill(causal, float("-inf")), -1)))
    row("scaled_masked_softmax bwd", sshape, 3 * ns * esize,
        timer(lambda: L.scaled_masked_softmax_backward(s, probs, 0.088)),
        timer(lambda: torch.ops.aten._softmax_backward_data(s, probs, -1, dtype) * 0.088))

    lines = []
    lines.append(f"## loom_ops bandwidth on {device_name(device)} ({dtype})\n")
    lines.append(f"copy bandwidth (y.copy_(x), [{tokens}, {hidden}]): {copy_ms:.3f} ms, "
                 f"{copy_gbps:.0f} GB/s\n")
    lines.append("| op | shape | loom ms | loom GB/s | ATen ms | ATen GB/s | loom / ATen speed | loom / copy |")
    lines.append("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        lg, ag = gbps(r["bytes"], r["loom_ms"]), gbps(r["bytes"], r["aten_ms"])
        lines.append(f"| {r['op']} | {r['shape']} | {r['loom_ms']:.3f} | {lg:.1f} | "
                     f"{r['aten_ms']:.3f} | {ag:.1f} | {r['aten_ms'] / r['loom_ms']:.2f}x | "
                     f"{lg / copy_gbps:.0%} |")
    ln_copy = gbps(ln_fb_bytes, loom_fb_ms) / copy_gbps
    ln_aten = aten_fb_ms / loom_fb_ms
    ok = ln_copy >= HIDDEN_TARGET_COPY and ln_aten >= HIDDEN_TARGET_ATEN
    lines.append("")
    lines.append(f"LayerNorm fwd+bwd: {ln_copy:.0%} of copy bandwidth (target >= "
                 f"{HIDDEN_TARGET_COPY:.0%}): {'met' if ln_copy >= HIDDEN_TARGET_COPY else 'NOT met'}; "
                 f"{ln_aten:.2f}x ATen (target >= {HIDDEN_TARGET_ATEN:.1f}x): "
                 f"{'met' if ln_aten >= HIDDEN_TARGET_ATEN else 'NOT met'}")
    if not full:
        lines.append("(dry run at small shapes: the numbers say nothing about a GPU)")
    return "\n".join(lines) + "\n", ok


def device_name(device):
    if device == "cuda":
        return torch.cuda.get_device_name()
    return "cpu"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", required=True, help="path of libloom_ops.so")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--out", help="also write the table to this file")
    args = ap.parse_args()
    lib = pathlib.Path(args.lib)
    if not lib.exists():
        print(f"bench_ops: {lib} does not exist (build the op library first)", file=sys.stderr)
        return 2
    torch.ops.load_library(str(lib))
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_ops: --device cuda but torch sees no GPU", file=sys.stderr)
        return 2
    with torch.no_grad():
        text, ok = run(args.device, getattr(torch, args.dtype), full=args.device == "cuda")
    print(text)
    if args.out:
        with open(args.out, "a") as f:
            f.write(text)
    return 0 if ok or args.device != "cuda" else 3


if __name__ == "__main__":
    sys.exit(main())
