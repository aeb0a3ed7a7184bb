#!/usr/bin/env bash
# Builds the fuzz target of Loom's readers of untrusted files and runs each reader for a bounded
# time (tools/fuzz/README.md). CI runs `tools/fuzz/run.sh --seconds 60` (tools/test.sh).
#   tools/fuzz/run.sh [--seconds TOTAL] [--targets recipe,idx,npy,checkpoint,stream,jsonl,hftokenizer]
#                     [--engine auto|libfuzzer|mutation]
# Exit 0: no crash; 1: a reader crashed, hung or failed a check (the input is kept under
# <build>/crashes/); 2: bad usage. The build goes to $LOOM_FUZZ_BUILD_DIR (default build-fuzz).
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=60
targets=recipe,idx,npy,checkpoint,stream,jsonl,hftokenizer
engine=auto
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --targets) targets=$2; shift 2 ;;
    --engine) engine=$2; shift 2 ;;
    *) echo "usage: tools/fuzz/run.sh [--seconds N] [--targets a,b] [--engine auto|libfuzzer|mutation]" >&2; exit 2 ;;
  esac
done
root=$(pwd)
build=$(realpath -m "${LOOM_FUZZ_BUILD_DIR:-build-fuzz}")  # absolute: the mutation driver runs in crashes/
if [ "$engine" = auto ]; then
  # libFuzzer ships with clang's runtime libraries (Debian: clang + libclang-rt-14-dev).
  if command -v clang++ >/dev/null && clang++ -fsanitize=fuzzer -x c++ - -o /dev/null >/dev/null 2>&1 <<<'
      #include <cstdint>
      #include <cstddef>
      extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }'; then
    engine=libfuzzer
  else
    engine=mutation
  fi
fi
compiler=()
[ "$engine" = libfuzzer ] && compiler=(-DCMAKE_CXX_COMPILER=clang++)
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S tools/fuzz -B "$build" -G Ninja -DLOOM_FUZZ_ENGINE="$engine" "${compiler[@]}" "${launcher[@]}" >/dev/null
cmake --build "$build" -j "${LOOM_BUILD_JOBS:-2}" >&2

IFS=, read -r -a list <<<"$targets"
per=$(( seconds / ${#list[@]} ))
[ "$per" -ge 1 ] || per=1
seed=${LOOM_FUZZ_SEED:-1}
mkdir -p "$build/crashes"
status=0
for target in "${list[@]}"; do
  case "$target" in
    recipe) seeds=("$root/tools/fuzz/seeds/recipe" "$root/recipes" "$root/tests/config/malformed") ;;
    idx) seeds=("$root/tools/fuzz/seeds/idx") ;;
    npy) seeds=("$root/tools/fuzz/seeds/npy") ;;
    checkpoint) seeds=("$root/tools/fuzz/seeds/checkpoint") ;;
    stream) seeds=("$root/tools/fuzz/seeds/stream") ;;
    jsonl) seeds=("$root/tools/fuzz/seeds/jsonl") ;;
    hftokenizer) seeds=("$root/tools/fuzz/seeds/hftokenizer") ;;
    *) echo "tools/fuzz/run.sh: unknown target '$target' (recipe, idx, npy, checkpoint, stream, jsonl, hftokenizer)" >&2
       exit 2 ;;
  esac
  corpus="$build/corpus/$target"  # grows across runs; the seeds stay as they are
  mkdir -p "$corpus"
  echo "[fuzz] $target: $engine for ${per} s (seed $seed)" >&2
  if [ "$engine" = libfuzzer ]; then
    LOOM_FUZZ_TARGET=$target ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 \
      "$build/loom_fuzz" -max_total_time="$per" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
      -seed="$seed" -print_final_stats=1 -artifact_prefix="$build/crashes/$target-" \
      "$corpus" "${seeds[@]}" 2>"$build/$target.log" || status=1
    grep -E "^(#[0-9]+ +DONE|stat::number_of_executed_units|==[0-9]+==ERROR|SUMMARY)" "$build/$target.log" >&2 || true
  else
    (cd "$build/crashes" && LOOM_FUZZ_TARGET=$target ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 \
      "$build/loom_fuzz" --seconds "$per" --seed "$seed" "${seeds[@]}") \
      2>"$build/$target.log" || status=1
    tail -n 1 "$build/$target.log" >&2
  fi
  if [ "$status" != 0 ]; then
    echo "[fuzz] $target FAILED: see $build/$target.log and $build/crashes/" >&2
    tail -n 40 "$build/$target.log" >&2
    exit 1
  fi
done
echo "[fuzz] no crash in ${seconds} s over: $targets" >&2
