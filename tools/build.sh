#!/usr/bin/env bash
# Configure and build Loom into build/ (Ninja, ccache, at most 2 jobs: a torch translation
# unit needs ~1 GB and the reference machine has 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${LOOM_BUILD_JOBS:-2}
[ -f build/build.ninja ] || cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >&2
start=$(date +%s)
cmake --build build -j "$jobs" >&2
echo "[build] done in $(( $(date +%s) - start )) s" >&2
