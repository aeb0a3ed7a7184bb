#!/usr/bin/env python3
"""Training throughput of a GPT model in Megatron-Core, the reference for Loom's numbers.

Megatron-Core's GPTModel with its local layer spec (get_gpt_layer_local_spec: Megatron's own
modules, no Transformer Engine), one process (world 1; parallel_state with t = p = 1), the
shape of recipes/gpt3_126m.yaml by default: 12 layers, hidden 768, 12 heads, ffn 3072, the
GPT-2 vocabulary padded to 50304 as Loom pads it, sequence 2048, learned absolute positions,
tied embeddings, dropout 0.1, init std 0.023, selective recomputation of the attention core.
bf16 with Megatron's mixed-precision stack: Megatron's DistributedDataParallel (fp32 gradient
buffer, param.main_grad) and get_megatron_optimizer (fp32 main parameters; Adam underneath is
Transformer Engine's or Apex's FusedAdam when installed, else torch.optim.AdamW, which the
JSON names). --optimizer torch uses torch.optim.AdamW(fused=True) on the model's own
parameters instead (no fp32 main copy).

It times --steps optimizer steps after --warmup, one micro-batch per step, and prints one JSON
object (also written to --json-out): tokens/s, model TFLOP/s per device by Loom's formula
(ModelShape::model_flops_per_sample, no recompute counted), MFU against --peak-tflops (default: the
planner's GPU table), peak
memory (torch.cuda.max_memory_allocated / reserved), per-step times and losses.

  python tools/bench_mcore_gpt.py --micro-batch 16 --data gpu_bundle/data/tinyshakespeare_text_document
  python tools/bench_mcore_gpt.py --device cpu --tiny      # dry run on CPU (gloo)

On CPU (a dry run of the plumbing): Megatron's CUDA RNG tracker is replaced by its no-op
(inference) tracker, so dropout draws from the CPU generator; selective recompute is turned
off because Megatron's checkpoint function saves the CUDA RNG state; the DDP/optimizer stack
allocates its buffers on the current CUDA device, so --optimizer torch is used; the attention
core's global score buffer is given a CPU allocator; fp32.
"""
import argparse
import json
import os
import socket
import struct
import sys
import time
import warnings

import torch


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--num-layers", type=int, default=12)
    p.add_argument("--hidden-size", type=int, default=768)
    p.add_argument("--num-attention-heads", type=int, default=12)
    p.add_argument("--ffn-hidden-size", type=int, default=None, help="default 4 x hidden")
    p.add_argument("--vocab-size", type=int, default=50304, help="padded vocabulary")
    p.add_argument("--seq-length", type=int, default=2048)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--precision", choices=["bf16", "fp32"], default=None,
                   help="default bf16 on cuda, fp32 on cpu")
    p.add_argument("--recompute", choices=["selective", "none"], default="selective")
    p.add_argument("--optimizer", choices=["megatron", "torch"], default=None,
                   help="default megatron on cuda, torch on cpu")
    p.add_argument("--fusions", action="store_true",
                   help="Megatron's bias-GeLU and bias-dropout-add fusions (torch.compile; "
                        "adds compile time to the warm-up)")
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--init-std", type=float, default=0.023)
    p.add_argument("--lr", type=float, default=6.0e-4)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--data", default=None,
                   help="Megatron indexed dataset prefix (.bin/.idx): consecutive token windows; "
                        "default random tokens")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="device peak for MFU (default: 989 for H100/H200, else none)")
    p.add_argument("--tiny", action="store_true",
                   help="2 layers, hidden 64, 4 heads, sequence 128, vocab 1024, 3+2 steps")
    p.add_argument("--json-out", default=None)
    args = p.parse_args(argv)
    if args.tiny:
        args.num_layers, args.hidden_size, args.num_attention_heads = 2, 64, 4
        args.seq_length, args.vocab_size, args.micro_batch = 128, 1024, 2
        args.steps, args.warmup = 2, 1
    args.ffn_hidden_size = args.ffn_hidden_size or 4 * args.hidden_size
    args.precision = args.precision or ("bf16" if args.device == "cuda" else "fp32")
    args.optimizer = args.optimizer or ("megatron" if args.device == "cuda" else "torch")
    return args


def model_flops_per_step(b, s, h, ffn, layers, vocab):
    """Loom's model FLOPs (ModelShape::model_flops_per_sample, csrc/rules/model_shape.h): forward +
    backward, no recompute, 3·(L·(s·(8h² + 4h·ffn) + 4s²h) + 2shV) per sample."""
    return b * 3.0 * (layers * (s * (8.0 * h * h + 4.0 * h * ffn) + 4.0 * s * s * h) + 2.0 * s * h * vocab)


def peak_for(name):
    """Dense bf16 peak TFLOP/s from the planner's GPU table (csrc/planner/data/gpus.json), matched
    by family as planner::peak_tflops_for_device does ("NVIDIA H200" -> "H200-141GB")."""
    table = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "csrc", "planner", "data", "gpus.json")
    with open(table) as f:
        gpus = json.load(f)["gpus"]
    for g in gpus:
        if g["name"].split("-")[0].lower() in name.lower():
            return g["peak_tflops"]
    return None


# Megatron indexed dataset (.idx "MMIDIDX\0\0", version, dtype code); tokens read from .bin.
_DTYPES = {1: (torch.uint8, 1), 2: (torch.int8, 1), 3: (torch.int16, 2), 4: (torch.int32, 4),
           5: (torch.int64, 8), 8: (torch.int16, 2)}  # 8 = uint16: read as int16, masked below


def load_tokens(prefix):
    with open(prefix + ".idx", "rb") as f:
        header = f.read(18)
    if header[:9] != b"MMIDIDX\x00\x00":
        raise SystemExit(f"{prefix}.idx: not a Megatron indexed dataset")
    code = header[17]
    if code not in _DTYPES:
        raise SystemExit(f"{prefix}.idx: unsupported dtype code {code}")
    dtype, size = _DTYPES[code]
    with open(prefix + ".bin", "rb") as f:
        raw = bytearray(f.read())
    tokens = torch.frombuffer(raw, dtype=dtype).to(torch.int64)
    if code == 8:
        tokens &= 0xFFFF
    return tokens


class Batches:
    """Micro-batches of [b, s] input ids and labels: consecutive windows of the corpus, or random."""

    def __init__(self, args, device):
        self.b, self.s, self.device = args.micro_batch, args.seq_length, device
        self.gen = torch.Generator().manual_seed(args.seed)
        self.tokens = load_tokens(args.data) if args.data else None
        if self.tokens is not None:
            self.tokens = self.tokens.clamp_(max=args.vocab_size - 1)
            if self.tokens.numel() < self.s + 2:
                raise SystemExit(f"{args.data}: fewer tokens than one sequence")
        self.vocab = args.vocab_size
        self.pos = 0

    def next(self):
        if self.tokens is None:
            x = torch.randint(0, self.vocab, (self.b, self.s + 1), generator=self.gen)
        else:
            rows = []
            for _ in range(self.b):
                if self.pos + self.s + 1 > self.tokens.numel():
                    self.pos = 0
                rows.append(self.tokens[self.pos:self.pos + self.s + 1])
                self.pos += self.s
            x = torch.stack(rows)
        x = x.to(self.device, non_blocking=True)
        return x[:, :-1].contiguous(), x[:, 1:].contiguous()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setup_parallel(args, notes):
    from megatron.core import parallel_state, tensor_parallel
    backend = "nccl" if args.device == "cuda" else "gloo"
    if args.device == "cuda":
        torch.cuda.set_device(0)
    torch.distributed.init_process_group(backend=backend, init_method=f"tcp://127.0.0.1:{free_port()}",
                                         world_size=1, rank=0)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    torch.manual_seed(args.seed)
    if args.device == "cuda":
        tensor_parallel.model_parallel_cuda_manual_seed(args.seed)
    else:
        # The no-op tracker Megatron uses for inference: fork() is a null context, so dropout
        # draws from the CPU default generator instead of a CUDA generator.
        tensor_parallel.random.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
        notes.append("cpu: Megatron's CUDA RNG tracker replaced by its no-op (inference) tracker")
        # The attention core takes its QK^T output buffer from a global buffer that Megatron
        # allocates on torch.cuda.current_device(); give it one that allocates on the CPU.
        parallel_state._GLOBAL_MEMORY_BUFFER = CpuMemoryBuffer()
        notes.append("cpu: Megatron's global memory buffer (attention scores) allocated on the CPU")
    return backend


class CpuMemoryBuffer:
    """CPU stand-in for megatron.core.utils.GlobalMemoryBuffer (same get_tensor contract)."""

    def __init__(self):
        self.buffer = {}

    def get_tensor(self, tensor_shape, dtype, name, mem_alloc_context=None):
        n = 1
        for d in tensor_shape:
            n *= d
        buf = self.buffer.get((name, dtype))
        if buf is None or buf.numel() < n:
            buf = self.buffer[(name, dtype)] = torch.empty(n, dtype=dtype)
        return buf[:n].view(*tensor_shape)


def build_model(args, notes):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    recompute = args.recompute
    if recompute == "selective" and args.device == "cpu":
        recompute = "none"
        notes.append("cpu: selective recompute off (Megatron's checkpoint saves the CUDA RNG state)")
    config = TransformerConfig(
        num_layers=args.num_layers, hidden_size=args.hidden_size,
        num_attention_heads=args.num_attention_heads, ffn_hidden_size=args.ffn_hidden_size,
        hidden_dropout=args.dropout, attention_dropout=args.dropout,
        init_method_std=args.init_std, layernorm_epsilon=1e-5,
        bf16=dtype == torch.bfloat16, params_dtype=dtype, pipeline_dtype=dtype,
        recompute_granularity="selective" if recompute == "selective" else None,
        recompute_modules=["core_attn"] if recompute == "selective" else None,
        use_cpu_initialization=args.device == "cpu",
        gradient_accumulation_fusion=False,        # needs Apex's fused wgrad kernel
        bias_activation_fusion=args.fusions, bias_dropout_fusion=args.fusions,
        masked_softmax_fusion=False,               # needs Apex/TE softmax kernels
        apply_query_key_layer_scaling=False, attention_softmax_in_fp32=True,
    )
    model = GPTModel(
        config=config, transformer_layer_spec=get_gpt_layer_local_spec(),
        vocab_size=args.vocab_size, max_sequence_length=args.seq_length,
        pre_process=True, post_process=True, parallel_output=True,
        share_embeddings_and_output_weights=True, position_embedding_type="learned_absolute",
    )
    if args.device == "cuda":
        model.cuda(torch.cuda.current_device())
    return config, model, recompute


def megatron_optimizer(args, config, model):
    """Megatron's DDP (fp32 gradient buffer) and get_megatron_optimizer; (runner, step, text)."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    import megatron.core.optimizer as mopt
    ddp = DistributedDataParallel(
        config, DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                              use_distributed_optimizer=False), model)
    opt = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=args.lr, weight_decay=0.1, adam_beta1=0.9,
                        adam_beta2=0.95, adam_eps=1e-8, clip_grad=1.0,
                        bf16=args.precision == "bf16", params_dtype=config.params_dtype,
                        use_distributed_optimizer=False),
        [ddp])
    inner = f"{mopt.Adam.__module__}.{mopt.Adam.__name__}"

    def step():
        ddp.finish_grad_sync()
        _, grad_norm, _ = opt.step()
        ddp.zero_grad_buffer()
        opt.zero_grad()
        return grad_norm

    ddp.zero_grad_buffer()
    return ddp, step, f"megatron (DDP fp32 grad buffer, fp32 main params; Adam = {inner})"


def torch_optimizer(args, model):
    """torch.optim.AdamW on the model's own parameters; (runner, step, text)."""
    fused = args.device == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, fused=fused)

    def step():
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return grad_norm

    return model, step, f"torch.optim.AdamW(fused={fused}) on the {args.precision} parameters"


def build_training(args, notes):
    """The model and its optimizer: Megatron's stack when asked for, else (or when it fails) torch's."""
    config, model, recompute = build_model(args, notes)
    if args.optimizer == "megatron":
        try:
            return (recompute,) + megatron_optimizer(args, config, model)
        except Exception as e:  # keep the benchmark going with the plain optimizer
            notes.append(f"Megatron optimizer stack failed ({type(e).__name__}: {e}); using torch AdamW")
            # DDP has already hooked the model's gradients into its buffer: start from a fresh model.
            del model
            if args.device == "cuda":
                torch.cuda.empty_cache()
            config, model, recompute = build_model(args, notes)
    return (recompute,) + torch_optimizer(args, model)


def main(argv=None):
    args = parse_args(argv)
    warnings.filterwarnings("ignore", message=".*(Apex|Transformer Engine|transformer_engine).*")
    notes = []
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_mcore_gpt: torch sees no GPU (use --device cpu for a dry run)")
    import megatron.core
    from megatron.core import parallel_state
    backend = setup_parallel(args, notes)
    device = torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" else torch.device("cpu")
    recompute, runner, opt_step, opt_desc = build_training(args, notes)
    runner.train()
    batches = Batches(args, device)
    b, s = args.micro_batch, args.seq_length
    position_ids = torch.arange(s, device=device).unsqueeze(0).expand(b, s)
    loss_mask = torch.ones(b, s, device=device, dtype=torch.float32)
    # Causal mask as Megatron's GPT training builds it (True = masked out), given explicitly
    # because the softmax's own default mask is created on "cuda".
    attention_mask = torch.triu(torch.ones(s, s, dtype=torch.bool, device=device), diagonal=1).view(1, 1, s, s)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)

    def train_step():
        tokens, labels = batches.next()
        per_token = runner(tokens, position_ids, attention_mask, labels=labels)
        loss = (per_token.float() * loss_mask).sum() / loss_mask.sum()
        loss.backward()
        opt_step()
        return loss.detach()

    losses, times = [], []
    for i in range(args.warmup + args.steps):
        sync()
        t0 = time.perf_counter()
        loss = train_step()
        sync()
        dt = time.perf_counter() - t0
        losses.append(float(loss))
        if i >= args.warmup:
            times.append(dt)
        if args.device == "cuda" and i == args.warmup - 1:
            torch.cuda.reset_peak_memory_stats()  # peak over the timed steps (states exist by then)
    total = sum(times)
    flops = model_flops_per_step(b, s, args.hidden_size, args.ffn_hidden_size, args.num_layers, args.vocab_size)
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    peak = args.peak_tflops or peak_for(name)
    tflops = flops / (total / len(times)) / 1e12
    result = {
        "implementation": "megatron-core",
        "megatron_core_version": getattr(megatron.core, "__version__", "unknown"),
        "torch": torch.__version__, "device": name, "backend": backend,
        "layer_spec": "get_gpt_layer_local_spec", "precision": args.precision,
        "recompute": recompute, "fusions": args.fusions, "optimizer": opt_desc,
        "num_layers": args.num_layers, "hidden_size": args.hidden_size,
        "num_attention_heads": args.num_attention_heads, "ffn_hidden_size": args.ffn_hidden_size,
        "vocab_size": args.vocab_size, "seq_length": s, "micro_batch": b,
        "data": args.data or "random tokens", "warmup_steps": args.warmup, "timed_steps": len(times),
        "step_time_s": total / len(times), "tokens_per_s": b * s * len(times) / total,
        "model_tflops_per_device": tflops, "mfu": tflops / peak if peak else None,
        "peak_memory_mib": torch.cuda.max_memory_allocated() / 2**20 if args.device == "cuda" else None,
        "peak_reserved_mib": torch.cuda.max_memory_reserved() / 2**20 if args.device == "cuda" else None,
        "step_times_s": times, "losses": losses, "notes": notes,
    }
    text = json.dumps(result)
    print(text)
    if args.json_out:
        with open(args.json_out, "w") as f:
            f.write(text + "\n")
    parallel_state.destroy_model_parallel()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
