#!/usr/bin/env bash
# Loom's prompt-learning job (the README's prompt-learning command), after the main job:
#   the bundled task data/ptune (tools/make_ptune_task.py) on the main job's frozen GPT
#   (runs/gpt3_tiny_cpu), every method of recipes/ptune_tiny_cpu.yaml in turn, one CPU
#   process each: prompt tuning, p-tuning with the embedding, mlp, lstm and tpmlp encoders;
#   then the no-prompt baseline (loom generate --no-virtual-tokens), and a markdown table of
#   trainable parameters, steps, wall time and held-out test exact match (tools/ptune_table.py).
# Runs land in runs/ptune_tiny_cpu/<method>/ (their logs next to them, <method>.log).
# Extra arguments are recipe overrides for every method, e.g. tools/ptune_job.sh trainer.max_steps=50
# LOOM=/path/to/loom uses that executable and builds nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f runs/gpt3_tiny_cpu/checkpoints/latest_checkpointed_iteration.txt ]; then
  echo "runs/gpt3_tiny_cpu has no checkpoint: run the main job first (bash tools/main_job.sh)" >&2
  exit 1
fi
if [ -z "${LOOM:-}" ]; then
  tools/build.sh loom
  LOOM=build/bin/loom
fi
# The bundled task ships in the repository; tools/make_ptune_task.py rewrites the same files.
[ -f data/ptune/train.jsonl ] && [ -f data/ptune/valid.jsonl ] && [ -f data/ptune/test.jsonl ] \
  || python3 tools/make_ptune_task.py
recipe=recipes/ptune_tiny_cpu.yaml
out=runs/ptune_tiny_cpu
mkdir -p "$out"

# method name, then its overrides: a table of prompt vectors takes lr 0.1, an encoder 1e-2..3e-2
# (set once, from trials on earlier drafts of the task; not searched).
methods=(
  "prompt-tuning|model.virtual_prompt_style=prompt-tuning model.optim.lr=0.1 model.optim.sched.min_lr=0.01"
  "p-tuning embedding|model.p_tuning.encoder_type=embedding model.optim.lr=0.1 model.optim.sched.min_lr=0.01"
  "p-tuning mlp|model.p_tuning.encoder_type=mlp model.optim.lr=3e-2 model.optim.sched.min_lr=3e-3"
  "p-tuning lstm|model.p_tuning.encoder_type=lstm model.optim.lr=1e-2 model.optim.sched.min_lr=1e-3"
  "p-tuning tpmlp|model.p_tuning.encoder_type=tpmlp model.optim.lr=3e-2 model.optim.sched.min_lr=3e-3"
)
table_args=()
for m in "${methods[@]}"; do
  name=${m%%|*}
  read -r -a overrides <<< "${m#*|}"
  dir="$out/${name// /_}"
  rm -rf "$dir"
  echo "[ptune_job] $name" >&2
  start=$(date +%s.%N)
  "$LOOM" ptune "$recipe" run.results_dir="$dir" "${overrides[@]}" "$@" > "$dir.log" 2>&1 \
    || { tail -20 "$dir.log" >&2; exit 1; }
  end=$(date +%s.%N)
  python3 -c "print(round($end - $start, 1))" > "$dir.wall_s"
  grep -E "^step .*(validation|test)" "$dir.log" >&2 || true
  # The same test set decoded for real (the run's test line scores it by teacher forcing).
  "$LOOM" generate --prompt-checkpoint "$dir" --input data/ptune/test.jsonl --greedy \
    --max-new-tokens 2 --output "$dir.test.jsonl" 2> "$dir.generate.log" \
    || { cat "$dir.generate.log" >&2; exit 1; }
  table_args+=(--run "$name=$dir")
done

# The no-prompt baseline: the same records and template without its virtual tokens, greedy.
# Any run's tables name the base and the template; the first one's are used.
first="$out/prompt-tuning"
"$LOOM" generate --prompt-checkpoint "$first" --input data/ptune/test.jsonl --greedy \
  --max-new-tokens 2 --no-virtual-tokens --output "$out/baseline.jsonl" 2> "$out/baseline.log" \
  || { cat "$out/baseline.log" >&2; exit 1; }
grep "exact match" "$out/baseline.log" >&2

python3 tools/ptune_table.py "${table_args[@]}" --baseline "$out/baseline.log" \
  --test data/ptune/test.jsonl | tee "$out/table.md"
