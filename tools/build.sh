#!/usr/bin/env bash
# Configure and build Loom into build/ (Ninja, ccache, at most 2 jobs: a torch translation
# unit needs ~1 GB and the reference machine has 2 cores).
#   tools/build.sh            everything (library, `loom`, tests, benchmarks)
#   tools/build.sh loom       only the `loom` executable
# LOOM_DEBUG_INFO=0 configures without line tables (-g1; same -O2 code, faster to compile and
# link: what CI's tools/test.sh uses); the default keeps them for developers.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${LOOM_BUILD_JOBS:-2}
if [ ! -f build/build.ninja ]; then
  flags=()
  if [ "${LOOM_DEBUG_INFO:-1}" = 0 ]; then
    flags=(-DLOOM_DEBUG_INFO=OFF)
  fi
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOOM_ONLY= "${flags[@]}" >&2
fi
start=$(date +%s)
if [ $# -gt 0 ]; then
  cmake --build build -j "$jobs" --target "$@" >&2
else
  cmake --build build -j "$jobs" >&2
fi
echo "[build] done in $(( $(date +%s) - start )) s" >&2
