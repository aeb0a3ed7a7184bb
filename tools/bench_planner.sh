#!/usr/bin/env bash
# Times the planner's full layout search for GPT-3 175B on 1024 A100-80GB (128 nodes, global
# batch 1536) on one core, and prints the published-result reproduction.
#   tools/bench_planner.sh [build-dir]      (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
[ -f "$build/build.ninja" ] || cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >&2
if [ -x "$build/bin/loom" ] && "$build/bin/loom" --help | grep -q ' plan '; then
  echo "[bench_planner] loom plan --size 175 --nodes 128 --global-batch-size 1536" >&2
  /usr/bin/time -f "[bench_planner] wall %e s, max RSS %M KiB" taskset -c 0 \
    "$build/bin/loom" plan --size 175 --nodes 128 --global-batch-size 1536 --tokens 300e9 --top 5 \
    --write-recipe /dev/null
  "$build/bin/loom" plan --validate --global-batch-size 1
else
  cmake --build "$build" --target loom_test_planner -j "${LOOM_BUILD_JOBS:-2}" >&2
  taskset -c 0 "$build/bin/loom_test_planner" "175B on 1024 GPUs*,published results*" 2>&1 |
    grep -E "layouts searched|Korthikanti|Narayanan|mean \|error\||passed|failed"
fi
