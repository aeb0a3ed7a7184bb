#!/usr/bin/env bash
# The whole test suite on a fresh machine: set-up, build, C++ tests (ctest), a bounded fuzz run
# of the input readers (tools/fuzz), Python tests (pytest).
#   tools/test.sh            (README command (b); .ci/run runs exactly this)
#   tools/test.sh --full     also runs the bundled prompt-learning task end to end (the main
#                            job trained from scratch, then p-tuned: LOOM_PTUNE_TASK=1, ~6 min),
#                            prepares the GPU bundle and dry-runs the GPU bring-up on the
#                            stand-in device (tools/gpu_bundle.sh, tools/gpu_bringup.sh --dry-run):
#                            run it before a session with a GPU host, so that GPU minutes go to
#                            measurement; it downloads ~60 MB, so CI does not. It also runs
#                            every prompt-learning method under every layout
#                            (LOOM_PTUNE_FULL_MATRIX=1; CI runs a set covering every layout once)
#                            and the 64-client x 500-request serving soak with the t=2 x p=2
#                            HTTP server and lm-eval's `lm_eval --model local-completions` command
#                            against loom serve (LOOM_SERVE_SOAK_FULL=1; CI runs 8 x 25, t=2 x p=2
#                            in the engine's C++ test, and lm-eval through simple_evaluate),
#                            loom eval at t=2 x p=2 x d=2, p=2 and batch 1 (LOOM_EVAL_FULL=1; CI
#                            runs t=2 x p=2 at batch 3),
#                            and every case of the memory sweep `loom plan --validate-memory`
#                            (LOOM_MEMORY_SWEEP_FULL=1, ~8 min; CI runs its 4-case subset),
#                            and `loom plan --measure` ranking six layouts by 18 timed runs
#                            (LOOM_PLAN_MEASURE_FULL=1, ~2 min; CI measures two end to end)
set -euo pipefail
cd "$(dirname "$0")/.."
full=0
[ "${1:-}" = "--full" ] && full=1
tools/setup.sh
# A fresh clone builds without debug information (CI's time goes to tests; same -O2 code).
[ -f build/build.ninja ] || export LOOM_DEBUG_INFO="${LOOM_DEBUG_INFO:-0}"
tools/build.sh
echo "[test] C++ tests" >&2
(cd build && ctest --output-on-failure --timeout 900 -j "${LOOM_TEST_JOBS:-2}")
echo "[test] fuzzing the recipe, .idx, .npy, checkpoint, corpus stream, JSON-lines and tokenizer.json readers" >&2
tools/fuzz/run.sh --seconds "${LOOM_FUZZ_SECONDS:-60}"
echo "[test] Python tests" >&2
if [ "$full" = 1 ]; then
  export LOOM_PTUNE_FULL_MATRIX=1 LOOM_PTUNE_TASK=1 LOOM_SERVE_SOAK_FULL=1 LOOM_EVAL_FULL=1 LOOM_MEMORY_SWEEP_FULL=1 \
    LOOM_PLAN_MEASURE_FULL=1
fi
.venv/bin/python -m pytest -q tests/python
if [ "$full" = 1 ]; then
  echo "[test] GPU bring-up dry run" >&2
  tools/gpu_bundle.sh
  tools/gpu_bringup.sh --dry-run
fi
