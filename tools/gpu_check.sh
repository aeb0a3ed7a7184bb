#!/usr/bin/env bash
# GPU check of the op library, for a host with a GPU and only torch (2.11+cu130), nvcc
# 13.0, cmake and ninja; it installs nothing.
#   1. builds extensions/ standalone against that torch (build-gpu-check/lib/libloom_ops.so),
#      unless LOOM_OPS_LIB names a library already built (tools/gpu_bringup.sh passes the one
#      its `loom` build made, to save a second build of the kernels)
#   2. runs the op tests on cpu and cuda (tests/python/test_ops_*.py: torch references per
#      dtype, opcheck, gradcheck, Philox keying, CPU/CUDA mask bit-identity) with pytest,
#      or tools/bench_ops_runner.py where pytest is missing
#   3. prints each op's GB/s beside ATen's and the copy bandwidth at GPT-3 shapes
#      (tools/bench_ops.py) and checks the LayerNorm targets
# The results go to stdout and, when $OUT is set, to $OUT/gpu_results.md.
#
#   tools/gpu_check.sh                          # on the GPU host
#   LOOM_GPU_CHECK_DEVICE=cpu tools/gpu_check.sh  # dry run here: same Python code on CPU,
#                                                 # reusing an existing build if there is one
# Environment: LOOM_PYTHON (python with torch; default python3, or .venv/bin/python when
# present), LOOM_GPU_CHECK_BUILD (build dir), LOOM_OPS_LIB (library to use instead of building
# one, on either device; the dry run also falls back to build/lib/libloom_ops.so).
# Exit status: 0 all passed and targets met, 1 a build or test failure, 3 targets missed.
set -uo pipefail
cd "$(dirname "$0")/.."
device=${LOOM_GPU_CHECK_DEVICE:-cuda}
if [ -n "${LOOM_PYTHON:-}" ]; then py=$LOOM_PYTHON
elif [ -x .venv/bin/python ]; then py=.venv/bin/python
else py=python3; fi
build=${LOOM_GPU_CHECK_BUILD:-build-gpu-check}
results=/dev/null
if [ -n "${OUT:-}" ]; then mkdir -p "$OUT" && results=$OUT/gpu_results.md && : > "$results"; fi
say() { echo "$*" | tee -a "$results"; }
status=0

say "# loom_ops GPU check ($(date -u +%Y-%m-%dT%H:%M:%SZ), device $device)"
say ""
"$py" -c 'import torch; print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, GPU: " + (torch.cuda.get_device_name() if torch.cuda.is_available() else "none"))' 2>&1 | tee -a "$results"
if [ "$device" = cuda ]; then
  "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' ||
    { say "gpu_check: torch sees no GPU (set LOOM_GPU_CHECK_DEVICE=cpu for a dry run)"; exit 1; }
fi

# 1. the library
if [ -n "${LOOM_OPS_LIB:-}" ]; then
  [ -f "$LOOM_OPS_LIB" ] || { say "gpu_check: LOOM_OPS_LIB=$LOOM_OPS_LIB does not exist"; exit 1; }
  lib=$LOOM_OPS_LIB
elif [ "$device" = cpu ] && [ -f build/lib/libloom_ops.so ]; then
  lib=build/lib/libloom_ops.so
else
  cuda_flag=ON
  [ "$device" = cpu ] && cuda_flag=OFF
  mkdir -p "$build"
  start=$(date +%s)
  if ! { cmake -S extensions -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
           -DLOOM_PYTHON="$py" -DLOOM_WITH_CUDA=$cuda_flag > "$build/configure.log" 2>&1 &&
         cmake --build "$build" -j "$(nproc)" > "$build/build.log" 2>&1; }; then
    say "gpu_check: building the op library failed; last lines of the logs:"
    tail -n 30 "$build/configure.log" "$build/build.log" 2>/dev/null | tee -a "$results"
    exit 1
  fi
  say "built $build/lib/libloom_ops.so in $(( $(date +%s) - start )) s"
  lib=$build/lib/libloom_ops.so
fi
say "library: $lib"
say ""

# 2. tests
devices=cpu
# On the GPU host only the cuda cases (the CPU/CUDA mask identity among them, which computes
# its CPU side itself): CI runs the cpu cases on every change, and GPU minutes are scarce.
[ "$device" = cuda ] && devices=${LOOM_GPU_CHECK_DEVICES:-cuda}
say "## op tests on $devices"
say '```'
if "$py" -c 'import pytest' 2>/dev/null; then
  LOOM_OPS_LIB=$lib LOOM_OPS_DEVICES=$devices "$py" -m pytest -q -p no:cacheprovider \
    tests/python/test_ops_*.py 2>&1 | tail -n 40 | tee -a "$results"
  rc=${PIPESTATUS[0]}
else
  LOOM_OPS_LIB=$lib LOOM_OPS_DEVICES=$devices "$py" tools/bench_ops_runner.py 2>&1 |
    grep -v '^SKIP' | tail -n 60 | tee -a "$results"
  rc=${PIPESTATUS[0]}
fi
say '```'
[ "$rc" -eq 0 ] || { say "op tests FAILED (exit $rc)"; status=1; }
say ""

# 3. bandwidth table
bench_out=()
[ "$results" != /dev/null ] && bench_out=(--out "$results")
"$py" tools/bench_ops.py --lib "$lib" --device "$device" "${bench_out[@]}"
rc=$?
if [ "$rc" -eq 3 ]; then
  [ "$status" -eq 0 ] && status=3
elif [ "$rc" -ne 0 ]; then
  say "bench_ops FAILED (exit $rc)"; status=1
fi
say ""
say "gpu_check: exit status $status"
exit $status
