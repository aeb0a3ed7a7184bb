#!/usr/bin/env python3
"""Time of the op library's Llama ops beside the ATen compositions the model runs without them.

    python tools/bench_llama_ops.py --lib build/lib/libloom_ops.so [--device cpu|cuda]
                                    [--dtype float32|bfloat16] [--out FILE]

Prints a Markdown table: per op, forward and forward+backward (through autograd, as in
training) milliseconds of loom::rms_norm / loom::rotary / loom::swiglu and of the compositions
csrc/model uses when model.persist_layer_norm / apply_rope_fusion / bias_activation_fusion are
false (rms_norm.cpp, rotary.cpp's apply_rotary, mlp.cpp's unflatten + silu + mul), and the
speedup. Shapes: TinyLlama 1.1B (hidden 2048, 32 heads of 64, 4 K/V heads, ffn 5632) on one
micro-batch of 2 x 512 tokens; RoPE is timed on the query and on the key heads, views of the
QKV projection taken as attention.cpp takes them (forward+backward includes the views' backward). Medians of --iters timed calls after warm-up.
"""
import argparse
import pathlib
import statistics
import sys
import time

import torch

HIDDEN, HEADS, GROUPS, HEAD_DIM, FFN = 2048, 32, 4, 64, 5632
BATCH, SEQ = 2, 512


def median_ms(fn, device, warmup, iters):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def rms_norm_aten(x, w, eps):  # csrc/model/rms_norm.cpp
    x32 = x.float()
    return w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rotary_aten(x, cos, sin):  # csrc/model/rotary.cpp apply_rotary (full rotary)
    half = cos.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


def swiglu_aten(h):  # csrc/model/mlp.cpp without bias_activation_fusion
    h = h.unflatten(-1, (h.shape[-1] // 2, 2))
    return torch.nn.functional.silu(h[..., 0]) * h[..., 1]


def cases(device, dtype):
    L = torch.ops.loom
    g = torch.Generator().manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    tokens = SEQ * BATCH
    x, w = rnd(SEQ, BATCH, HIDDEN), rnd(HIDDEN)
    per_group = HEADS // GROUPS
    mixed = rnd(SEQ, BATCH, GROUPS, (per_group + 2) * HEAD_DIM)  # the QKV projection, per group

    # The views attention.cpp takes, taken inside the timed call: the gradient flows back into the
    # projection's output as in training, for the fused op and the composition alike.
    def q(m):
        return m[..., :per_group * HEAD_DIM].reshape(SEQ, BATCH, HEADS, HEAD_DIM).permute(1, 2, 0, 3)

    def k(m):
        return m[..., per_group * HEAD_DIM:(per_group + 1) * HEAD_DIM].permute(1, 2, 0, 3)

    pos = torch.arange(SEQ, dtype=torch.float32).expand(BATCH, SEQ)
    ang = pos[..., None] * (10000.0 ** (-torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM))
    both = torch.cat([ang, ang], -1)[:, None].to(device)
    cos, sin = both.cos().to(dtype), both.sin().to(dtype)
    h = rnd(SEQ, BATCH, 2 * FFN)
    return [
        (f"rms_norm [{tokens}, {HIDDEN}]", (x, w), lambda x, w: L.rms_norm(x, w, 1e-5)[0],
         lambda x, w: rms_norm_aten(x, w, 1e-5)),
        (f"rotary Q [{BATCH}, {HEADS}, {SEQ}, {HEAD_DIM}] (view of QKV)", (mixed,),
         lambda m: L.rotary(q(m), cos, sin), lambda m: rotary_aten(q(m), cos, sin)),
        (f"rotary K [{BATCH}, {GROUPS}, {SEQ}, {HEAD_DIM}] (view of QKV)", (mixed,),
         lambda m: L.rotary(k(m), cos, sin), lambda m: rotary_aten(k(m), cos, sin)),
        (f"swiglu [{tokens}, 2 x {FFN}]", (h,), lambda h: L.swiglu(h), swiglu_aten),
    ]


def run(device, dtype, warmup, iters):
    lines = [f"## Llama ops on {device} ({str(dtype).replace('torch.', '')}, "
             f"{torch.get_num_threads()} threads)\n",
             "| op | loom fwd ms | ATen fwd ms | fwd speedup | loom fwd+bwd ms | ATen fwd+bwd ms | fwd+bwd speedup |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, inputs, fused, aten in cases(device, dtype):
        with torch.no_grad():
            lf = median_ms(lambda: fused(*inputs), device, warmup, iters)
            af = median_ms(lambda: aten(*inputs), device, warmup, iters)
        leaves = [t.detach().requires_grad_() for t in inputs]
        grad = torch.randn_like(fused(*inputs).float()).to(dtype)

        def train_step(fn):
            def step():
                for t in leaves:
                    t.grad = None
                fn(*leaves).backward(grad)
            return step

        lb = median_ms(train_step(fused), device, warmup, iters)
        ab = median_ms(train_step(aten), device, warmup, iters)
        lines.append(f"| {name} | {lf:.2f} | {af:.2f} | {af / lf:.2f}x | {lb:.2f} | {ab:.2f} | {ab / lb:.2f}x |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", required=True, help="path of libloom_ops.so")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"],
                    choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--out", help="also write the tables to this file")
    args = ap.parse_args()
    lib = pathlib.Path(args.lib)
    if not lib.exists():
        print(f"bench_llama_ops: {lib} does not exist (build the op library first)", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_llama_ops: --device cuda but torch sees no GPU", file=sys.stderr)
        return 2
    torch.ops.load_library(str(lib))
    text = "\n".join(run(args.device, getattr(torch, d), args.warmup, args.iters) for d in args.dtype)
    print(text)
    if args.out:
        pathlib.Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
