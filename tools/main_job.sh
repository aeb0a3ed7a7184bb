#!/usr/bin/env bash
# Loom's main job on a fresh machine (README command (a)):
#   set up, build `loom`, preprocess the bundled Shakespeare corpus with the GPT-2 tokenizer,
#   train recipes/gpt3_tiny_cpu.yaml on 4 CPU ranks (t=2, p=2, sequence parallelism, selective
#   recompute), then generate a sample from the final checkpoint.
# Extra arguments are recipe overrides, e.g. tools/main_job.sh trainer.max_steps=50
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
tools/build.sh loom
loom=build/bin/loom
prefix=data/preprocessed/tinyshakespeare
if [ ! -f "${prefix}_text_document.idx" ]; then
  mkdir -p data/preprocessed
  "$loom" preprocess --input data/tinyshakespeare.txt --output-prefix "$prefix" \
    --json-keys text --vocab-file data/gpt2-vocab.json --merge-file data/gpt2-merges.txt \
    --append-eod --workers 2
fi
"$loom" train recipes/gpt3_tiny_cpu.yaml "$@"
# A sample from the final checkpoint, under its own layout (t=2 ranks; pipeline stages merged).
"$loom" generate --checkpoint runs/gpt3_tiny_cpu --prompt "ROMEO:" --max-new-tokens 60 \
  --temperature 0.8 --top-k 40 --seed 1234
