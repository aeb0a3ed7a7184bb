#!/usr/bin/env python3
"""Training throughput of `loom train` (one process) beside the same GPT in PyTorch eager mode,
driven from Python through `transformers`' GPT2LMHeadModel, on the same threads and batches.

    .venv/bin/python tools/bench_train_vs_pytorch.py [--loom build/bin/loom] [--steps 30]
        [--warmup 5] [--rounds 1] [--threads all|1,all] [--with-main-job] [--skip-crosscheck]
        [--out FILE]

Model and batch are the tiny recipe's (recipes/gpt3_tiny_cpu.yaml): 4 layers, hidden 128,
4 heads, sequence 128, micro-batch 2, global batch 8 (4 micro-batches with gradient
accumulation), AdamW (lr 1e-3, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on matrices only),
gradient clipping at 1.0, dropout 0.1 (hidden and attention), fp32. Loom runs single-process
(t = p = d = 1, no sequence parallelism, no recomputation), so Loom's intra-op thread count
(cores / local ranks) is every core; the PyTorch process sets torch.set_num_threads to the same.

Cross-check first (so the two columns time the same computation). A 3-step Loom run with both
dropouts 0 saves a checkpoint after every step. Its samples are rebuilt in Python from the run's
own index cache (Megatron document/sample/shuffle index .npy files) and the indexed dataset
(read by megatron-core), the way Megatron's GPTDataset assembles a sample. Then:
  1. forward: HF GPT-2 loaded with the step-k weights gives, on the training batch of step k+1,
     Loom's logged loss of step k+1 (k = 1, 2), and on the first validation batch with the
     final weights, Loom's logged validation loss;
  2. training step: HF GPT-2 with the step-1 weights and the step-1 Adam moments (both from the
     checkpoint) takes one torch.optim.AdamW step with clipping at Loom's step-2 learning rate;
     its loss and gradient norm equal Loom's step-2 record and its parameters and moments equal
     the step-2 checkpoint.
The weight mapping: Loom's linear weights are [out, in] and HF's Conv1D are [in, out]; Loom's
QKV rows are grouped per head as [q|k|v] and HF's c_attn packs [all q | all k | all v]; Loom's
word embedding has 50304 rows (pad rows stay zero, pad logits are left out of Loom's loss), so
HF holds the first 50257 and its tied output layer gives exactly Loom's unpadded logits.

Timing. Loom: step_time_s of metrics.jsonl (a whole optimizer step: sample assembly, forward
and backward of the 4 micro-batches, gradient clipping, AdamW). PyTorch: the same work timed
around each step in Python (samples prebuilt as tensors). The first --warmup steps are left
out; tokens/s = global batch x sequence / median step time. With --rounds N the implementations
run in turn N times and each keeps its best round (the machine may be shared). PyTorch rows:
HF's default attention (scaled_dot_product_attention) and its plain matmul-softmax path
("eager"); torch.optim.AdamW with its default (for-each) implementation. --with-main-job adds
Loom's default 4-rank layout (t = 2, p = 2, sequence parallelism, selective recompute) for
context: same model and batch, max(1, cores / 4) intra-op threads per rank.

--threads 1,all also compares both at one intra-op thread (Loom is given it as a torchrun-style
launch of rank 0 of 1 with LOCAL_WORLD_SIZE = cores, since it takes cores / local ranks). On a
machine shared with other work, multi-threaded steps (OpenMP) slow down erratically whenever a
core is taken away (idle OpenMP threads spin, and Loom's step suffers more from it than
PyTorch's); single-threaded figures stay comparable there, and --omp-passive
(OMP_WAIT_POLICY=PASSIVE for both) steadies the multi-threaded ones.
"""
import argparse
import json
import math
import os
import pathlib
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import numpy
import torch
import torch.jit._pickle

ROOT = pathlib.Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "gpt3_tiny_cpu.yaml"
GPT2_VOCAB = 50257
# The tiny recipe's model and optimiser (kept in step with recipes/gpt3_tiny_cpu.yaml).
LAYERS, HIDDEN, HEADS, SEQ = 4, 128, 4, 128
MICRO, GLOBAL = 2, 8
LR_BETAS_EPS_WD = (1e-3, (0.9, 0.95), 1e-8, 0.1)
CLIP = 1.0
DROPOUT = 0.1

warnings.filterwarnings("ignore")


# ----------------------------------------------------------------------------- Loom side

def loom_train(loom, corpus, run_dir, steps, layout=(1, 1), dropout=DROPOUT, save_every=None,
               val_batches=0, threads=None):
    """Runs `loom train` on the tiny recipe; returns (train records, validation records).
    threads (single process only): Loom's intra-op threads, set the one way Loom takes it, as a
    torchrun-style launch of rank 0 of 1 whose LOCAL_WORLD_SIZE makes cores / local ranks equal
    it; None leaves Loom's default (every core)."""
    t, p = layout
    o = [f"trainer.devices={t * p}", f"trainer.max_steps={steps}", "trainer.log_every_n_steps=1",
         f"trainer.val_check_interval={steps}", f"trainer.limit_val_batches={val_batches}",
         f"exp_manager.explicit_log_dir={run_dir}",
         f"exp_manager.checkpoint_callback_params.every_n_steps={save_every or steps}",
         f"model.tensor_model_parallel_size={t}", f"model.pipeline_model_parallel_size={p}",
         "model.virtual_pipeline_model_parallel_size=null",
         f"model.sequence_parallel={'true' if t > 1 else 'false'}",
         f"model.activations_checkpoint_granularity={'selective' if t > 1 else 'null'}",
         f"model.num_layers={LAYERS}", f"model.hidden_size={HIDDEN}", f"model.ffn_hidden_size={4 * HIDDEN}",
         f"model.num_attention_heads={HEADS}", f"model.encoder_seq_length={SEQ}",
         f"model.micro_batch_size={MICRO}", f"model.global_batch_size={GLOBAL}",
         f"model.hidden_dropout={dropout}", f"model.attention_dropout={dropout}",
         f"model.data.data_prefix=[1.0,{corpus}]"]
    env = dict(os.environ)
    if threads is not None:
        local = max(1, os.cpu_count() // threads)
        if t * p != 1 or os.cpu_count() // local != threads:
            sys.exit(f"cannot run Loom with {threads} threads on {os.cpu_count()} cores (cores / local ranks)")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE=str(local),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    done = subprocess.run([str(loom), "train", str(RECIPE), *o], cwd=ROOT, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"loom train failed ({done.returncode}):\n{done.stderr[-4000:]}")
    records = [json.loads(line) for line in (pathlib.Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    if len(train) != steps:
        sys.exit(f"{run_dir}/metrics.jsonl: expected {steps} train records, found {len(train)}")
    return train, [r for r in records if r["kind"] == "validation"]


def load_checkpoint(run_dir, iteration):
    """(model tensors, optimizer tensors, values) of a single-process Loom checkpoint."""
    shards = sorted((pathlib.Path(run_dir) / "checkpoints" / f"iter_{iteration:07d}").glob("mp_rank_*/model_optim_rng.pt"))
    if len(shards) != 1:
        sys.exit(f"{run_dir} iteration {iteration}: expected one shard (t = p = 1), found {len(shards)}")
    with torch.serialization.safe_globals([torch.jit._pickle.restore_type_tag]):
        blob = torch.load(shards[0], weights_only=True)
    meta = json.loads(blob["meta"])
    for name, info in meta["shards"].items():
        if list(blob["model"][name].shape) != info["global_shape"]:
            sys.exit(f"{shards[0]}: {name} is a shard {list(blob['model'][name].shape)} of {info['global_shape']}")
    return blob["model"], blob.get("optimizer", {}), meta["values"]


class LoomSamples:
    """The samples of one split of a Loom run, assembled as Megatron's GPTDataset does from the
    run's index cache (document_index, sample_index, shuffle_index) and the indexed dataset."""

    def __init__(self, run_dir, corpus, split):
        from megatron.core.datasets.indexed_dataset import IndexedDataset
        cache = pathlib.Path(run_dir) / "index_cache"

        def one(kind):
            found = list(cache.glob(f"*-GPTDataset-{split}-{kind}.npy"))
            if len(found) != 1:
                sys.exit(f"{cache}: expected one *-GPTDataset-{split}-{kind}.npy, found {len(found)}")
            return numpy.load(found[0], allow_pickle=False)

        self.docs = IndexedDataset(str(corpus))
        self.document_index, self.sample_index = one("document_index"), one("sample_index")
        self.shuffle_index = one("shuffle_index")

    def get(self, i):
        """(tokens, labels) of sample i, each SEQ int64 ids."""
        j = int(self.shuffle_index[i])
        (d0, o0), (d1, o1) = self.sample_index[j], self.sample_index[j + 1]
        parts = []
        for d in range(int(d0), int(d1) + 1):
            doc = self.docs[int(self.document_index[d])]
            parts.append(doc[(o0 if d == d0 else 0):(o1 + 1 if d == d1 else None)])
        text = numpy.concatenate(parts).astype(numpy.int64)
        if len(text) != SEQ + 1:
            sys.exit(f"sample {i}: {len(text)} tokens, expected {SEQ + 1}")
        return torch.from_numpy(text[:-1]), torch.from_numpy(text[1:])

    def batch(self, step):
        """The micro-batches (tokens [MICRO, SEQ], labels) of 0-based training step `step`:
        Megatron's sampler hands out samples step*GLOBAL ... in order, MICRO at a time."""
        out = []
        for k in range(GLOBAL // MICRO):
            ids = range(step * GLOBAL + k * MICRO, step * GLOBAL + (k + 1) * MICRO)
            pairs = [self.get(i) for i in ids]
            out.append((torch.stack([a for a, _ in pairs]), torch.stack([b for _, b in pairs])))
        return out


# ----------------------------------------------------------------------------- PyTorch side

def hf_model(attn="sdpa", dropout=DROPOUT):
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(vocab_size=GPT2_VOCAB, n_positions=SEQ, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS,
                     n_inner=4 * HIDDEN, activation_function="gelu_new", layer_norm_epsilon=1e-5,
                     resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout, tie_word_embeddings=True)
    cfg._attn_implementation = attn
    torch.manual_seed(1234)
    model = GPT2LMHeadModel(cfg)
    assert model.lm_head.weight is model.transformer.wte.weight, "output layer not tied to the embedding"
    return model


def loom_to_hf(model):
    """{Loom name: (HF parameter, to_hf)} where to_hf maps a Loom tensor to the HF layout."""
    d = HIDDEN // HEADS

    def qkv(w):  # Loom rows per head [q|k|v] -> [all q | all k | all v]
        w = w.reshape(HEADS, 3, d, *w.shape[1:]).transpose(0, 1).reshape(3 * HIDDEN, *w.shape[1:])
        return w.t() if w.dim() == 2 else w

    same, tr = (lambda w: w), (lambda w: w.t())
    tf = model.transformer
    m = {"embedding.word_embeddings.weight": (tf.wte.weight, lambda w: w[:GPT2_VOCAB]),
         "embedding.position_embeddings.weight": (tf.wpe.weight, same),
         "final_layernorm.weight": (tf.ln_f.weight, same), "final_layernorm.bias": (tf.ln_f.bias, same)}
    for n, blk in enumerate(tf.h):
        p = f"layers.{n}."
        m.update({p + "input_layernorm.weight": (blk.ln_1.weight, same), p + "input_layernorm.bias": (blk.ln_1.bias, same),
                  p + "self_attention.linear_qkv.weight": (blk.attn.c_attn.weight, qkv),
                  p + "self_attention.linear_qkv.bias": (blk.attn.c_attn.bias, qkv),
                  p + "self_attention.linear_proj.weight": (blk.attn.c_proj.weight, tr),
                  p + "self_attention.linear_proj.bias": (blk.attn.c_proj.bias, same),
                  p + "pre_mlp_layernorm.weight": (blk.ln_2.weight, same), p + "pre_mlp_layernorm.bias": (blk.ln_2.bias, same),
                  p + "mlp.linear_fc1.weight": (blk.mlp.c_fc.weight, tr), p + "mlp.linear_fc1.bias": (blk.mlp.c_fc.bias, same),
                  p + "mlp.linear_fc2.weight": (blk.mlp.c_proj.weight, tr), p + "mlp.linear_fc2.bias": (blk.mlp.c_proj.bias, same)})
    assert len({id(param) for param, _ in m.values()}) == len(list(model.parameters())), "unmapped HF parameter"
    return m


def load_into_hf(model, tensors):
    mapping = loom_to_hf(model)
    if set(tensors) != set(mapping):
        sys.exit(f"checkpoint parameters differ from the model's: {sorted(set(tensors) ^ set(mapping))}")
    pad = tensors["embedding.word_embeddings.weight"][GPT2_VOCAB:]
    if pad.abs().max() != 0:
        sys.exit("checkpoint: the padded rows of embedding.word_embeddings.weight are not zero")
    with torch.no_grad():
        for name, (param, to_hf) in mapping.items():
            value = to_hf(tensors[name])
            if value.shape != param.shape:
                sys.exit(f"{name}: Loom {list(tensors[name].shape)} maps to {list(value.shape)}, HF has {list(param.shape)}")
            param.copy_(value)


def adamw(model):
    lr, betas, eps, wd = LR_BETAS_EPS_WD
    params = list(model.parameters())  # the tied embedding appears once
    return torch.optim.AdamW([{"params": [p for p in params if p.dim() > 1], "weight_decay": wd},
                              {"params": [p for p in params if p.dim() <= 1], "weight_decay": 0.0}],
                             lr=lr, betas=betas, eps=eps)


def loss_of(model, micro_batches, backward):
    """Σ token losses / tokens of the global batch (Loom's loss), over the micro-batches;
    with backward, gradients accumulate micro-batch by micro-batch as in Loom's schedule."""
    tokens = sum(lab.numel() for _, lab in micro_batches)
    total = 0.0
    for tok, lab in micro_batches:
        logits = model(input_ids=tok).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.size(-1)), lab.reshape(-1),
                                                 reduction="sum") / tokens
        if backward:
            loss.backward()
        total += loss.item()
    return total


def train_step(model, opt, micro_batches):
    """One optimizer step; returns (loss, gradient norm before clipping)."""
    opt.zero_grad(set_to_none=True)
    loss = loss_of(model, micro_batches, backward=True)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    opt.step()
    return loss, float(norm)


# ----------------------------------------------------------------------------- cross-check

def close(what, got, want, rtol):
    ok = abs(got - want) <= rtol * abs(want)
    print(f"  {what}: PyTorch {got:.7f}  Loom {want:.7f}  {'ok' if ok else 'MISMATCH'}", file=sys.stderr)
    return ok


def crosscheck(loom, corpus, work):
    print("cross-check: 3 Loom steps without dropout, checkpoint after each", file=sys.stderr)
    run = work / "crosscheck"
    train, valid = loom_train(loom, corpus, run, steps=3, dropout=0.0, save_every=1, val_batches=1)
    verify(run, corpus, train, valid)


def verify(run, corpus, train, valid):
    """The checks of the module docstring on a finished 3-step cross-check run."""
    samples, vsamples = LoomSamples(run, corpus, "train"), LoomSamples(run, corpus, "valid")
    model = hf_model(dropout=0.0)
    ok = True
    with torch.no_grad():
        for k in (1, 2):
            load_into_hf(model, load_checkpoint(run, k)[0])
            ok &= close(f"loss of step {k + 1} with the step-{k} weights", loss_of(model, samples.batch(k), False),
                        train[k]["loss"], 1e-5)
        load_into_hf(model, load_checkpoint(run, 3)[0])
        final_val = [r for r in valid if r["step"] == 3][0]["val_loss"]
        ok &= close("validation loss with the final weights", loss_of(model, vsamples.batch(0), False), final_val, 1e-5)

    # One training step from the step-1 weights and Adam moments.
    weights, moments, values = load_checkpoint(run, 1)
    model.train()
    load_into_hf(model, weights)
    opt = adamw(model)
    mapping = loom_to_hf(model)
    for name, (param, to_hf) in mapping.items():
        opt.state[param] = {"step": torch.tensor(float(values["optimizer"]["step"])),
                            "exp_avg": to_hf(moments["exp_avg/" + name]).clone(),
                            "exp_avg_sq": to_hf(moments["exp_avg_sq/" + name]).clone()}
    lr = train[0]["lr"]  # logged after the scheduler advanced: the rate step 2 used
    for group in opt.param_groups:
        group["lr"] = lr
    loss, norm = train_step(model, opt, samples.batch(1))
    ok &= close("step-2 loss", loss, train[1]["loss"], 1e-5)
    ok &= close("step-2 gradient norm", norm, train[1]["grad_norm"], 1e-4)
    after, after_moments, _ = load_checkpoint(run, 2)
    # Adam's update is m/(sqrt(v)+eps) per element, at most ~lr in size: compare the updates
    # against lr, and the moments relative to their largest element.
    worst_update, worst_moment = 0.0, 0.0
    for name, (param, to_hf) in mapping.items():
        before = to_hf(weights[name])
        worst_update = max(worst_update, float(((param.detach() - before) - (to_hf(after[name]) - before)).abs().max()) / lr)
        for kind in ("exp_avg", "exp_avg_sq"):
            want = to_hf(after_moments[f"{kind}/{name}"])
            got = opt.state[param][kind]
            worst_moment = max(worst_moment, float((got - want).abs().max() / want.abs().max().clamp_min(1e-30)))
    update_ok, moment_ok = worst_update <= 1e-2, worst_moment <= 1e-4
    print(f"  step-2 parameters: largest update difference {worst_update:.2e} x lr "
          f"{'ok' if update_ok else 'MISMATCH'}; Adam moments: largest difference {worst_moment:.2e} "
          f"of the tensor's largest {'ok' if moment_ok else 'MISMATCH'}", file=sys.stderr)
    if not (ok and update_ok and moment_ok):
        sys.exit("cross-check failed: the PyTorch model does not compute what Loom does")


# ----------------------------------------------------------------------------- benchmark

def summarise(name, threads, step_times, warmup):
    timed = step_times[warmup:]
    med = statistics.median(timed)
    return dict(name=name, threads=threads, median_s=med, mean_s=statistics.fmean(timed), steps=len(timed),
                tokens_per_s=GLOBAL * SEQ / med)


def bench_loom(loom, corpus, run_dir, steps, warmup, layout, threads=None):
    t, p = layout
    train, _ = loom_train(loom, corpus, run_dir, steps, layout=layout, threads=threads)
    if t * p == 1:
        return summarise("Loom, 1 process", threads or os.cpu_count(), [r["step_time_s"] for r in train], warmup)
    return summarise(f"Loom, {t * p} ranks (t={t}, p={p}, SP, selective recompute)",
                     f"{max(1, os.cpu_count() // (t * p))} per rank", [r["step_time_s"] for r in train], warmup)


def bench_hf(samples, steps, warmup, attn):
    model = hf_model(attn)
    model.train()
    opt = adamw(model)
    batches = [samples.batch(k) for k in range(steps)]
    times = []
    for batch in batches:
        t0 = time.perf_counter()
        loss, _ = train_step(model, opt, batch)
        times.append(time.perf_counter() - t0)
        if not math.isfinite(loss):
            sys.exit(f"PyTorch ({attn}) loss became {loss}")
    label = {"sdpa": "PyTorch eager, HF GPT-2 (SDPA attention)",
             "eager": "PyTorch eager, HF GPT-2 (matmul-softmax attention)"}[attn]
    return summarise(label, torch.get_num_threads(), times, warmup)


def machine():
    model = "unknown CPU"
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()
    omp = os.environ.get("OMP_WAIT_POLICY")
    return (f"{model}, {os.cpu_count()} logical cores, {platform.system()} {platform.release()}; "
            f"torch {torch.__version__}; load average before the runs {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}"
            + (f"; OMP_WAIT_POLICY={omp}" if omp else ""))


def table(rows):
    """Markdown rows; 'relative' is tokens/s over Loom single-process's at the same thread count
    (the multi-rank row: over Loom single-process on every core)."""
    loom = {r["threads"]: r["tokens_per_s"] for r in rows if r["name"] == "Loom, 1 process"}
    lines = ["| implementation | threads | tokens/s | ms/step (median) | ms/step (mean) | relative to Loom 1 process |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        ref = loom.get(r["threads"], loom.get(os.cpu_count()))
        rel = f"{r['tokens_per_s'] / ref:.2f}x" if ref else "-"
        lines.append(f"| {r['name']} | {r['threads']} | {r['tokens_per_s']:.0f} | {r['median_s'] * 1e3:.0f} | "
                     f"{r['mean_s'] * 1e3:.0f} | {rel} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--loom", default=str(ROOT / os.environ.get("LOOM_BUILD_DIR", "build") / "bin" / "loom"))
    ap.add_argument("--data-prefix", default=str(ROOT / "data" / "preprocessed" / "tinyshakespeare_text_document"),
                    help="preprocessed corpus; made from data/tinyshakespeare.txt in a temporary folder if absent")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", default="all",
                    help="comma-separated intra-op thread counts to compare at, e.g. 1,all (default all: Loom's own choice)")
    ap.add_argument("--with-main-job", action="store_true", help="add Loom's 4-rank default layout")
    ap.add_argument("--skip-crosscheck", action="store_true")
    ap.add_argument("--omp-passive", action="store_true",
                    help="OMP_WAIT_POLICY=PASSIVE for Loom and PyTorch alike (idle OpenMP threads sleep "
                         "instead of spinning: steadier on a shared machine)")
    ap.add_argument("--out", help="also write the Markdown table here")
    args = ap.parse_args()
    if args.omp_passive and os.environ.get("OMP_WAIT_POLICY") != "PASSIVE":
        # libgomp reads it when loaded (with torch, at import): start again with it set.
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        os.execv(sys.executable, [sys.executable, *sys.argv])
    loom = pathlib.Path(args.loom)
    if not loom.is_file():
        sys.exit(f"loom executable not found at {loom}: build it (tools/build.sh) or pass --loom")
    if args.steps <= args.warmup:
        sys.exit("--steps must exceed --warmup")
    header = machine()
    # Loom single-process: at::set_num_threads(cores / 1 local rank), i.e. every core.
    cores = os.cpu_count()
    thread_counts = [cores if t == "all" else int(t) for t in args.threads.split(",")]
    if any(not 1 <= n <= cores for n in thread_counts):
        sys.exit(f"--threads {args.threads}: each count must be between 1 and {cores} cores")
    torch.set_num_threads(cores)

    with tempfile.TemporaryDirectory(prefix="loom_bench_train_") as tmp:
        work = pathlib.Path(tmp)
        corpus = pathlib.Path(args.data_prefix)
        if not pathlib.Path(str(corpus) + ".idx").is_file():
            print(f"preprocessing data/tinyshakespeare.txt (no {corpus}.idx)", file=sys.stderr)
            r = subprocess.run([str(loom), "preprocess", "--input", str(ROOT / "data" / "tinyshakespeare.txt"),
                                "--output-prefix", str(work / "shakespeare"), "--json-keys", "text",
                                "--vocab-file", str(ROOT / "data" / "gpt2-vocab.json"),
                                "--merge-file", str(ROOT / "data" / "gpt2-merges.txt"), "--append-eod",
                                "--workers", "2"], capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"loom preprocess failed: {r.stderr[-3000:]}")
            corpus = work / "shakespeare_text_document"
        if not args.skip_crosscheck:
            crosscheck(loom, corpus, work)

        best = {}

        def keep(row):
            key = (row["name"], str(row["threads"]))
            if key not in best or row["median_s"] < best[key]["median_s"]:
                best[key] = row
            print(f"  {row['name']}, {row['threads']} thread(s): {row['median_s'] * 1e3:.0f} ms/step "
                  f"(median of {row['steps']})", file=sys.stderr)

        samples = None
        for rnd in range(args.rounds):
            print(f"round {rnd + 1}/{args.rounds}: {args.steps} steps each, {args.warmup} warm-up", file=sys.stderr)
            for n in thread_counts:
                keep(bench_loom(loom, corpus, work / f"loom_{n}_{rnd}", args.steps, args.warmup, (1, 1),
                                None if n == cores else n))
                if samples is None:  # the same batches as Loom's
                    samples = LoomSamples(work / f"loom_{n}_{rnd}", corpus, "train")
                torch.set_num_threads(n)
                keep(bench_hf(samples, args.steps, args.warmup, "sdpa"))
                keep(bench_hf(samples, args.steps, args.warmup, "eager"))
            if args.with_main_job:
                keep(bench_loom(loom, corpus, work / f"loom_main_{rnd}", args.steps, args.warmup, (2, 2)))
    rows = sorted(best.values(), key=lambda r: (isinstance(r["threads"], str), -int(str(r["threads"]).split()[0])))
    text = (f"Machine: {header}\nModel: {LAYERS} layers, hidden {HIDDEN}, {HEADS} heads, sequence {SEQ}, "
            f"micro-batch {MICRO}, global batch {GLOBAL} ({GLOBAL * SEQ} tokens/step), fp32, dropout {DROPOUT}; "
            f"{args.steps} steps, first {args.warmup} excluded, best of {args.rounds} round(s)\n\n"
            + table(rows))
    print(text)
    if args.out:
        pathlib.Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
