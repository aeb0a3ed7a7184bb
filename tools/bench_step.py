#!/usr/bin/env python3
"""Training-step time with the data-parallel gradient reduction overlapped with backward
(model.optim.overlap_grad_sync) off and on, and the share of the step it leaves exposed.

    .venv/bin/python tools/bench_step.py [--loom build/bin/loom] [--steps 12] [--warmup 3]
        [--layouts d2,d2p2,d2dist] [--rounds 1] [--gpu] [--hidden 256] [--bucket 2000000]
        [--profile cpu.json]
        [--data PREFIX] [--json-out FILE] [--dry-run]

Each run is `loom train` on the main-job recipe (recipes/gpt3_tiny_cpu.yaml) at one layout:
d2 = data-parallel 2 (2 ranks), d2p2 = data-parallel 2 x pipeline 2 (4 ranks, 1F1B), d2dist = d2
with the distributed optimizer (overlap on also sets overlap_param_sync); t = 1, no
sequence parallelism or recomputation, fp32 on CPU ranks (bf16 with --gpu), validation and
checkpoints off. Per run, from metrics.jsonl after the first --warmup steps:
  step s      median step_time_s (data, forward, backward, optimizer) over the ranks' records;
  exposed s   median grad_sync_s: host seconds the optimizer step waited for the gradient
              reduction to finish (all of it with overlap off, the part backward did not hide
              with it on);
  exposed %   exposed s / step s.
With --profile (a `loom plan calibrate` profile of this machine; GPU hosts use their built-in
hardware table) the planner's predicted step time and DP-communication share of the same layout
are printed beside them, with --overlap-dp-comm for the overlap rows. With --rounds N the on
and off runs alternate N times and each keeps its best round (a shared machine). --dry-run
prints the commands without running them. Exit status 1 when a run fails.
"""
import argparse
import csv
import io
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "gpt3_tiny_cpu.yaml"
# name -> (pipeline size, ranks, distributed optimizer)
LAYOUTS = {"d2": (1, 2, False), "d2p2": (2, 4, False), "d2dist": (1, 2, True)}
NAMES = {"d2": "d=2", "d2p2": "d=2 x p=2", "d2dist": "d=2 dist. opt."}


def overrides(args, layout, overlap, run_dir):
    p, world, distributed = LAYOUTS[layout]
    # The distributed optimizer overlaps both: the gradient reduce-scatter with backward and the
    # parameter all-gather with the next forward (waited per bucket).
    dist = ["model.optim.name=distributed_fused_adam",
            f"model.optim.overlap_param_sync={'true' if overlap else 'false'}"] if distributed else []
    return dist + [
        f"trainer.devices={world}",
        f"trainer.max_steps={args.steps}",
        "trainer.log_every_n_steps=1",
        f"trainer.val_check_interval={args.steps + 1}",
        "trainer.limit_val_batches=0",
        f"trainer.accelerator={'gpu' if args.gpu else 'cpu'}",
        f"trainer.precision={'bf16' if args.gpu else 32}",
        f"exp_manager.explicit_log_dir={run_dir}",
        "exp_manager.create_checkpoint_callback=false",
        f"exp_manager.checkpoint_callback_params.every_n_steps={args.steps + 1}",
        "model.tensor_model_parallel_size=1",
        f"model.pipeline_model_parallel_size={p}",
        "model.sequence_parallel=false",
        "model.activations_checkpoint_granularity=null",
        f"model.hidden_size={args.hidden}",
        f"model.ffn_hidden_size={4 * args.hidden}",
        f"model.micro_batch_size={args.micro_batch}",
        f"model.global_batch_size={args.micro_batch * 2 * args.microbatches}",
        f"model.optim.overlap_grad_sync={'true' if overlap else 'false'}",
        f"model.optim.ddp_bucket_size={args.bucket}",
    ] + ([f"model.data.data_prefix=[1.0,{args.data}]"] if args.data else [])


def run_one(args, layout, overlap, work):
    run_dir = work / f"{layout}_{'on' if overlap else 'off'}"
    cmd = [str(args.loom), "train", str(RECIPE), *overrides(args, layout, overlap, run_dir)]
    if args.dry_run:
        print(" ".join(cmd))
        return None
    subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-3000:])
        raise SystemExit(f"bench_step: {layout} overlap={'on' if overlap else 'off'} failed (exit {done.returncode})")
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in recs if r.get("kind") == "train" and r["step"] > args.warmup]
    if not train:
        raise SystemExit(f"bench_step: {run_dir}/metrics.jsonl has no timed steps")
    step = statistics.median(r["step_time_s"] for r in train)
    exposed = statistics.median(r.get("grad_sync_s", float("nan")) for r in train)
    return {"step_s": step, "exposed_s": exposed, "loss": train[-1]["loss"]}


def predicted(args, layout, overlap):
    """The planner's step seconds and DP-communication seconds for the layout, or None."""
    if not args.profile and not args.gpu:
        return None
    p, world, distributed = LAYOUTS[layout]
    cmd = [str(args.loom), "plan", "--recipe", str(RECIPE), "--tp", "1", "--pp", str(p), "--vp", "1",
           "--mbs", str(args.micro_batch), "--sp", "off", "--recompute", "none",
           "--dist-opt", "on" if distributed else "off",
           "--csv", "-", *overrides(args, layout, overlap, "/tmp/unused")]
    if args.profile:
        cmd += ["--profile", str(args.profile)]
    if overlap:
        cmd.append("--overlap-dp-comm")
    if args.dry_run:
        print(" ".join(cmd))
        return None
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        sys.stderr.write(f"bench_step: the planner failed: {done.stderr.strip()[-500:]}\n")
        return None
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    if not rows:
        return None
    return {"step_s": float(rows[0]["step_seconds"]), "dp_comm_s": float(rows[0]["dp_comm_s"])}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--loom", type=pathlib.Path, default=ROOT / "build" / "bin" / "loom")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--layouts", default="d2,d2p2,d2dist")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--hidden", type=int, default=256, help="model.hidden_size (more gradient bytes to reduce)")
    ap.add_argument("--bucket", type=int, default=2_000_000,
                    help="model.optim.ddp_bucket_size in elements (Megatron's default 40M would put "
                         "these small models in one bucket, which no overlap can hide)")
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--microbatches", type=int, default=2, help="micro-batches per data-parallel rank")
    ap.add_argument("--gpu", action="store_true", help="trainer.accelerator=gpu, bf16")
    ap.add_argument("--profile", type=pathlib.Path, help="planner profile for the prediction columns")
    ap.add_argument("--data", help="model.data.data_prefix (default: the recipe's)")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--json-out", type=pathlib.Path)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    layouts = [x for x in args.layouts.split(",") if x]
    for x in layouts:
        if x not in LAYOUTS:
            ap.error(f"--layouts: unknown layout '{x}' (expected {', '.join(LAYOUTS)})")
    if not args.dry_run and not args.loom.exists():
        ap.error(f"--loom: {args.loom} does not exist (build it, or pass the binary)")
    if args.steps <= args.warmup:
        ap.error("--steps must exceed --warmup")

    results = {}
    with tempfile.TemporaryDirectory(prefix="bench_step_") as tmp:
        work = pathlib.Path(tmp)
        for _ in range(args.rounds):
            for layout in layouts:
                for overlap in (False, True):
                    r = run_one(args, layout, overlap, work)
                    if r is None:
                        continue
                    best = results.get((layout, overlap))
                    if best is None or r["step_s"] < best["step_s"]:
                        results[(layout, overlap)] = r
        preds = {(layout, o): predicted(args, layout, o) for layout in layouts for o in (False, True)}
    if args.dry_run:
        return 0

    print(f"loom train, {'GPU bf16' if args.gpu else 'CPU ranks fp32'}, hidden {args.hidden}, buckets of {args.bucket} elements, "
          f"{args.microbatches} micro-batches of {args.micro_batch} per data rank, median of steps "
          f"{args.warmup + 1}..{args.steps}, best of {args.rounds} round(s)")
    print("| layout | overlap_grad_sync | step s | exposed grad reduction s | exposed % | planner step s | planner DP comm % |")
    print("|---|---|---|---|---|---|---|")
    for layout in layouts:
        for overlap in (False, True):
            r, pr = results[(layout, overlap)], preds[(layout, overlap)]
            share = 100.0 * r["exposed_s"] / r["step_s"]
            pred = f"{pr['step_s']:.4f} | {100.0 * pr['dp_comm_s'] / pr['step_s']:.1f}" if pr else "- | -"
            name = NAMES[layout]
            print(f"| {name} | {'on' if overlap else 'off'} | {r['step_s']:.4f} | {r['exposed_s']:.4f} | {share:.1f} | {pred} |")
    for layout in layouts:
        off, on = results[(layout, False)], results[(layout, True)]
        print(f"{layout}: step time on/off = {on['step_s'] / off['step_s']:.3f}; "
              f"last losses {off['loss']:.6f} (off) vs {on['loss']:.6f} (on)")
    if args.json_out:
        args.json_out.write_text(json.dumps(
            [{"layout": layout, "overlap": o, **results[(layout, o)], "predicted": preds[(layout, o)]}
             for layout in layouts for o in (False, True)], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
