#!/usr/bin/env bash
# One-shot GPU bring-up of Loom on the lent GPU host (one H200; torch wheel, nvcc, cmake, ninja,
# a C++ compiler; no installs, no network; gpu_bundle/ from tools/gpu_bundle.sh carried in).
# Writes docs/gpu_results.md (and $OUT/gpu_results.md plus $OUT/bringup/ logs when $OUT is set)
# and exits non-zero when any check failed or did not run. Steps (--steps picks some; the
# environment report always runs):
# In the order they run (the scarcest figures first):
#   env         nvidia-smi, torch.cuda properties, compilers, the bundle's libraries load
#   build       `loom` + libloom_ops.so, CUDA for this GPU's architecture only, tests off
#   tiny        recipes/gpt3_tiny_cpu.yaml, 1 rank through NCCL (LOOM_SINGLE_RANK_GROUPS=1),
#               30 steps: GPU fp32 and bf16 against CPU fp32 (the bundle's reference, made by
#               tools/gpu_bundle.sh; fp32 within 1e-3 relative at every step, bf16 within 3%)
#   throughput  recipes/gpt3_126m.yaml on the GPU (bf16, s 2048, selective recompute, t=p=d=1)
#               at the largest micro-batch that fits, beside `loom plan` and the formula
#   calibrate   `loom plan calibrate` on the device (GEMM shapes, fused attention, copy bandwidth,
#               per-op cost; collectives with more than one rank) into a profile, then `loom plan`'s
#               prediction for the throughput step's measured 126m run with that profile, beside
#               the built-in profile's and the measurement
#   mcore       the same model and micro-batch in Megatron-Core (tools/bench_mcore_gpt.py)
#   layout      the tiny recipe as t=2 x p=2 with sequence parallelism, 4 ranks sharing the GPU
#               (LOOM_DEVICE_COLLECTIVES=gloo), against the 1-rank GPU fp32 run (1e-3)
#   ops         tools/gpu_check.sh on the library just built (op tests on cuda, bandwidth)
#
#   tools/gpu_bringup.sh                          # everything, within LOOM_BRINGUP_DEADLINE_S
#   tools/gpu_bringup.sh --steps build            # only the build (a second call reuses it)
#   tools/gpu_bringup.sh --steps ops,tiny,layout,throughput,calibrate,mcore,overlap
#   tools/gpu_bringup.sh --dry-run                # here, on CPU: reuses build/, small shapes,
#                                                 # results in runs/bringup-dryrun/
#                                                 # (LOOM_BRINGUP_BUILD=DIR: another build)
# A hard deadline for the whole call (LOOM_BRINGUP_DEADLINE_S, default 570 s: under the device
# tool's 600-s command limit) and one per step (timeout) keep a hang from eating the session:
# a step that does not fit in the time left is recorded as not run, and the next one starts.
# Environment: LOOM_PYTHON (python with torch; default: the first of python3/python that
# imports it), LOOM_BRINGUP_MBS (micro-batch candidates of step 6, default 1 2 4 ... 128),
# LOOM_BRINGUP_TINY_STEPS (30), LOOM_BRINGUP_TPUT_STEPS (10, the first 3 not timed),
# LOOM_BRINGUP_JOBS (build jobs, default nproc).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd)

# ---------------------------------------------------------------- options and paths
DRY=0
MAKE_REF=""
STEPS="env,build,tiny,throughput,calibrate,mcore,layout,overlap,ops"
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) DRY=1 ;;
    --make-reference) MAKE_REF=$2; shift ;;
    --steps) STEPS="env,$2"; shift ;;
    --steps=*) STEPS="env,${1#--steps=}" ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "gpu_bringup: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
START=$(date +%s)
if [ -n "$MAKE_REF" ]; then
  # Here, for tools/gpu_bundle.sh: the tiny step's CPU fp32 run, with the GPU run's step count.
  DEADLINE=600 WORK=runs/bringup-reference RESULTS=$WORK/reference.md BUILD=${LOOM_BIN:+$(dirname "$(dirname "$LOOM_BIN")")}
  BUILD=${BUILD:-build} TINY_STEPS=${LOOM_BRINGUP_TINY_STEPS:-30} TPUT_STEPS=0 TPUT_SKIP=0 MBS_CANDIDATES=""
elif [ "$DRY" = 1 ]; then
  DEADLINE=${LOOM_BRINGUP_DEADLINE_S:-600}
  WORK=runs/bringup-dryrun
  RESULTS=$WORK/gpu_results.md          # a scratch file: never docs/ for a dry run
  BUILD=${LOOM_BRINGUP_BUILD:-build}    # reuse the development build, do not rebuild
  TINY_STEPS=${LOOM_BRINGUP_TINY_STEPS:-5}
  TPUT_STEPS=${LOOM_BRINGUP_TPUT_STEPS:-4}
  TPUT_SKIP=2
  MBS_CANDIDATES=${LOOM_BRINGUP_MBS:-"4 8 16 32 64"}
else
  DEADLINE=${LOOM_BRINGUP_DEADLINE_S:-570}
  WORK=runs/bringup
  RESULTS=docs/gpu_results.md
  BUILD=build-gpu
  TINY_STEPS=${LOOM_BRINGUP_TINY_STEPS:-30}
  TPUT_STEPS=${LOOM_BRINGUP_TPUT_STEPS:-10}
  TPUT_SKIP=3
  MBS_CANDIDATES=${LOOM_BRINGUP_MBS:-"1 2 4 8 16 32 64 128"}
fi
LOOM=$BUILD/bin/loom
OPS_LIB=$BUILD/lib/libloom_ops.so
DATA=gpu_bundle/data/tinyshakespeare_text_document
METRICS=tools/gpu_bringup_metrics.py
RESERVE_S=10                 # kept back at the end to write the results
LOGS=$WORK/logs
SECTIONS=$WORK/sections
rm -rf "$LOGS" "$SECTIONS" "$WORK/runs" "$WORK/pysite" "$WORK/ops_out"
rm -f "$WORK"/*.json "$WORK"/*.csv "$WORK"/*.smi
mkdir -p "$LOGS" "$SECTIONS" "$WORK/runs" "$(dirname "$RESULTS")"
: > "$WORK/summary.tsv"
FAILED=0

# ---------------------------------------------------------------- time budget
elapsed() { echo $(( $(date +%s) - START )); }
remaining() { echo $(( DEADLINE - $(elapsed) - RESERVE_S )); }
# budget CAP: seconds a command may take now (its cap, or what is left before the deadline).
budget() { local r; r=$(remaining); [ "$1" -lt "$r" ] && echo "$1" || echo "$r"; }

# run_timed LOG SECONDS CMD...: runs CMD with a hard timeout (TERM, KILL 10 s later), output to
# LOG; returns its status (124/137: timed out). Refuses to start with under 5 s left.
run_timed() {
  local log=$1 secs=$2
  shift 2
  if [ "$secs" -lt 5 ]; then echo "not started: out of time" > "$log"; return 124; fi
  echo "+ $* (timeout ${secs}s)" > "$log"
  timeout --kill-after=10 "$secs" "$@" >> "$log" 2>&1
}

# ---------------------------------------------------------------- results
CURRENT=""        # the step being run
STEP_START=0
md() { printf '%s\n' "$*" >> "$SECTIONS/$CURRENT.md"; }
md_log_tail() {   # md_log_tail LOG [N]: the log's last lines as a code block
  md '```'
  tail -n "${2:-25}" "$1" | cut -c1-300 >> "$SECTIONS/$CURRENT.md"
  md '```'
}
begin_step() {   # begin_step NAME TITLE
  CURRENT=$1
  STEP_START=$(date +%s)
  : > "$SECTIONS/$CURRENT.md"
  md "## $2"
  md ""
  echo "[gpu_bringup] $(elapsed)s: $2" >&2
}
end_step() {     # end_step pass|FAIL|not run  DETAIL
  local secs=$(( $(date +%s) - STEP_START ))
  [ "$1" = pass ] || FAILED=1
  printf '%s\t%s\t%s\t%s\n' "$CURRENT" "$1" "$secs" "$2" >> "$WORK/summary.tsv"
  md ""
  md "**Result: $1** ($secs s) — $2"
  md ""
  echo "[gpu_bringup] $CURRENT: $1 ($secs s) $2" >&2
  assemble_results
}
want() { [[ ",$STEPS," == *",$1,"* ]]; }

assemble_results() {
  local s f
  {
    if [ "$DRY" = 1 ]; then
      echo "# Loom GPU bring-up — DRY RUN on the development machine (no GPU figures)"
      echo ""
      echo "> Dry run of tools/gpu_bringup.sh: the existing build, small shapes, ${ACCEL_NOTE:-}."
      echo "> It checks the script's plumbing only; nothing below describes a GPU."
    else
      echo "# Loom GPU bring-up results"
    fi
    echo ""
    echo "${HEADLINE:-}"
    echo ""
    echo "Written by \`tools/gpu_bringup.sh$([ "$DRY" = 1 ] && echo ' --dry-run')\` on $(date -u +%Y-%m-%dT%H:%M:%SZ), $(elapsed) s after its start (deadline ${DEADLINE} s); steps: ${STEPS#env,}."
    echo ""
    echo "| step | result | seconds | detail |"
    echo "|---|---|---|---|"
    awk -F'\t' '{printf "| %s | %s | %s | %s |\n", $1, $2, $3, $4}' "$WORK/summary.tsv"
    echo ""
    for s in env build tiny throughput calibrate mcore layout ops overlap; do
      [ -f "$SECTIONS/$s.md" ] && cat "$SECTIONS/$s.md"
    done
  } > "$RESULTS"
  if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT/bringup"
    cp "$RESULTS" "$OUT/gpu_results.md"
    # Logs come back truncated (the last 400 lines), with the runs' metrics and JSON.
    for f in "$LOGS"/*.log; do [ -f "$f" ] && tail -n 400 "$f" > "$OUT/bringup/$(basename "$f")"; done
    for f in "$WORK"/runs/*/metrics.jsonl; do [ -f "$f" ] && cp "$f" "$OUT/bringup/$(basename "$(dirname "$f")").metrics.jsonl"; done
    for f in "$WORK"/*.json "$WORK"/*.csv; do [ -f "$f" ] && cp "$f" "$OUT/bringup/"; done
  fi
}
on_signal() {
  [ -n "$CURRENT" ] && md "" && md "**Interrupted by a signal during this step.**"
  printf '%s\t%s\t%s\t%s\n' "${CURRENT:-?}" "FAIL" "$(( $(date +%s) - STEP_START ))" "interrupted" >> "$WORK/summary.tsv"
  assemble_results
  exit 1
}
trap on_signal TERM INT

# ---------------------------------------------------------------- 1. environment
find_python() {
  local c
  for c in ${LOOM_PYTHON:-} $( { [ "$DRY" = 1 ] || [ -n "$MAKE_REF" ]; } && echo .venv/bin/python) python3 python; do
    if command -v "$c" > /dev/null 2>&1 && "$c" -c 'import torch' > /dev/null 2>&1; then
      command -v "$c"; return 0
    fi
  done
  return 1
}

step_env() {
  begin_step env "1. Environment"
  local log=$LOGS/env.log
  : > "$log"
  PY=$(find_python) || { md "No python that imports torch (set LOOM_PYTHON)."; end_step FAIL "no python with torch"; return 1; }
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host: $(uname -srm); $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"); $(nproc) cores; $(awk '/MemTotal/ {printf "%.0f GiB RAM", $2/1048576}' /proc/meminfo)"
    echo "glibc: $(getconf GNU_LIBC_VERSION 2>/dev/null)"
    echo "c++: $(c++ --version 2>/dev/null | head -n 1 || echo none)"
    local stdcxx
    stdcxx=$(c++ -print-file-name=libstdc++.so.6 2>/dev/null)
    [ -f "$stdcxx" ] && echo "libstdc++: $stdcxx, newest $(grep -ao 'GLIBCXX_3\.4\.[0-9]*' "$stdcxx" | sort -uV | tail -n 1)"
    echo "cmake: $(cmake --version 2>/dev/null | head -n 1 || echo none); ninja: $(ninja --version 2>/dev/null || echo none)"
    echo "nvcc: $( (command -v nvcc > /dev/null && nvcc --version || /usr/local/cuda/bin/nvcc --version) 2>/dev/null | grep -o 'release [0-9.]*' || echo none)"
    echo "python: $PY ($("$PY" -c 'import sys; print(sys.version.split()[0])'))"
    "$PY" - <<'EOF'
import importlib.util, torch
try:
    v = torch.cuda.nccl.version()
    nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
except Exception as e:  # a CPU-only torch, or no NCCL in it
    nccl = f"- ({type(e).__name__})"
print(f"torch: {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, NCCL {nccl}")
for m in ("numpy", "packaging", "pytest"):
    print(f"python module {m}: {'present' if importlib.util.find_spec(m) else 'absent'}")
if torch.cuda.is_available():
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        print(f"cuda:{i}: {p.name}, sm_{p.major}{p.minor}, {p.total_memory / 2**30:.1f} GiB, {p.multi_processor_count} SMs")
    p = torch.cuda.get_device_properties(0)
    print(f"ARCH={p.major}{p.minor}")
    print(f"GPU_NAME={p.name}")
    print(f"GPU_MEM_GIB={p.total_memory / 2**30:.1f}")
else:
    print("cuda: not available")
EOF
    if command -v nvidia-smi > /dev/null 2>&1; then
      # Two queries: an unknown field (older drivers) fails a whole query.
      nvidia-smi --query-gpu=name,driver_version,memory.total,pci.bus_id --format=csv 2>&1
      nvidia-smi --query-gpu=compute_cap,clocks.max.sm,clocks.max.mem,power.limit --format=csv 2>&1
      nvidia-smi 2>&1 | grep -o 'CUDA Version: [0-9.]*' | head -n 1
    else
      echo "nvidia-smi: absent"
    fi
  } >> "$log" 2>&1
  ARCH=$(sed -n 's/^ARCH=//p' "$log")
  GPU_NAME=$(sed -n 's/^GPU_NAME=//p' "$log")
  GPU_MEM_GIB=$(sed -n 's/^GPU_MEM_GIB=//p' "$log")
  local driver torch_v
  driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)
  torch_v=$(grep '^torch:' "$log")
  HEADLINE="GPU: ${GPU_NAME:-none}${ARCH:+ (sm_$ARCH)}${GPU_MEM_GIB:+, $GPU_MEM_GIB GiB}; driver ${driver:-n/a}$(grep -o ' (CUDA Version: [0-9.]*' "$log" | head -n 1 | sed 's/$/)/; s/ (CUDA Version:/, driver CUDA/; s/)$//'); $torch_v; nvcc $(grep '^nvcc:' "$log" | cut -d' ' -f3); $(grep '^c++:' "$log" | cut -d' ' -f2-)."
  md '```'
  grep -v '^\(ARCH\|GPU_NAME\|GPU_MEM_GIB\)=' "$log" >> "$SECTIONS/env.md"
  md '```'
  if [ ! -f gpu_bundle/env.sh ]; then
    md "gpu_bundle/ is missing: run tools/gpu_bundle.sh on the development machine and carry [\"gpu_bundle\"]."
    end_step FAIL "no gpu_bundle/"
    return 1
  fi
  # shellcheck source=/dev/null
  source gpu_bundle/env.sh
  # The Debian 12 libraries need the host's glibc/libstdc++ to be at least as new.
  local lib missing=""
  for lib in libyaml-cpp.so.0.7 libfmt.so.9 libpcre2-8.so.0; do
    if ldd "$LOOM_BUNDLE_LIB/$lib" 2>&1 | grep -qE 'not found'; then
      missing+=" $lib"
      md "\`ldd $lib\`: $(ldd "$LOOM_BUNDLE_LIB/$lib" 2>&1 | grep 'not found' | head -n 3 | tr '\n' ' ')"
    fi
  done
  if [ -n "$missing" ]; then end_step FAIL "bundled libraries do not load:$missing"; return 1; fi
  if [ "$DRY" = 0 ] && [ -z "$ARCH" ]; then
    end_step FAIL "torch sees no GPU"
    return 1
  fi
  end_step pass "${GPU_NAME:-no GPU (dry run)}"
}

# ---------------------------------------------------------------- 2. build
step_build() {
  begin_step build "2. Build (\`loom\` and libloom_ops.so)"
  local log=$LOGS/build.log check_log=$LOGS/bundle_check.log gen=Ninja t0 secs rc nvcc_args=()
  command -v ninja > /dev/null 2>&1 || gen="Unix Makefiles"
  # Two seconds that tell a library problem from a Loom problem.
  rm -rf build-bundle-check
  run_timed "$check_log" "$(budget 60)" bash -c "cmake -S tools/gpu_bundle_check -B build-bundle-check -G '$gen' \
      ${LOOM_BUNDLE_CMAKE_ARGS[*]@Q} && cmake --build build-bundle-check && build-bundle-check/bundle_check"
  rc=$?
  md "Bundle check (tools/gpu_bundle_check, the same find_package calls): $(grep -h 'bundle check:' "$check_log" | tail -n 1)"
  if [ "$rc" -ne 0 ]; then md_log_tail "$check_log" 30; end_step FAIL "the bundle check failed (exit $rc)"; return 1; fi
  if [ "$DRY" = 1 ]; then
    md ""
    md "Dry run: reusing the development build \`$LOOM\` (not rebuilt)."
    [ -x "$LOOM" ] && [ -f "$OPS_LIB" ] || { end_step FAIL "no $LOOM / $OPS_LIB: build it first (tools/build.sh loom)"; return 1; }
    end_step pass "reused $LOOM"
    return 0
  fi
  command -v nvcc > /dev/null 2>&1 && nvcc_args=(-DCMAKE_CUDA_COMPILER="$(command -v nvcc)")
  t0=$(date +%s)
  run_timed "$log" "$(budget 480)" bash -c "cmake -S . -B '$BUILD' -G '$gen' -DCMAKE_BUILD_TYPE=Release \
      -DLOOM_BUILD_TESTS=OFF -DLOOM_WITH_CUDA=ON -DLOOM_CUDA_ARCHS='$ARCH' -DLOOM_PYTHON='$PY' \
      ${LOOM_BUNDLE_CMAKE_ARGS[*]@Q} ${nvcc_args[*]@Q} && \
    cmake --build '$BUILD' -j '${LOOM_BRINGUP_JOBS:-$(nproc)}' --target loom"
  rc=$?
  secs=$(( $(date +%s) - t0 ))
  md "Configure + build of \`loom\` (Release, tests off, CUDA arch $ARCH only, -j ${LOOM_BRINGUP_JOBS:-$(nproc)}): **$secs s**."
  md ""
  grep -E "Loom: torch|Found (CUDA|CUDAToolkit)|ccache" "$log" | head -n 5 | sed 's/^/    /' >> "$SECTIONS/build.md"
  if [ "$rc" -ne 0 ]; then
    md_log_tail "$log" 40
    end_step FAIL "build failed (exit $rc$([ "$rc" -ge 124 ] && echo ', timed out'))"
    return 1
  fi
  if ! grep -q '^LOOM_WITH_CUDA:BOOL=ON' "$BUILD/CMakeCache.txt"; then
    md "The build has no CUDA kernels (nvcc was not found, LOOM_WITH_CUDA is off)."
    end_step FAIL "built without CUDA"
    return 1
  fi
  NCCL_BUILT=1
  if grep -q 'LOOM_NCCL_INCLUDE:PATH=.*NOTFOUND' "$BUILD/CMakeCache.txt" || ! grep -q 'LOOM_NCCL_INCLUDE:PATH=' "$BUILD/CMakeCache.txt"; then
    # One-rank runs and Gloo-staged layouts work without NCCL: the later steps still run.
    md "**Warning:** nccl.h was not found: this build has no NCCL; the one-GPU runs use Loom's single-process groups and no NCCL check is made."
    NCCL_BUILT=0
  fi
  if ldd "$LOOM" | grep -q 'not found'; then
    md_log_tail <(ldd "$LOOM" | grep 'not found') 10
    end_step FAIL "loom has unresolved libraries"
    return 1
  fi
  end_step pass "$secs s"
}

# ---------------------------------------------------------------- 3. op library
step_ops() {
  begin_step ops "7. Op library check (tools/gpu_check.sh)"
  local log=$LOGS/gpu_check.log rc dev=cuda
  [ "$DRY" = 1 ] && dev=cpu
  [ -f "$OPS_LIB" ] || { end_step FAIL "no $OPS_LIB (build step)"; return 1; }
  rm -rf "$WORK/ops_out"
  # gpu_check writes $OUT/gpu_results.md itself: give it its own folder, include its file here.
  run_timed "$log" "$(budget 120)" env LOOM_PYTHON="$PY" LOOM_OPS_LIB="$OPS_LIB" \
    LOOM_GPU_CHECK_DEVICE=$dev OUT="$ROOT/$WORK/ops_out" tools/gpu_check.sh
  rc=$?
  md "Library: \`$OPS_LIB\` (the build step's), device $dev."
  md ""
  if [ -f "$WORK/ops_out/gpu_results.md" ]; then
    sed 's/^## /#### /; s/^# /### /' "$WORK/ops_out/gpu_results.md" >> "$SECTIONS/ops.md"
  else
    md_log_tail "$log" 40
  fi
  case $rc in
    0) end_step pass "op tests passed, targets met" ;;
    3) end_step FAIL "op tests passed, bandwidth targets missed (exit 3)" ;;
    124|137) end_step FAIL "timed out" ;;
    *) end_step FAIL "exit $rc" ;;
  esac
}

# ---------------------------------------------------------------- 4./5. the tiny recipe
# The accelerator Loom's GPU code path runs on: the GPU, or in a dry run the CPU-backed
# stand-in device when it is built, else the CPU itself.
# DEVICE_ENV: environment for runs with trainer.accelerator=gpu (the plugin, in a dry run).
choose_accelerator() {
  ACCEL=gpu
  ACCEL_NOTE="GPU"
  DEVICE_ENV=()
  if [ "$DRY" = 1 ]; then
    if [ -f "$BUILD/lib/libloom_standin_device.so" ]; then
      DEVICE_ENV=(LOOM_DEVICE_PLUGIN="$ROOT/$BUILD/lib/libloom_standin_device.so")
      ACCEL_NOTE="trainer.accelerator=gpu on the stand-in device ($BUILD/lib/libloom_standin_device.so)"
    else
      ACCEL=cpu
      ACCEL_NOTE="trainer.accelerator=cpu for the GPU runs ($BUILD/lib/libloom_standin_device.so is not built yet)"
    fi
  fi
}

# tiny_run NAME ACCEL PRECISION [overrides...]: one run of the tiny recipe into $WORK/runs/NAME.
tiny_run() {
  local name=$1 accel=$2 precision=$3 e=()
  shift 3
  # On the accelerator, real communicators even for one rank: the run goes through NCCL (or
  # the stand-in's communicator in a dry run) as a multi-GPU run does.
  [ "$accel" = gpu ] && e=("${DEVICE_ENV[@]}")
  [ "$accel" = gpu ] && [ "${NCCL_BUILT:-1}" = 1 ] && e+=(LOOM_SINGLE_RANK_GROUPS=1)
  rm -rf "$WORK/runs/$name"
  run_timed "$LOGS/$name.log" "$(budget 120)" env "${e[@]}" "$LOOM" train recipes/gpt3_tiny_cpu.yaml \
    run.name="$name" run.results_dir="$WORK/runs/$name" \
    trainer.accelerator="$accel" trainer.precision="$precision" trainer.devices=1 \
    model.tensor_model_parallel_size=1 model.pipeline_model_parallel_size=1 model.sequence_parallel=false \
    trainer.max_steps="$TINY_STEPS" trainer.val_check_interval="$TINY_STEPS" trainer.limit_val_batches=0 \
    trainer.log_every_n_steps=10 exp_manager.create_checkpoint_callback=false exp_manager.resume_if_exists=false \
    "model.data.data_prefix=[1.0,$DATA]" model.data.index_mapping_dir="$WORK/index_cache" "$@"
  local rc=$?
  md "- \`$name\` ($accel, precision $precision): exit $rc$([ "$rc" -ge 124 ] && echo ' (timed out)'); $(grep -m1 '\[loom\] device:' "$LOGS/$name.log" | sed 's/.*\] //')"
  [ "$rc" -eq 0 ] || md_log_tail "$LOGS/$name.log" 15
  return $rc
}

step_tiny() {
  begin_step tiny "3. Tiny recipe on one device: GPU fp32 and bf16 against CPU fp32"
  md "recipes/gpt3_tiny_cpu.yaml as one rank (t=p=d=1, 4 micro-batches of 2, sequence 128), $TINY_STEPS steps, no validation or checkpoints; GPU runs on $ACCEL_NOTE; losses from each run's metrics.jsonl."
  md ""
  local ok=1
  tiny_run tiny_gpu_fp32 "$ACCEL" 32 || ok=0
  tiny_run tiny_gpu_bf16 "$ACCEL" bf16 || ok=0
  local ref=gpu_bundle/reference/tiny_cpu_fp32.metrics.jsonl
  if [ "$DRY" = 0 ] && [ -f "$ref" ] && [ "$(cat gpu_bundle/reference/tiny_steps 2>/dev/null)" = "$TINY_STEPS" ]; then
    mkdir -p "$WORK/runs/tiny_cpu_fp32"
    cp "$ref" "$WORK/runs/tiny_cpu_fp32/metrics.jsonl"
    md "- \`tiny_cpu_fp32\` (cpu, precision 32): the bundle's, made by tools/gpu_bundle.sh on the development machine ($(head -c 200 gpu_bundle/reference/made_on 2>/dev/null))"
  else
    tiny_run tiny_cpu_fp32 cpu 32 || ok=0
  fi
  md ""
  if [ -f "$WORK/runs/tiny_cpu_fp32/metrics.jsonl" ]; then
    "$PY" "$METRICS" compare "$WORK/runs/tiny_cpu_fp32" "$WORK/runs/tiny_gpu_fp32" "$WORK/runs/tiny_gpu_bf16" \
      --rtol 1e-3 3e-2 --ref-name "CPU fp32" --names "GPU fp32" "GPU bf16" >> "$SECTIONS/tiny.md" 2>&1 || ok=0
  else
    ok=0
  fi
  if [ "$ok" = 1 ]; then end_step pass "fp32 within 1e-3, bf16 within 3% of CPU fp32"
  else end_step FAIL "see the table (a run failed or a tolerance was exceeded)"; fi
}

step_layout() {
  begin_step layout "6. t=2 × p=2 with sequence parallelism, 4 ranks on one device"
  local ref=tiny_gpu_fp32 ok=1
  [ -f "$WORK/runs/$ref/metrics.jsonl" ] || ref=tiny_cpu_fp32
  md "NCCL refuses two ranks on one device, so device tensors' collectives go through Gloo staged via host memory (\`LOOM_DEVICE_COLLECTIVES=gloo\`); rank r runs on cuda:(local_rank % device_count). Compared with the 1-rank run \`$ref\` (limit 1e-3 relative)."
  md ""
  local -a env_args=()
  [ "$ACCEL" = gpu ] && env_args=(LOOM_DEVICE_COLLECTIVES=gloo "${DEVICE_ENV[@]}")
  rm -rf "$WORK/runs/layout_t2p2"
  run_timed "$LOGS/layout_t2p2.log" "$(budget 150)" env "${env_args[@]}" "$LOOM" train recipes/gpt3_tiny_cpu.yaml \
    run.name=layout_t2p2 run.results_dir="$WORK/runs/layout_t2p2" trainer.accelerator="$ACCEL" trainer.precision=32 \
    trainer.devices=4 model.tensor_model_parallel_size=2 model.pipeline_model_parallel_size=2 model.sequence_parallel=true \
    trainer.max_steps="$TINY_STEPS" trainer.val_check_interval="$TINY_STEPS" trainer.limit_val_batches=0 \
    trainer.log_every_n_steps=10 exp_manager.create_checkpoint_callback=false exp_manager.resume_if_exists=false \
    "model.data.data_prefix=[1.0,$DATA]" model.data.index_mapping_dir="$WORK/index_cache"
  local rc=$?
  md "- backend: $([ "$ACCEL" = gpu ] && echo LOOM_DEVICE_COLLECTIVES=gloo || echo 'CPU ranks (Gloo)'); Loom says: $(grep -m1 '\[loom\] device:' "$LOGS/layout_t2p2.log" | sed 's/.*\] //'); exit $rc"
  md ""
  if [ "$rc" -ne 0 ]; then md_log_tail "$LOGS/layout_t2p2.log" 20; ok=0; fi
  if [ -f "$WORK/runs/$ref/metrics.jsonl" ] && [ -f "$WORK/runs/layout_t2p2/metrics.jsonl" ]; then
    "$PY" "$METRICS" compare "$WORK/runs/$ref" "$WORK/runs/layout_t2p2" --rtol 1e-3 \
      --ref-name "1 rank ($ref)" --names "t2 p2 SP" >> "$SECTIONS/layout.md" 2>&1 || ok=0
  else
    ok=0
  fi
  local detail
  detail=$(grep -h 'max relative difference' "$SECTIONS/layout.md" | tail -n 1 | sed 's/^- t2 p2 SP: //')
  local backend=cpu
  [ "$ACCEL" = gpu ] && backend="LOOM_DEVICE_COLLECTIVES=gloo"
  if [ "$ok" = 1 ]; then end_step pass "$backend: $detail"; else end_step FAIL "$backend: ${detail:-no losses (exit $rc)}"; fi
}

# ---------------------------------------------------------------- 6. 126m throughput
# The 126m shape on the GPU; a dry run shrinks it to check the plumbing only.
tput_overrides() {   # tput_overrides MBS -> one override per line
  local b=$1
  printf '%s\n' trainer.num_nodes=1 trainer.devices=1 cluster.gpus_per_node=1 trainer.accelerator="$ACCEL" \
    run.results_dir="$WORK/runs/tput_b$b" exp_manager.explicit_log_dir="$WORK/runs/tput_b$b" \
    model.tensor_model_parallel_size=1 model.pipeline_model_parallel_size=1 model.sequence_parallel=false \
    model.micro_batch_size="$b" model.global_batch_size="$b" model.optim.name=fused_adam \
    model.activations_checkpoint_granularity=selective "model.data.data_prefix=[1.0,$DATA]" \
    'model.data.splits_string="900,90,10"' model.data.index_mapping_dir="$WORK/index_cache" \
    trainer.max_steps="$TPUT_STEPS" trainer.val_check_interval="$TPUT_STEPS" trainer.limit_val_batches=0 \
    trainer.log_every_n_steps=1 exp_manager.create_checkpoint_callback=false exp_manager.resume_if_exists=false
  if [ "$DRY" = 1 ]; then
    printf '%s\n' model.num_layers=2 model.hidden_size=64 model.num_attention_heads=2 model.encoder_seq_length=64 \
      model.max_position_embeddings=64 model.data.seq_length=64 trainer.precision=32
  fi
}

# The planner's built-in profile of the GPU at hand (csrc/planner/data/gpus.json).
gpu_profile() {
  case "${GPU_NAME:-}" in
    *H100*) echo H100 ;;
    *A100*) awk -v m="${GPU_MEM_GIB:-80}" 'BEGIN { print (m > 50 ? "A100-80GB" : "A100-40GB") }' ;;
    *) echo H200 ;;   # the lent host's GPU (and the dry run's pretend one)
  esac
}

# plan_for MBS [PROFILE]: `loom plan` for exactly this layout and micro-batch ->
# $WORK/plan_bMBS.csv; with a measured PROFILE (--profile) -> $WORK/plan_cal_bMBS.csv.
plan_for() {
  local b=$1 profile=${2:-} mem_args=(--gpu "$(gpu_profile)") ov=() tag=plan
  # The plan describes the GPU (an analytic model), whatever device a dry run trains on.
  mapfile -t ov < <(tput_overrides "$b"; echo trainer.accelerator=gpu)
  [ "$DRY" = 1 ] && mem_args=(--gpu H200 --gpu-memory-gib "$DRY_MEM_GIB" --reserve-gib 0.5 --fragmentation 0)
  if [ -n "$profile" ]; then
    tag=plan_cal
    mem_args+=(--profile "$profile")
  else
    echo "${mem_args[1]}" > "$WORK/plan_gpu.txt"
  fi
  "$LOOM" plan --recipe recipes/gpt3_126m.yaml "${ov[@]}" "${mem_args[@]}" --tp 1 --pp 1 --vp 1 --mbs "$b" \
    --sp off --recompute selective --dist-opt off --csv "$WORK/${tag}_b$b.csv" > "$LOGS/${tag}_b$b.log" 2>&1
}

# tput_run MBS: trains TPUT_STEPS steps; echoes ok, oom, timeout or error.
tput_run() {
  local b=$1 name=tput_b$1 rc sampler="" ov=()
  mapfile -t ov < <(tput_overrides "$b")
  rm -rf "$WORK/runs/$name"
  if command -v nvidia-smi > /dev/null 2>&1 && [ "$DRY" = 0 ]; then
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$WORK/$name.smi" 2>/dev/null &
    sampler=$!
  fi
  if [ "$DRY" = 1 ] && [ ${#DEVICE_ENV[@]} -gt 0 ]; then
    # A pretend device memory: the stand-in's capacity, so a too-large micro-batch runs out of it.
    run_timed "$LOGS/$name.log" "$(budget 90)" env "${DEVICE_ENV[@]}" LOOM_STANDIN_MEMORY_MIB=$((DRY_MEM_GIB * 1024)) \
      "$LOOM" train recipes/gpt3_126m.yaml run.name="$name" "${ov[@]}"
  elif [ "$DRY" = 1 ]; then
    # No stand-in: an address-space limit pretends to be the device memory.
    run_timed "$LOGS/$name.log" "$(budget 90)" bash -c 'ulimit -v $1; shift; exec "$@"' _ \
      $((DRY_MEM_GIB * 1024 * 1024)) "$LOOM" train recipes/gpt3_126m.yaml run.name="$name" "${ov[@]}"
  else
    run_timed "$LOGS/$name.log" "$(budget 120)" "$LOOM" train recipes/gpt3_126m.yaml run.name="$name" "${ov[@]}"
  fi
  rc=$?
  [ -n "$sampler" ] && kill "$sampler" 2>/dev/null && wait "$sampler" 2>/dev/null
  if [ "$rc" -eq 0 ]; then echo ok
  elif "$PY" "$METRICS" oom "$LOGS/$name.log"; then echo oom
  elif [ "$rc" -ge 124 ]; then echo timeout
  else echo error
  fi
}

# first_error LOG: the line that names the failure (not the stack frames after it).
first_error() {
  grep -v '^+ ' "$1" | grep -m1 -iE 'out of memory|error|exception|terminate|timed out|not started' | cut -c1-400 ||
    tail -n 1 "$1" | cut -c1-400
}
smi_peak() { [ -s "$WORK/$1.smi" ] && sort -n "$WORK/$1.smi" | tail -n 1 || echo "-"; }
# jget JSON KEY [DECIMALS]: one value of a JSON object for the tables ("-" when absent;
# three decimals below 1 so that small dry-run figures do not print as 0.0).
jget() {
  "$PY" - "$1" "$2" "${3:-1}" <<'EOF'
import json, sys
d = json.loads(sys.argv[1] or "{}") or {}
v, n = d.get(sys.argv[2]), int(sys.argv[3])
if v is None: print("-")
elif isinstance(v, bool) or not isinstance(v, (int, float)): print(v)
else: print(f"{v:.{3 if n and abs(v) < 1 else n}f}")
EOF
}

step_throughput() {
  begin_step throughput "4. GPT-3 126m throughput on one device"
  DRY_MEM_GIB=1   # small enough that the dry run's micro-batch search meets an out-of-memory
  local -a cands
  read -r -a cands <<< "$MBS_CANDIDATES"
  md "recipes/gpt3_126m.yaml, bf16, sequence 2048, selective recompute, t=p=d=1, fused_adam, global batch = micro-batch (one micro-batch per step), the carried tinyshakespeare corpus, $TPUT_STEPS steps (means over the last $((TPUT_STEPS - TPUT_SKIP))), no validation or checkpoints."
  [ "$DRY" = 1 ] && md "Dry run: 2 layers, hidden 64, 2 heads, sequence 64, fp32, ${ACCEL}; device memory pretended as a ${DRY_MEM_GIB} GiB address-space limit."
  md ""
  # Predictions for every candidate; start from the largest one the planner says fits.
  local b i start=0 pred=()
  for i in "${!cands[@]}"; do
    b=${cands[$i]}
    plan_for "$b" || md "- loom plan failed for b=$b: $(tail -n 2 "$LOGS/plan_b$b.log" | tr '\n' ' ')"
    pred[$i]=$("$PY" "$METRICS" plan "$WORK/plan_b$b.csv" --mbs "$b" 2>/dev/null || echo null)
    [ "$(jget "${pred[$i]}" fits 0)" = 1 ] && start=$i
  done
  # Go up from there while runs succeed, down while they run out of memory.
  local -A outcome
  i=$start
  local best=-1 dir=0 r
  while [ "$i" -ge 0 ] && [ "$i" -lt "${#cands[@]}" ] && [ "$(remaining)" -gt 30 ]; do
    b=${cands[$i]}
    r=$(tput_run "$b")
    outcome[$b]=$r
    echo "[gpu_bringup]   micro-batch $b: $r" >&2
    if [ "$r" = ok ]; then
      best=$i
      [ "$dir" -lt 0 ] && break      # came down from an OOM: this is the largest that fits
      dir=1; i=$((i + 1))
    elif [ "$r" = oom ]; then
      [ "$dir" -gt 0 ] && break      # went up past the largest that fits
      dir=-1; i=$((i - 1))
    else
      break                          # a timeout or another error: no point in trying more
    fi
  done
  md "| micro-batch | run | tokens/s | model TFLOP/s | MFU | peak device MiB (Loom) | peak MiB (nvidia-smi) | max RSS MiB | predicted GiB (loom plan) | predicted tokens/s | predicted MFU |"
  md "|---|---|---|---|---|---|---|---|---|---|---|"
  local tp p
  for i in "${!cands[@]}"; do
    b=${cands[$i]}
    [ -n "${outcome[$b]:-}" ] || continue
    tp=$([ "${outcome[$b]}" = ok ] && "$PY" "$METRICS" throughput "$WORK/runs/tput_b$b" --skip "$TPUT_SKIP" 2>/dev/null || echo '{}')
    p=${pred[$i]}
    [ "$p" = null ] && p='{}'
    md "| $b | ${outcome[$b]} | $(jget "$tp" tokens_per_s 0) | $(jget "$tp" model_tflops_per_device 1) | $(jget "$tp" mfu 3) | $(jget "$tp" peak_device_memory_mib 0) | $(smi_peak "tput_b$b") | $(jget "$tp" max_rss_mib 0) | $(jget "$p" memory_gib 1) | $(jget "$p" tokens_per_second 0) | $(jget "$p" mfu 3) |"
  done
  md ""
  for b in "${!outcome[@]}"; do
    [ "${outcome[$b]}" = ok ] || md "- micro-batch $b (${outcome[$b]}): $(first_error "$LOGS/tput_b$b.log")"
  done
  md ""
  if [ "$best" -lt 0 ]; then
    WINNER=""
    end_step FAIL "no micro-batch ran ($(for b in "${!outcome[@]}"; do printf '%s=%s ' "$b" "${outcome[$b]}"; done))"
    return 1
  fi
  WINNER=${cands[$best]}
  LOOM_TPUT=$("$PY" "$METRICS" throughput "$WORK/runs/tput_b$WINNER" --skip "$TPUT_SKIP")
  echo "$LOOM_TPUT" > "$WORK/loom_throughput.json"
  # Kept across calls, for `--steps mcore` in a later call of this script.
  printf '%s\n%s\n' "$WINNER" "$LOOM_TPUT" > "$WORK/last_throughput.txt"
  local mp=${pred[$best]} f
  # The formula for the run's shape (from its resolved config).
  local L h a s V P
  L=$(cfg model.num_layers "$WINNER"); h=$(cfg model.hidden_size "$WINNER"); a=$(cfg model.num_attention_heads "$WINNER")
  s=$(cfg model.encoder_seq_length "$WINNER")
  local div
  div=$(cfg model.make_vocab_size_divisible_by "$WINNER")
  [ "${div:-0}" -gt 0 ] 2>/dev/null || div=128
  V=$(( (50257 + div - 1) / div * div ))   # the GPT-2 vocabulary padded as Loom pads it (t = 1)
  P=$(grep -m1 -o '[0-9]* parameters' "$LOGS/tput_b$WINNER.log" | grep -o '^[0-9]*')
  f=$("$PY" "$METRICS" formula --layers "$L" --hidden "$h" --heads "$a" --seq "$s" --mbs "$WINNER" --vocab "$V" --params "${P:-0}")
  md "**Largest micro-batch that ran: $WINNER** ($( [ "$((best + 1))" -lt "${#cands[@]}" ] && echo "next candidate ${cands[$((best + 1))]}: ${outcome[${cands[$((best + 1))]}]:-not tried}" || echo "largest candidate")): $(jget "$LOOM_TPUT" tokens_per_s 0) tokens/s, $(jget "$LOOM_TPUT" model_tflops_per_device 1) model TFLOP/s per GPU, MFU $(jget "$LOOM_TPUT" mfu 3), peak device memory $(jget "$LOOM_TPUT" peak_device_memory_mib 0) MiB (Loom's metric; nvidia-smi $(smi_peak "tput_b$WINNER") MiB for the whole process)."
  md ""
  md "- \`loom plan\` ($(cat "$WORK/plan_gpu.txt" 2>/dev/null || echo H200) profile, this layout and micro-batch): $(jget "$mp" memory_gib 2) GiB = weights+grads+optimizer $(jget "$mp" weights_optimizer_gib 2) + activations $(jget "$mp" activations_gib 2) + embedding/logits $(jget "$mp" embedding_logits_gib 2) + recompute working set $(jget "$mp" transient_gib 2) + reserve $(jget "$mp" reserve_gib 2); $(jget "$mp" step_seconds 3) s/step, $(jget "$mp" tokens_per_second 0) tokens/s, MFU $(jget "$mp" mfu 3)."
  md "- Formula (Korthikanti et al. 2022, t = 1, selective recompute; L=$L h=$h a=$a s=$s b=$WINNER V=$V P=${P:-?}): $(jget "$f" text)."
  md "- Parameters ${P:-?} from Loom's log; 18 B/parameter = bf16 weights (2) + fp32 main weights (4) + two fp32 Adam moments (8) + fp32 gradients (4), docs/planner.md's non-distributed accounting."
  end_step pass "b=$WINNER: $(jget "$LOOM_TPUT" tokens_per_s 0) tokens/s, MFU $(jget "$LOOM_TPUT" mfu 3)"
}

# cfg KEY MBS: a value of the throughput run's resolved recipe (config.yaml).
cfg() {
  "$PY" - "$WORK/runs/tput_b$2/config.yaml" "$1" <<'EOF' 2>/dev/null || echo 0
import re, sys
section, key = sys.argv[2].split(".", 1)
inside = False
for line in open(sys.argv[1]):
    if re.match(r"^\S", line):
        inside = line.strip() == section + ":"
    elif inside:
        m = re.match(r"^  " + re.escape(key) + r":\s*(\S+)", line)
        if m:
            print(m.group(1)); break
EOF
}

# ---------------------------------------------------------------- 5. calibrated profile
# `loom plan calibrate` measures the device (docs/planner.md, "Measured profiles"); the planner
# then predicts the throughput step's measured run (its micro-batch, from this call or the last
# one: $WORK/last_throughput.txt) with that profile and with the built-in one.
step_calibrate() {
  begin_step calibrate "4b. Measured planner profile (\`loom plan calibrate\`) against the measured 126m run"
  DRY_MEM_GIB=${DRY_MEM_GIB:-1}
  local log=$LOGS/calibrate.log profile=$WORK/calibrate.json rc b tput
  local -a env_args=() secs=()
  [ "$ACCEL" = gpu ] && env_args=("${DEVICE_ENV[@]}")
  # The dtype the throughput step trains in: bf16 on the GPU, fp32 in a dry run (short measurements).
  [ "$DRY" = 1 ] && secs=(--seconds 0.03 --dtype fp32)
  rm -f "$profile"
  run_timed "$log" "$(budget 150)" env "${env_args[@]}" "$LOOM" plan calibrate --devices 1 --accelerator "$ACCEL" \
    "${secs[@]}" --out "$profile"
  rc=$?
  md "\`loom plan calibrate --devices 1 --accelerator $ACCEL\` on $ACCEL_NOTE (one rank: no collectives): exit $rc$([ "$rc" -ge 124 ] && echo ' (timed out)'). $(grep -m1 'loom plan calibrate:' "$log" | sed 's/^loom plan calibrate: //')"
  if [ "$rc" -ne 0 ] || [ ! -s "$profile" ]; then md_log_tail "$log" 20; end_step FAIL "calibrate exit $rc"; return 1; fi
  md ""
  "$PY" - "$profile" >> "$SECTIONS/calibrate.md" <<'EOF'
import json, sys
p = json.load(open(sys.argv[1]))
d = p.get("device", {})
print(f"Profile device entry: {d.get('name')} (peak {d.get('peak_tflops')} TFLOP/s, HBM {d.get('memory_bandwidth_gbs')} GB/s); "
      f"copy {p.get('memory_bandwidth_gbs', 0):.1f} GB/s, per-op cost {p.get('kernel_launch_us', 0):.1f} us, "
      f"dtype {p.get('measured', {}).get('dtype')}.")
print("")
print("| GEMM m x n x k | TFLOP/s |")
print("|---|---|")
for g in p.get("gemm", []):
    print(f"| {g['m']} x {g['n']} x {g['k']} | {g['tflops']:.3g} |")
if p.get("fused_attention"):
    print("")
    print("| fused attention batch x heads x seq x head_dim | forward TFLOP/s | backward TFLOP/s |")
    print("|---|---|---|")
    for a in p["fused_attention"]:
        print(f"| {a['batch']} x {a['heads']} x {a['seq']} x {a['head_dim']} | {a['fwd_tflops']:.3g} | {a['bwd_tflops']:.3g} |")
print("")
EOF
  b=${WINNER:-}
  tput=${LOOM_TPUT:-}
  if [ -z "$b" ] && [ -f "$WORK/last_throughput.txt" ]; then
    b=$(sed -n 1p "$WORK/last_throughput.txt"); tput=$(sed -n 2p "$WORK/last_throughput.txt")
  fi
  if [ -z "$b" ] || [ -z "$tput" ]; then
    md "No measured 126m run to compare with (the throughput step did not run or failed)."
    end_step FAIL "profile written; no measured run to compare with"
    return 1
  fi
  # `loom plan` exits 1 when the layout does not fit (the dry run's pretend memory): its CSV
  # still has the layout's predicted time, which is what is compared here.
  [ -f "$WORK/plan_b$b.csv" ] || plan_for "$b" || true
  rm -f "$WORK/plan_cal_b$b.csv"
  plan_for "$b" "$profile" || true
  if [ ! -s "$WORK/plan_cal_b$b.csv" ]; then
    md_log_tail "$LOGS/plan_cal_b$b.log" 15
    end_step FAIL "loom plan --profile wrote no prediction"
    return 1
  fi
  local builtin calibrated summary
  builtin=$("$PY" "$METRICS" plan "$WORK/plan_b$b.csv" --mbs "$b" 2>/dev/null || echo '{}')
  calibrated=$("$PY" "$METRICS" plan "$WORK/plan_cal_b$b.csv" --mbs "$b" 2>/dev/null || echo '{}')
  summary=$("$PY" - "$tput" "$builtin" "$calibrated" "$(cat "$WORK/plan_gpu.txt" 2>/dev/null || echo H200)" <<'EOF'
import json, sys
meas, builtin, cal = (json.loads(x or "{}") or {} for x in sys.argv[1:4])
m = meas.get("tokens_per_s")
def err(t):
    return (t / m - 1) if (t and m) else None
def f(v, spec):
    return "-" if v is None else format(v, spec)
rows = [("measured (throughput step)", m, meas.get("mfu"), None)]
for name, p in ((f"loom plan, built-in {sys.argv[4]} profile", builtin), ("loom plan, measured profile", cal)):
    t = p.get("tokens_per_second")
    rows.append((name, t, p.get("mfu"), err(t)))
print("| | tokens/s | MFU | error vs measured |")
print("|---|---|---|---|")
for name, t, mfu, e in rows:
    print(f"| {name} | {f(t, '.0f')} | {f(mfu, '.3f')} | {'-' if e is None else format(100 * e, '+.1f') + '%'} |")
pct = lambda e: "-" if e is None else format(100 * e, "+.1f") + "%"
print(f"SUMMARY measured profile {pct(rows[2][3])} vs measured tokens/s (built-in profile {pct(rows[1][3])})")
EOF
)
  md "Micro-batch $b (the throughput step's largest that ran), the plans for that step's layout (t=p=d=1, selective recompute)$([ "$DRY" = 1 ] && echo "; a dry run's shrunk shape and CPU or stand-in profile check the plumbing only")."
  md ""
  grep -v '^SUMMARY' <<< "$summary" >> "$SECTIONS/calibrate.md"
  md ""
  md "Profile: \`$profile\` (also under \$OUT/bringup/); \`loom plan --profile\` it to plan for this machine."
  end_step pass "$(grep '^SUMMARY' <<< "$summary" | sed 's/^SUMMARY //')"
}

# ---------------------------------------------------------------- 7. Megatron-Core
# megatron-core from the bundle's tar.gz; what it imports beyond torch (numpy, packaging) from
# the host's python, which has them.
python_site() {
  PYSITE=$ROOT/$WORK/pysite
  rm -rf "$PYSITE"
  mkdir -p "$PYSITE"
  tar -xzf gpu_bundle/python/megatron_core-*.tar.gz -C "$PYSITE" || return 1
  local m
  for m in numpy packaging; do
    "$PY" -c "import $m" 2>/dev/null || { echo "the host's python has no $m (Megatron-Core needs it)" >&2; return 1; }
  done
  NUMPY_NOTE="numpy $("$PY" -c 'import numpy; print(numpy.__version__)') from the host"
}

step_mcore() {
  begin_step mcore "5. Megatron-Core, same model and micro-batch (tools/bench_mcore_gpt.py)"
  local log=$LOGS/mcore.log rc args=()
  if ! want throughput && [ -f "$WORK/last_throughput.txt" ]; then
    WINNER=$(sed -n 1p "$WORK/last_throughput.txt")
    LOOM_TPUT=$(sed -n 2p "$WORK/last_throughput.txt")
    md "Loom's figures and micro-batch from an earlier call's step 6 ($(date -u -r "$WORK/last_throughput.txt" +%H:%M:%SZ))."
  fi
  local b=${LOOM_BRINGUP_MCORE_MBS:-${WINNER:-}}
  if [ -z "$b" ]; then end_step FAIL "no micro-batch from step 6 (set LOOM_BRINGUP_MCORE_MBS)"; return 1; fi
  NUMPY_NOTE=""
  if ! python_site 2> "$LOGS/pysite.log"; then
    md_log_tail "$LOGS/pysite.log" 5
    end_step FAIL "Python packages for Megatron-Core could not be set up"
    return 1
  fi
  if [ "$DRY" = 1 ]; then
    args=(--device cpu --num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 64 --steps 2 --warmup 1)
  else
    args=(--device cuda --steps "${LOOM_BRINGUP_MCORE_STEPS:-10}" --warmup 3)
  fi
  local tries=("$b") t
  [ "$b" -gt 1 ] && tries+=($((b / 2)))   # one retry at half the micro-batch if it does not fit
  for t in "${tries[@]}"; do
    rm -f "$WORK/mcore.json"
    run_timed "$log" "$(budget 150)" env PYTHONPATH="$PYSITE${PYTHONPATH:+:$PYTHONPATH}" \
      "$PY" tools/bench_mcore_gpt.py "${args[@]}" --micro-batch "$t" --data "$DATA" --json-out "$WORK/mcore.json"
    rc=$?
    md "- micro-batch $t: exit $rc$([ "$rc" -ge 124 ] && echo ' (timed out)')"
    [ "$rc" -eq 0 ] && break
    md_log_tail "$log" 12
    "$PY" "$METRICS" oom "$log" || break
  done
  md "- megatron imported from: $(PYTHONPATH="$PYSITE${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c 'import megatron.core as m; print(m.__file__)' 2>&1 | tail -n 1); $NUMPY_NOTE"
  if [ "$rc" -ne 0 ] || [ ! -f "$WORK/mcore.json" ]; then end_step FAIL "exit $rc"; return 1; fi
  local mj ratio
  mj=$(cat "$WORK/mcore.json")
  md ""
  md "| implementation | micro-batch | tokens/s | model TFLOP/s | MFU | peak memory MiB |"
  md "|---|---|---|---|---|---|"
  md "| Loom | $WINNER | $(jget "${LOOM_TPUT:-}" tokens_per_s 0) | $(jget "${LOOM_TPUT:-}" model_tflops_per_device 1) | $(jget "${LOOM_TPUT:-}" mfu 3) | $(jget "${LOOM_TPUT:-}" peak_device_memory_mib 0) (peak_device_memory_mib) |"
  md "| Megatron-Core $(jget "$mj" megatron_core_version) (local spec) | $(jget "$mj" micro_batch 0) | $(jget "$mj" tokens_per_s 0) | $(jget "$mj" model_tflops_per_device 1) | $(jget "$mj" mfu 3) | $(jget "$mj" peak_memory_mib 0) (max_memory_allocated) |"
  md ""
  md "Megatron-Core: precision $(jget "$mj" precision), recompute $(jget "$mj" recompute), fusions $(jget "$mj" fusions), optimizer $(jget "$mj" optimizer); notes: $(jget "$mj" notes)."
  ratio=$("$PY" -c 'import json,sys; a=json.loads(sys.argv[1] or "{}").get("tokens_per_s"); b=json.loads(sys.argv[2]).get("tokens_per_s"); print(f"{a/b:.2f}" if a and b else "-")' "${LOOM_TPUT:-}" "$mj")
  md ""
  md "**Loom / Megatron-Core tokens/s: $ratio**$([ -n "${WINNER:-}" ] && [ "$(jget "$mj" micro_batch 0)" != "$WINNER" ] && echo " (different micro-batches: Megatron-Core did not fit $WINNER)")"
  end_step pass "ratio Loom/Megatron-Core $ratio"
}

step_overlap() {
  begin_step overlap "8. Overlapped gradient reduction and parameter gather, d=2, d=2 × p=2 and d=2 with the distributed optimizer (tools/bench_step.py)"
  local log=$LOGS/bench_step.log rc
  local -a env_args=() args=(--loom "$LOOM" --data "$DATA" --json-out "$WORK/bench_step.json")
  if [ "$ACCEL" = gpu ]; then
    env_args=(LOOM_DEVICE_COLLECTIVES=gloo "${DEVICE_ENV[@]}")
    args+=(--gpu --steps "${LOOM_BRINGUP_OVERLAP_STEPS:-12}" --warmup 3)
    md "All ranks share one device, so collectives go through Gloo staged via host memory (\`LOOM_DEVICE_COLLECTIVES=gloo\`): the overlap hides host-side reduction time only."
  else
    args+=(--steps 4 --warmup 1 --hidden 64)
  fi
  run_timed "$log" "$(budget 240)" env "${env_args[@]}" "$PY" tools/bench_step.py "${args[@]}"
  rc=$?
  md ""
  grep -E '^(\||loom train|d2)' "$log" >> "$SECTIONS/overlap.md"
  if [ "$rc" -ne 0 ]; then md_log_tail "$log" 20; end_step FAIL "exit $rc"; return 1; fi
  end_step pass "$(grep -E '^d2' "$log" | tr '\n' ' ')"
}

# ---------------------------------------------------------------- main
if [ -n "$MAKE_REF" ]; then
  PY=$(find_python) || { echo "gpu_bringup: no python that imports torch" >&2; exit 1; }
  CURRENT=reference
  : > "$SECTIONS/reference.md"
  tiny_run tiny_cpu_fp32 cpu 32 || { cat "$LOGS/tiny_cpu_fp32.log" >&2; exit 1; }
  mkdir -p "$MAKE_REF"
  cp "$WORK/runs/tiny_cpu_fp32/metrics.jsonl" "$MAKE_REF/tiny_cpu_fp32.metrics.jsonl"
  echo "$TINY_STEPS" > "$MAKE_REF/tiny_steps"
  echo "$(date -u +%Y-%m-%dT%H:%M:%SZ), $(uname -m), $(nproc) cores" > "$MAKE_REF/made_on"
  echo "[gpu_bringup] reference: $MAKE_REF/tiny_cpu_fp32.metrics.jsonl ($TINY_STEPS steps)" >&2
  exit 0
fi
declare -A TITLE=([tiny]="3. Tiny recipe on one device" [throughput]="4. GPT-3 126m throughput"
                  [calibrate]="4b. Measured planner profile"
                  [mcore]="5. Megatron-Core" [layout]="6. t=2 × p=2 on one device"
                  [overlap]="8. Overlapped gradient reduction" [ops]="7. Op library check")
not_run() { begin_step "$1" "${TITLE[$1]}"; end_step "not run" "$2"; }
step_env || { assemble_results; exit 1; }
choose_accelerator
BUILD_OK=1
if want build; then step_build || BUILD_OK=0; fi
[ -x "$LOOM" ] || BUILD_OK=0
if [ "$BUILD_OK" = 0 ]; then
  for step in tiny throughput calibrate mcore layout ops overlap; do
    want "$step" && not_run "$step" "no usable $LOOM"
  done
  assemble_results
  exit 1
fi
WINNER=""
LOOM_TPUT=""
# The scarcest figures first (a call that runs out of time loses the least useful steps).
for step in tiny throughput calibrate mcore layout ops overlap; do
  want "$step" || continue
  if [ "$(remaining)" -lt 20 ]; then not_run "$step" "out of time (deadline ${DEADLINE} s)"; continue; fi
  "step_$step"
  # A step that died half-way (a shell error) must still count as a failure.
  cut -f1 "$WORK/summary.tsv" | grep -qx "$step" || end_step FAIL "the step stopped without a result (script error)"
done
assemble_results
echo "[gpu_bringup] done in $(elapsed) s: $RESULTS$([ -n "${OUT:-}" ] && echo " and $OUT/gpu_results.md"); $([ "$FAILED" = 0 ] && echo 'all checks passed' || echo 'some checks FAILED or did not run')" >&2
exit $FAILED
