#!/usr/bin/env python3
"""Reads `loom train` run directories and `loom plan` CSVs for the bring-up's steps.

Standard library only (the GPU host's python may have nothing but torch). The functions
compare(), throughput(), plan_row(), formula() and is_oom() serve the driver; by hand,
`python3 tools/bringup/metrics.py SUBCOMMAND` prints the same. Subcommands:
  compare REF RUN [RUN ...] --rtol R [R ...]   loss table (markdown) of the runs' train records
                                               against REF, step by step; exit 1 when a run's
                                               relative difference exceeds its tolerance
  throughput RUN --skip K                      JSON: means over the train records after K steps
  plan CSV --mbs B                             JSON: the CSV row with that micro-batch
  formula --layers L --hidden H --heads A --seq S --mbs B --vocab V --params P
                                               JSON + text: Korthikanti et al.'s activation
                                               memory with selective recompute, plus weights
  oom LOG                                      exit 0 when the log reports an out-of-memory error
"""
import argparse
import csv
import json
import math
import re
import sys
from pathlib import Path

MIB = 2.0**20
GIB = 2.0**30


def train_records(run_dir):
    """The "train" records of RUN/metrics.jsonl, by step (a resumed run's later record wins)."""
    path = Path(run_dir) / "metrics.jsonl"
    records = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            if r.get("kind", "train") == "train" and "step" in r:
                records[int(r["step"])] = r
    return [records[k] for k in sorted(records)]


def rel(a, ref):
    return abs(a - ref) / max(abs(ref), 1e-30)


def compare(ref_dir, run_dirs, rtols, names=None, ref_name=None):
    """(markdown lines, ok): the runs' losses beside REF's, step by step, and one verdict line
    per run; ok when every run has every step of REF within its relative tolerance."""
    ref = {r["step"]: r["loss"] for r in train_records(ref_dir)}
    runs = [{r["step"]: r["loss"] for r in train_records(d)} for d in run_dirs]
    tols = list(rtols) if len(rtols) == len(runs) else [rtols[0]] * len(runs)
    names = names or [Path(d).name for d in run_dirs]
    ref_name = ref_name or Path(ref_dir).name
    out = [f"| step | {ref_name} |" + "".join(f" {n} | rel. diff |" for n in names),
           "|---" * (2 + 2 * len(runs)) + "|"]
    worst = [0.0] * len(runs)
    missing = [0] * len(runs)
    for step in sorted(ref):
        row = f"| {step} | {ref[step]:.6f} |"
        for i, run in enumerate(runs):
            if step in run:
                d = rel(run[step], ref[step])
                worst[i] = max(worst[i], d) if math.isfinite(d) else math.inf
                row += f" {run[step]:.6f} | {d:.2e} |"
            else:
                missing[i] += 1
                row += " - | - |"
        out.append(row)
    out.append("")
    all_ok = True
    for i, name in enumerate(names):
        ok = worst[i] <= tols[i] and missing[i] == 0 and len(runs[i]) > 0
        out.append(f"- {name}: max relative difference {worst[i]:.3e} over {len(ref)} steps "
                   f"(limit {tols[i]:g}){'' if not missing[i] else f', {missing[i]} steps missing'}: "
                   f"{'pass' if ok else 'FAIL'}")
        all_ok = all_ok and ok
    return out, all_ok


def cmd_compare(args):
    lines, ok = compare(args.ref, args.runs, args.rtol, args.names, args.ref_name)
    print("\n".join(lines))
    return 0 if ok else 1


def mean(xs):
    return sum(xs) / len(xs) if xs else None


def wall_clock_rate(recs, key):
    """`key` (a per-second rate of each step) over the wall clock between the first and the last
    record (their elapsed_s): what the steps really delivered, device work each step left queued
    included. Falls back to the per-step times when the records have no elapsed_s."""
    have = [r for r in recs if isinstance(r.get(key), (int, float)) and isinstance(r.get("step_time_s"), (int, float))]
    if not have:
        return None
    per_step = have[-1][key] * have[-1]["step_time_s"]  # tokens (or FLOPs) of one step
    if len(have) > 1 and all(isinstance(r.get("elapsed_s"), (int, float)) for r in have):
        return per_step * (len(have) - 1) / (have[-1]["elapsed_s"] - have[0]["elapsed_s"])
    return per_step * len(have) / sum(r["step_time_s"] for r in have)


def throughput(run_dir, skip):
    """Means over the train records after `skip` steps (rates over the wall clock), peaks over all."""
    recs = train_records(run_dir)
    timed = recs[skip:] if len(recs) > skip else recs[-1:]
    get = lambda k: [r[k] for r in timed if isinstance(r.get(k), (int, float))]
    peak_dev = [r["peak_device_memory_mib"] for r in recs if isinstance(r.get("peak_device_memory_mib"), (int, float))]
    out = {
        "steps": len(recs), "timed_steps": len(timed),
        "tokens_per_s": wall_clock_rate(timed, "tokens_per_s"),
        "model_tflops_per_device": wall_clock_rate(timed, "model_tflops_per_device"),
        "mfu": wall_clock_rate(timed, "mfu"), "step_time_s": mean(get("step_time_s")),
        "peak_device_memory_mib": max(peak_dev) if peak_dev else None,
        "max_rss_mib": max(get("max_rss_mib")) if get("max_rss_mib") else None,
        "first_loss": recs[0]["loss"] if recs else None, "last_loss": recs[-1]["loss"] if recs else None,
    }
    return out


def cmd_throughput(args):
    out = throughput(args.run, args.skip)
    print(json.dumps(out))
    return 0 if out["steps"] else 1


def plan_row(csv_path, mbs):
    """The `loom plan` CSV row with that micro-batch, as floats; None when there is none."""
    with open(csv_path) as f:
        rows = [r for r in csv.DictReader(f) if int(r["micro_batch"]) == mbs]
    if not rows:
        return None
    r = rows[0]
    keys = ["fits", "memory_gib", "weights_optimizer_gib", "activations_gib", "embedding_logits_gib",
            "transient_gib", "reserve_gib", "step_seconds", "tokens_per_second", "model_tflops_per_gpu", "mfu"]
    return {k: float(r[k]) for k in keys}


def cmd_plan(args):
    row = plan_row(args.csv, args.mbs)
    print(json.dumps(row))
    return 0 if row is not None else 1


def formula(layers, hidden, heads, seq, mbs, vocab, params):
    """Korthikanti et al.'s activation memory with selective recompute (t = 1), plus weights."""
    s, b, h, a, L, V = seq, mbs, hidden, heads, layers, vocab
    per_layer_sel = 34 * s * b * h                  # bytes, t = 1, selective recompute
    per_layer_none = s * b * h * (34 + 5 * a * s / h)
    attention_work = 5 * a * s * s * b              # recomputed attention core of one layer
    logits = 4 * s * b * V                          # fp32 logits kept for the cross entropy
    weights = 18 * params                      # bf16 params + fp32 main + 2 moments + fp32 grads
    total = L * per_layer_sel + attention_work + logits + weights
    out = {
        "per_layer_selective_gib": per_layer_sel / GIB, "per_layer_no_recompute_gib": per_layer_none / GIB,
        "layers_selective_gib": L * per_layer_sel / GIB, "attention_recompute_gib": attention_work / GIB,
        "logits_fp32_gib": logits / GIB, "weights_optimizer_gib": weights / GIB, "total_gib": total / GIB,
        "text": (f"activations L·34·s·b·h = {L}·34·{s}·{b}·{h} B = {L * per_layer_sel / GIB:.2f} GiB "
                 f"(no recompute: L·s·b·h·(34 + 5as/h) = {L * per_layer_none / GIB:.2f} GiB); "
                 f"recomputed attention core of one layer 5·a·s²·b = {attention_work / GIB:.2f} GiB; "
                 f"fp32 logits 4·s·b·V = {logits / GIB:.2f} GiB; weights+grads+Adam 18 B × {params:,} "
                 f"= {weights / GIB:.2f} GiB; sum {total / GIB:.2f} GiB"),
    }
    return out


def cmd_formula(args):
    print(json.dumps(formula(args.layers, args.hidden, args.heads, args.seq, args.mbs, args.vocab, args.params)))
    return 0


OOM = re.compile(r"out of memory|OutOfMemoryError|can't allocate memory|not enough memory|"
                 r"std::bad_alloc|CUBLAS_STATUS_ALLOC_FAILED|cudaErrorMemoryAllocation", re.I)


def is_oom(log):
    """Whether the log reports an out-of-memory error (device or host)."""
    return bool(OOM.search(Path(log).read_text(errors="replace")))


def cmd_oom(args):
    return 0 if is_oom(args.log) else 1


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compare")
    c.add_argument("ref")
    c.add_argument("runs", nargs="+")
    c.add_argument("--rtol", type=float, nargs="+", required=True)
    c.add_argument("--names", nargs="+")
    c.add_argument("--ref-name")
    t = sub.add_parser("throughput")
    t.add_argument("run")
    t.add_argument("--skip", type=int, default=3)
    q = sub.add_parser("plan")
    q.add_argument("csv")
    q.add_argument("--mbs", type=int, required=True)
    m = sub.add_parser("formula")
    for k in ("layers", "hidden", "heads", "seq", "mbs", "vocab", "params"):
        m.add_argument(f"--{k}", type=int, required=True)
    o = sub.add_parser("oom")
    o.add_argument("log")
    args = p.parse_args(argv)
    try:
        return {"compare": cmd_compare, "throughput": cmd_throughput, "plan": cmd_plan,
                "formula": cmd_formula, "oom": cmd_oom}[args.cmd](args)
    except (OSError, ValueError, KeyError) as e:
        print(f"bringup.metrics {args.cmd}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
