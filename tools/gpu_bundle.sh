#!/usr/bin/env bash
# Prepares gpu_bundle/ (ignored by git), everything the lent GPU host lacks for
# tools/gpu_bringup.sh. That host has torch (pip wheel), nvcc, cmake, ninja and a C++
# compiler, but no package installs and no network, and a run there takes at most 64 MiB of
# ignored files ("carry"). The bundle holds:
#   prefix/   the Debian 12 packages Loom builds and links against (tools/setup.sh's
#             APT_PACKAGES minus build tools and Catch2), unpacked with dpkg -x, symlinks
#             replaced by copies, .pc files made relocatable; prefix.cmake and env.sh point
#             CMake, the compiler, the linker, pkg-config and the loader at it
#   data/     the preprocessed tinyshakespeare corpus (.bin/.idx)
#   python/   megatron-core's Python sources (tar.gz); the lent host's python (3.12) has
#             numpy, packaging and einops, what it imports beyond torch
#   reference/  the tiny recipe's CPU fp32 run (metrics.jsonl), made here, so that the GPU
#             host's minutes do not go to a CPU run (tools/gpu_bringup.sh --make-reference)
#   MANIFEST.txt  every file with its size, and the total
# Exits non-zero when the bundle would exceed the carry limit (64 MiB), and prints the carry
# list for the device `run` tool. Idempotent: downloads are cached in build-bundle/.
#   tools/gpu_bundle.sh              (root or sudo for apt-get update, when the index is stale)
# Environment: LOOM_BIN (loom executable for preprocessing; default build/bin/loom),
#              LOOM_PYTHON (python with pip; default .venv/bin/python).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

BUNDLE=gpu_bundle
CACHE=build-bundle            # downloads; matches /build*/ in .gitignore, never carried
LIMIT_BYTES=$((64 * 1024 * 1024))
MULTIARCH=x86_64-linux-gnu
# -dev packages for headers and CMake/pkg-config files, runtime packages for the .so files
# they name. Gloo: headers only (the torch wheel links Gloo in but ships no gloo/*.h;
# libgloo-dev's own dependencies are not needed for headers). The codecs and tokenizers of
# loom preprocess (zstd, zlib, xz, SentencePiece, utf8proc) and loom serve's HTTP server
# (cpp-httplib, whose .pc requires openssl, zlib and brotli: their -dev files too). protobuf
# and protoc (with libprotoc) for the TensorBoard writer (csrc/runlog compiles TensorBoard's
# .proto files at build time).
# pkgconf: used only if the host has no pkg-config of its own.
APT_PACKAGES=(libyaml-cpp-dev libyaml-cpp0.7 libfmt-dev libfmt9
              libcli11-dev nlohmann-json3-dev libpcre2-dev libpcre2-8-0 libgloo-dev
              libzstd-dev libzstd1 zlib1g-dev zlib1g liblzma-dev liblzma5
              libsentencepiece-dev libsentencepiece0 libutf8proc-dev libutf8proc2
              libcpp-httplib-dev libcpp-httplib0.11 libssl-dev libssl3 libbrotli-dev libbrotli1
              libprotobuf-dev libprotobuf32 protobuf-compiler libprotoc32
              pkgconf-bin libpkgconf3)
DATA_NAME=tinyshakespeare_text_document

py=${LOOM_PYTHON:-.venv/bin/python}
loom=${LOOM_BIN:-build/bin/loom}
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)

log() { echo "[gpu_bundle] $*" >&2; }
die() { log "error: $*"; exit 1; }

# Downloads each package's .deb into $CACHE/debs once (apt-get download needs no install).
download_debs() {
  mkdir -p "$CACHE/debs"
  local missing=() p
  for p in "${APT_PACKAGES[@]}"; do
    compgen -G "$CACHE/debs/${p}_*.deb" > /dev/null || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "downloading ${missing[*]}"
  # As root, apt warns that its _apt sandbox user cannot write here; the download works.
  if ! (cd "$CACHE/debs" && apt-get download "${missing[@]}" > download.log 2>&1); then
    log "apt-get download failed; refreshing the package index and retrying"
    "${sudo_cmd[@]}" apt-get update -qq || die "apt-get update failed"
    (cd "$CACHE/debs" && apt-get download "${missing[@]}" > download.log 2>&1) ||
      { tail -n 20 "$CACHE/debs/download.log" >&2; die "apt-get download failed"; }
  fi
}

# dpkg -x every .deb into prefix/ (fresh each time, so the result does not depend on history).
unpack_debs() {
  local prefix=$BUNDLE/prefix p deb
  rm -rf "$prefix"
  mkdir -p "$prefix"
  for p in "${APT_PACKAGES[@]}"; do
    deb=$(ls "$CACHE/debs/${p}_"*.deb | sort -V | tail -n 1)
    dpkg -x "$deb" "$prefix" || die "dpkg -x $deb failed"
  done
}

# Drops what neither the build nor the run needs, and makes the tree carry-safe: no symlinks
# (whether the carry keeps links is not promised, and dpkg -x leaves the .so name chains as
# links) and no absolute /usr paths in .pc files (dpkg -x keeps /usr, the host's /usr).
fix_up_prefix() {
  local usr=$BUNDLE/prefix/usr lib link target pc
  lib=$usr/lib/$MULTIARCH
  rm -rf "$usr/share/doc" "$usr/share/man" "$usr/share/lintian" "$usr/bin/pcre2-config"
  # Gloo's CMake package names libgloo.so, which is not bundled (Loom uses only its headers).
  rm -rf "$usr/share/cmake/Gloo"
  # Static archives are not needed, except libprotobuf.a: csrc/runlog links protobuf statically
  # (its symbols would clash with the protobuf-lite inside libsentencepiece).
  find "$BUNDLE/prefix" -name '*.a' ! -name libprotobuf.a -delete
  # libpcre2-dev also ships the 16/32-bit and POSIX variants, whose libraries are not bundled.
  rm -f "$lib"/libpcre2-16* "$lib"/libpcre2-32* "$lib"/libpcre2-posix* \
        "$lib"/pkgconfig/libpcre2-16.pc "$lib"/pkgconfig/libpcre2-32.pc "$lib"/pkgconfig/libpcre2-posix.pc
  while IFS= read -r link; do
    target=$(readlink -f "$link")
    if [ -f "$target" ]; then
      cp --remove-destination "$target" "$link"
    else
      rm -f "$link"   # dangling after the pruning above
    fi
  done < <(find "$BUNDLE/prefix" -type l)
  # pkg-config expands ${pcfiledir} to the .pc file's own directory: relocatable.
  for pc in "$lib"/pkgconfig/*.pc; do
    sed -i 's|^prefix=/usr$|prefix=${pcfiledir}/../../..|' "$pc"
  done
  for pc in "$usr"/share/pkgconfig/*.pc; do
    sed -i 's|^prefix=/usr$|prefix=${pcfiledir}/../..|' "$pc"
  done
  if grep -l '^prefix=/usr' "$lib"/pkgconfig/*.pc "$usr"/share/pkgconfig/*.pc 2>/dev/null; then
    die "a .pc file above still has prefix=/usr"
  fi
  # The CMake configs compute their prefix from their own location (_IMPORT_PREFIX); check
  # that no other absolute /usr path would send CMake back to the host's /usr.
  if grep -rlE '"/usr/(include|lib)' "$usr"/lib/$MULTIARCH/cmake "$usr"/share/cmake |
       xargs -r grep -LE '_realOrig' | grep .; then
    die "a CMake config above names an absolute /usr path"
  fi
}

# prefix.cmake (cmake -C) names each package's config directory, so find_package finds the
# bundle even where CMAKE_LIBRARY_ARCHITECTURE is not Debian's; env.sh sets the search paths
# of the compiler (CPLUS_INCLUDE_PATH: like -isystem, after every -isystem of the command
# line, i.e. where /usr/include sits on the development machine, so torch's own fmt headers
# keep shadowing fmt 9 in torch translation units), the linker (LIBRARY_PATH), pkg-config and
# the loader (LD_LIBRARY_PATH). GCC reports both as its own search paths, so CMake treats the
# bundle like /usr: it adds no -isystem/-L/rpath for it.
write_config_files() {
  cat > "$BUNDLE/prefix.cmake" <<EOF
# Initial cache for cmake -C (written by tools/gpu_bundle.sh): Loom's Debian dependencies
# from gpu_bundle/prefix. Source gpu_bundle/env.sh as well (compiler, linker and loader paths).
get_filename_component(_loom_usr "\${CMAKE_CURRENT_LIST_DIR}/prefix/usr" ABSOLUTE)
set(yaml-cpp_DIR "\${_loom_usr}/lib/$MULTIARCH/cmake/yaml-cpp" CACHE PATH "" FORCE)
set(fmt_DIR "\${_loom_usr}/lib/$MULTIARCH/cmake/fmt" CACHE PATH "" FORCE)
set(CLI11_DIR "\${_loom_usr}/share/cmake/CLI11" CACHE PATH "" FORCE)
set(nlohmann_json_DIR "\${_loom_usr}/share/cmake/nlohmann_json" CACHE PATH "" FORCE)
set(Protobuf_PROTOC_EXECUTABLE "\${_loom_usr}/bin/protoc" CACHE FILEPATH "" FORCE)
set(Protobuf_INCLUDE_DIR "\${_loom_usr}/include" CACHE PATH "" FORCE)
set(Protobuf_LIBRARY "\${_loom_usr}/lib/$MULTIARCH/libprotobuf.a" CACHE FILEPATH "" FORCE)
set(Protobuf_LIBRARY_RELEASE "\${_loom_usr}/lib/$MULTIARCH/libprotobuf.a" CACHE FILEPATH "" FORCE)
get_filename_component(_loom_minja "\${CMAKE_CURRENT_LIST_DIR}/minja" ABSOLUTE)
set(LOOM_MINJA_DIR "\${_loom_minja}" CACHE PATH "" FORCE)
EOF
  # minja (tools/setup.sh fetches it into the ignored third_party/minja): loom_serve's chat templates.
  mkdir -p "$BUNDLE/minja/minja"
  cp third_party/minja/minja/minja.hpp "$BUNDLE/minja/minja/" || die "third_party/minja/minja/minja.hpp is missing: run tools/setup.sh first"
  cat > "$BUNDLE/env.sh" <<'EOF'
# Sourced in bash by the GPU bring-up (tools/bringup/env_build.py; written by tools/gpu_bundle.sh): compiler, linker,
# pkg-config and loader paths for the Debian packages unpacked in gpu_bundle/prefix.
_loom_bundle=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LOOM_BUNDLE_USR=$_loom_bundle/prefix/usr
LOOM_BUNDLE_LIB=$LOOM_BUNDLE_USR/lib/x86_64-linux-gnu
export CPLUS_INCLUDE_PATH=$LOOM_BUNDLE_USR/include${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}
export C_INCLUDE_PATH=$LOOM_BUNDLE_USR/include${C_INCLUDE_PATH:+:$C_INCLUDE_PATH}
export LIBRARY_PATH=$LOOM_BUNDLE_LIB${LIBRARY_PATH:+:$LIBRARY_PATH}
export LD_LIBRARY_PATH=$LOOM_BUNDLE_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PKG_CONFIG_PATH=$LOOM_BUNDLE_LIB/pkgconfig:$LOOM_BUNDLE_USR/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
# The host's pkg-config when it has one, else the bundled pkgconf (Debian 12 build).
if command -v pkg-config > /dev/null 2>&1; then
  LOOM_BUNDLE_PKG_CONFIG=$(command -v pkg-config)
else
  LOOM_BUNDLE_PKG_CONFIG=$LOOM_BUNDLE_USR/bin/pkgconf
fi
LOOM_BUNDLE_CMAKE_ARGS=(-C "$_loom_bundle/prefix.cmake" -DPKG_CONFIG_EXECUTABLE="$LOOM_BUNDLE_PKG_CONFIG")
EOF
}

# The corpus, preprocessed as tools/main_job.sh does, copied into the bundle.
bundle_data() {
  local prefix=data/preprocessed/tinyshakespeare
  if [ ! -f "data/preprocessed/$DATA_NAME.idx" ] || [ ! -f "data/preprocessed/$DATA_NAME.bin" ]; then
    [ -x "$loom" ] || die "data/preprocessed/$DATA_NAME.{bin,idx} missing and no $loom to make them (build it: tools/build.sh loom, or set LOOM_BIN)"
    log "preprocessing data/tinyshakespeare.txt"
    mkdir -p data/preprocessed
    "$loom" preprocess --input data/tinyshakespeare.txt --output-prefix "$prefix" \
      --json-keys text --vocab-file data/gpt2-vocab.json --merge-file data/gpt2-merges.txt \
      --append-eod --workers 2 || die "loom preprocess failed"
  fi
  mkdir -p "$BUNDLE/data"
  rm -f "$BUNDLE/data/"*
  cp "data/preprocessed/$DATA_NAME.bin" "data/preprocessed/$DATA_NAME.idx" "$BUNDLE/data/"
}

# megatron-core's .py files (no __pycache__, no compiled dataset helper: only the model, the
# parallel state, DDP and the optimizer are used) as one tar.gz, plus wheels.
bundle_python() {
  local site mc_version pk_version v
  site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') || die "no $py"
  mc_version=$("$py" -c 'import importlib.metadata as m; print(m.version("megatron-core"))') ||
    die "megatron-core is not installed in $py (tools/setup.sh installs it)"
  mkdir -p "$BUNDLE/python"
  rm -f "$BUNDLE/python/"*
  tar -C "$site" -czf "$BUNDLE/python/megatron_core-$mc_version.tar.gz" \
      --exclude=__pycache__ --exclude='*.so' --exclude='*.cpp' --exclude=Makefile \
      --sort=name --mtime=2020-01-01 --owner=0 --group=0 megatron ||
    die "packing megatron failed"
}

# The tiny recipe's CPU fp32 reference, with the very overrides of the bring-up's tiny step.
bundle_reference() {
  [ -x "$loom" ] || die "no $loom to make the CPU reference (tools/build.sh loom)"
  rm -rf "$BUNDLE/reference"
  LOOM_BIN=$loom tools/gpu_bringup.sh --make-reference "$BUNDLE/reference" || die "the CPU reference run failed"
}

# MANIFEST.txt and the hard size check over everything carried (the whole bundle).
write_manifest() {
  local total
  (cd "$BUNDLE" && find . -type f ! -name MANIFEST.txt -printf '%s\t%P\n' | sort -k2) > "$CACHE/manifest.tmp"
  total=$(awk -F'\t' '{s += $1} END {print s + 0}' "$CACHE/manifest.tmp")
  {
    echo "# gpu_bundle/ written by tools/gpu_bundle.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "# carry: [\"$BUNDLE\"]; limit $LIMIT_BYTES bytes (64 MiB)"
    echo "# bytes	path"
    cat "$CACHE/manifest.tmp"
    echo "# total $total bytes ($(awk -v t="$total" 'BEGIN {printf "%.2f", t / 1048576}') MiB) in $(wc -l < "$CACHE/manifest.tmp") files"
  } > "$BUNDLE/MANIFEST.txt"
  total=$((total + $(stat -c %s "$BUNDLE/MANIFEST.txt")))
  if find "$BUNDLE" -type l | grep -q .; then die "symlinks left in $BUNDLE"; fi
  log "bundle: $total bytes ($(awk -v t="$total" 'BEGIN {printf "%.2f", t / 1048576}') MiB) of $LIMIT_BYTES allowed"
  [ "$total" -le "$LIMIT_BYTES" ] || die "the bundle exceeds the 64 MiB carry limit"
}

grep -qx '/gpu_bundle/' .gitignore || die "add /gpu_bundle/ to .gitignore first (the bundle must be an ignored path to be carried)"
download_debs
unpack_debs
fix_up_prefix
write_config_files
bundle_data
bundle_python
bundle_reference
write_manifest || exit 1
echo "carry: [\"$BUNDLE\"]"
echo "run on the GPU host: tools/gpu_bringup.sh   (see its --help for the steps and time budgets; --plan shows what fits)"
