"""Step 4: GPT-3 126m on one device at the largest micro-batch that fits (tokens/s, TFLOP/s,
MFU, peak memory), beside `loom plan`'s prediction and the activation-memory formula. A dry
run shrinks the model to check the plumbing only."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Dict, List, Optional

from . import metrics
from .context import DATA, Context, StepError, jget

RECIPE = "recipes/gpt3_126m.yaml"
LAST = "last_throughput.txt"   # kept across calls: step 4's micro-batch and figures, for steps 5 and 6


def tput_overrides(ctx: Context, b: int) -> List[str]:
    cfg, d = ctx.cfg, ctx.cfg.work / "runs" / f"tput_b{b}"
    ov = ["trainer.num_nodes=1", "trainer.devices=1", "cluster.gpus_per_node=1", f"trainer.accelerator={ctx.accel}",
          f"run.results_dir={d}", f"exp_manager.explicit_log_dir={d}",
          "model.tensor_model_parallel_size=1", "model.pipeline_model_parallel_size=1", "model.sequence_parallel=false",
          f"model.micro_batch_size={b}", f"model.global_batch_size={b}", "model.optim.name=fused_adam",
          "model.activations_checkpoint_granularity=selective", f"model.data.data_prefix=[1.0,{DATA}]",
          'model.data.splits_string="900,90,10"', f"model.data.index_mapping_dir={cfg.work}/index_cache",
          f"trainer.max_steps={cfg.tput_steps}", f"trainer.val_check_interval={cfg.tput_steps}",
          "trainer.limit_val_batches=0", "trainer.log_every_n_steps=1",
          "exp_manager.create_checkpoint_callback=false", "exp_manager.resume_if_exists=false"]
    if cfg.dry:
        ov += ["model.num_layers=2", "model.hidden_size=64", "model.num_attention_heads=2",
               "model.encoder_seq_length=64", "model.max_position_embeddings=64", "model.data.seq_length=64",
               "trainer.precision=32"]
    return ov


def gpu_profile(gpu_name: str, mem_gib: str) -> str:
    """The planner's built-in profile of the GPU at hand (csrc/planner/data/gpus.json)."""
    if "H100" in gpu_name:
        return "H100"
    if "A100" in gpu_name:
        return "A100-80GB" if float(mem_gib or 80) > 50 else "A100-40GB"
    return "H200"   # the lent host's GPU (and the dry run's pretend one)


def plan_for(ctx: Context, b: int, profile: Optional[Path] = None) -> int:
    """`loom plan` for exactly this layout and micro-batch -> WORK/plan_bB.csv; with a measured
    PROFILE (--profile) -> WORK/plan_cal_bB.csv. The plan describes the GPU (an analytic model),
    whatever device a dry run trains on."""
    work = ctx.cfg.work
    ov = tput_overrides(ctx, b) + ["trainer.accelerator=gpu"]
    gpu = gpu_profile(ctx.gpu_name, ctx.gpu_mem_gib)
    mem = ["--gpu", gpu]
    if ctx.cfg.dry:
        gpu = "H200"
        mem = ["--gpu", "H200", "--gpu-memory-gib", str(ctx.dry_mem_gib), "--reserve-gib", "0.5", "--fragmentation", "0"]
    tag = "plan"
    if profile:
        tag = "plan_cal"
        mem += ["--profile", str(profile)]
    else:
        (work / "plan_gpu.txt").write_text(gpu + "\n")
    return ctx.run(ctx.logs / f"{tag}_b{b}.log",
                   [ctx.cfg.loom, "plan", "--recipe", RECIPE, *ov, *mem, "--tp", "1", "--pp", "1", "--vp", "1",
                    "--mbs", str(b), "--sp", "off", "--recompute", "selective", "--dist-opt", "off",
                    "--csv", work / f"{tag}_b{b}.csv"], cap=60)


def plan_prediction(ctx: Context, csv: Path, b: int) -> dict:
    try:
        return metrics.plan_row(csv, b) or {}
    except (OSError, ValueError, KeyError):
        return {}


def tput_run(ctx: Context, b: int) -> str:
    """Trains tput_steps steps at micro-batch b: "ok", "oom", "timeout" or "error"."""
    cfg, name = ctx.cfg, f"tput_b{b}"
    log = ctx.logs / f"{name}.log"
    shutil.rmtree(cfg.work / "runs" / name, ignore_errors=True)
    cmd = [cfg.loom, "train", RECIPE, f"run.name={name}", *tput_overrides(ctx, b)]
    sampler = None
    if not cfg.dry and ctx.which("nvidia-smi"):
        smi = open(cfg.work / f"{name}.smi", "w")
        sampler = subprocess.Popen(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                                    "-lms", "200"], stdout=smi, stderr=subprocess.DEVNULL)
    try:
        if cfg.dry and ctx.device_env:
            # A pretend device memory: the stand-in's capacity, so a too-large micro-batch runs out of it.
            rc = ctx.run(log, cmd, cap=90, env={**ctx.device_env, "LOOM_STANDIN_MEMORY_MIB": str(ctx.dry_mem_gib * 1024)})
        elif cfg.dry:
            # No stand-in, no pretend memory: an address-space limit cannot stand in for it (the
            # CUDA build of torch does not even load under 1 GiB), so every candidate fits.
            rc = ctx.run(log, cmd, cap=90)
        else:
            rc = ctx.run(log, cmd, cap=120)
    finally:
        if sampler:
            sampler.terminate()
            sampler.wait()
            smi.close()
    if rc == 0:
        return "ok"
    if metrics.is_oom(log):
        return "oom"
    return "timeout" if rc in (124, 137) else "error"


def first_error(log: Path) -> str:
    """The line that names the failure (not the stack frames after it)."""
    lines = [l for l in Path(log).read_text(errors="replace").splitlines() if not l.startswith("+ ")]
    pat = re.compile(r"out of memory|error|exception|terminate|timed out|not started", re.I)
    hit = next((l for l in lines if pat.search(l)), lines[-1] if lines else "")
    return hit[:400]


def smi_peak(ctx: Context, name: str) -> str:
    try:
        vals = [int(x) for x in (ctx.cfg.work / f"{name}.smi").read_text().split() if x.isdigit()]
    except OSError:
        vals = []
    return str(max(vals)) if vals else "-"


def cfg_value(config_yaml: Path, key: str) -> str:
    """A `section.key` value of a run's resolved recipe (config.yaml); "0" when absent."""
    section, k = key.split(".", 1)
    inside = False
    try:
        for line in Path(config_yaml).read_text().splitlines():
            if re.match(r"^\S", line):
                inside = line.strip() == section + ":"
            elif inside:
                m = re.match(r"^  " + re.escape(k) + r":\s*(\S+)", line)
                if m:
                    return m.group(1)
    except OSError:
        pass
    return "0"


def search(cands: List[int], start: int, try_run) -> Dict[int, str]:
    """Goes up from candidate `start` while runs succeed, down while they run out of memory;
    stops at the first other outcome. try_run(b) returns an outcome, or None when out of time.
    Returns {micro-batch: outcome} of the runs made, in the order made."""
    outcome: Dict[int, str] = {}
    i, direction = start, 0
    while 0 <= i < len(cands):
        b = cands[i]
        r = try_run(b)
        if r is None:
            break
        outcome[b] = r
        if r == "ok":
            if direction < 0:
                break            # came down from an OOM: this is the largest that fits
            direction, i = 1, i + 1
        elif r == "oom":
            if direction > 0:
                break            # went up past the largest that fits
            direction, i = -1, i - 1
        else:
            break                # a timeout or another error: no point in trying more
    return outcome


def step_throughput(ctx: Context) -> str:
    cfg, work = ctx.cfg, ctx.cfg.work
    ctx.dry_mem_gib = 1   # small enough that the dry run's micro-batch search meets an out-of-memory
    cands = cfg.mbs
    ctx.md(f"{RECIPE}, bf16, sequence 2048, selective recompute, t=p=d=1, fused_adam, global batch = micro-batch "
           f"(one micro-batch per step), the carried tinyshakespeare corpus, {cfg.tput_steps} steps (means over the "
           f"last {cfg.tput_steps - cfg.tput_skip}), no validation or checkpoints.")
    if cfg.dry:
        memory = (f"the stand-in's memory pretended as {ctx.dry_mem_gib} GiB" if ctx.device_env else
                  "no pretend device memory without the stand-in (every micro-batch fits)")
        ctx.md(f"Dry run: 2 layers, hidden 64, 2 heads, sequence 64, fp32, {ctx.accel}; {memory}.")
    ctx.md("")
    # Predictions for every candidate; start from the largest one the planner says fits.
    start = 0
    for i, b in enumerate(cands):
        if plan_for(ctx, b) != 0 and not (work / f"plan_b{b}.csv").is_file():
            tail = (ctx.logs / f"plan_b{b}.log").read_text(errors="replace").splitlines()[-2:]
            ctx.md(f"- loom plan failed for b={b}: {' '.join(tail)}")
        ctx.predictions[b] = plan_prediction(ctx, work / f"plan_b{b}.csv", b)
        if ctx.predictions[b].get("fits") == 1:
            start = i

    def try_run(b):
        if ctx.step_remaining() <= 30:
            return None
        r = tput_run(ctx, b)
        ctx.say(f"  micro-batch {b}: {r}")
        return r

    outcome = search(cands, start, try_run)
    ctx.md("| micro-batch | run | tokens/s | model TFLOP/s | MFU | peak device MiB (Loom) | peak MiB (nvidia-smi) | "
           "max RSS MiB | predicted GiB (loom plan) | predicted tokens/s | predicted MFU |",
           "|---|---|---|---|---|---|---|---|---|---|---|")
    for b in cands:
        if b not in outcome:
            continue
        tp = {}
        if outcome[b] == "ok":
            try:
                tp = metrics.throughput(work / "runs" / f"tput_b{b}", cfg.tput_skip)
            except (OSError, ValueError, KeyError):
                tp = {}
        p = ctx.predictions.get(b, {})
        ctx.md(f"| {b} | {outcome[b]} | {jget(tp, 'tokens_per_s', 0)} | {jget(tp, 'model_tflops_per_device', 1)} | "
               f"{jget(tp, 'mfu', 3)} | {jget(tp, 'peak_device_memory_mib', 0)} | {smi_peak(ctx, f'tput_b{b}')} | "
               f"{jget(tp, 'max_rss_mib', 0)} | {jget(p, 'memory_gib', 1)} | {jget(p, 'tokens_per_second', 0)} | "
               f"{jget(p, 'mfu', 3)} |")
    ctx.md("")
    for b, r in outcome.items():
        if r != "ok":
            ctx.md(f"- micro-batch {b} ({r}): {first_error(ctx.logs / f'tput_b{b}.log')}")
    ctx.md("")
    ok = [b for b in cands if outcome.get(b) == "ok"]
    if not ok:
        ctx.winner = None
        tried = " ".join(f"{b}={r}" for b, r in outcome.items())
        raise StepError(f"no micro-batch ran ({tried or 'out of time before the first run'})")
    best = cands.index(max(ok))
    w = ctx.winner = cands[best]
    ctx.loom_tput = metrics.throughput(work / "runs" / f"tput_b{w}", cfg.tput_skip)
    (work / "loom_throughput.json").write_text(json.dumps(ctx.loom_tput) + "\n")
    (work / LAST).write_text(f"{w}\n{json.dumps(ctx.loom_tput)}\n")
    mp = ctx.predictions.get(w, {})
    # The formula for the run's shape (from its resolved config).
    conf = work / "runs" / f"tput_b{w}" / "config.yaml"
    L, h, a, s = (int(cfg_value(conf, k)) for k in ("model.num_layers", "model.hidden_size",
                                                    "model.num_attention_heads", "model.encoder_seq_length"))
    div = cfg_value(conf, "model.make_vocab_size_divisible_by")
    div = int(div) if div.isdigit() and int(div) > 0 else 128
    V = (50257 + div - 1) // div * div   # the GPT-2 vocabulary padded as Loom pads it (t = 1)
    m = re.search(r"(\d+) parameters", (ctx.logs / f"tput_b{w}.log").read_text(errors="replace"))
    P = int(m.group(1)) if m else 0
    f = metrics.formula(L, h, a, s, w, V, P)
    nxt = (f"next candidate {cands[best + 1]}: {outcome.get(cands[best + 1], 'not tried')}"
           if best + 1 < len(cands) else "largest candidate")
    t = ctx.loom_tput
    profile = (work / "plan_gpu.txt").read_text().strip() if (work / "plan_gpu.txt").is_file() else "H200"
    ctx.md(f"**Largest micro-batch that ran: {w}** ({nxt}): {jget(t, 'tokens_per_s', 0)} tokens/s, "
           f"{jget(t, 'model_tflops_per_device', 1)} model TFLOP/s per GPU, MFU {jget(t, 'mfu', 3)}, peak device memory "
           f"{jget(t, 'peak_device_memory_mib', 0)} MiB (Loom's metric; nvidia-smi {smi_peak(ctx, f'tput_b{w}')} MiB "
           f"for the whole process).", "")
    ctx.md(f"- `loom plan` ({profile} profile, this layout and micro-batch): {jget(mp, 'memory_gib', 2)} GiB = "
           f"weights+grads+optimizer {jget(mp, 'weights_optimizer_gib', 2)} + activations {jget(mp, 'activations_gib', 2)} "
           f"+ embedding/logits {jget(mp, 'embedding_logits_gib', 2)} + recompute working set {jget(mp, 'transient_gib', 2)} "
           f"+ reserve {jget(mp, 'reserve_gib', 2)}; {jget(mp, 'step_seconds', 3)} s/step, "
           f"{jget(mp, 'tokens_per_second', 0)} tokens/s, MFU {jget(mp, 'mfu', 3)}.")
    ctx.md(f"- Formula (Korthikanti et al. 2022, t = 1, selective recompute; L={L} h={h} a={a} s={s} b={w} V={V} "
           f"P={P or '?'}): {f['text']}.")
    ctx.md(f"- Parameters {P or '?'} from Loom's log; 18 B/parameter = bf16 weights (2) + fp32 main weights (4) + "
           f"two fp32 Adam moments (8) + fp32 gradients (4), docs/planner.md's non-distributed accounting.")
    return f"b={w}: {jget(t, 'tokens_per_s', 0)} tokens/s, MFU {jget(t, 'mfu', 3)}"


def last_throughput(ctx: Context):
    """(micro-batch, figures) of step 4: this call's when it ran in this call (None, {} when it
    failed), else an earlier call's (the LAST file); (None, {}) when neither."""
    if "throughput" in ctx.done or ctx.winner:
        return ctx.winner, ctx.loom_tput
    path = ctx.cfg.work / LAST
    try:
        first, second = path.read_text().splitlines()[:2]
        return int(first), json.loads(second)
    except (OSError, ValueError):
        return None, {}
