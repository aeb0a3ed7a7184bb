#!/usr/bin/env bash
# Loom set-up for a fresh Debian 12 machine. Idempotent: a second run only checks.
#   - Debian packages the C++ code builds against (yaml-cpp, fmt, Catch2, CLI11,
#     nlohmann-json, PCRE2, ccache, ninja), and clang with libFuzzer for tools/fuzz
#   - a project-local virtual environment (.venv) with the pinned torch wheel (LibTorch comes
#     from it) and the test-only Python packages of tools/requirements-test.txt
#   - minja (Google's header-only Jinja for chat templates, MIT; `loom serve`'s
#     /v1/chat/completions) into third_party/minja, from the llama.cpp that the pinned
#     llama-cpp-python source release vendors (Debian 12 packages no C++ Jinja library)
# Usage: tools/setup.sh            (run as root or with sudo available)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"

TORCH_VERSION=2.11.0   # cu130 build on PyPI: matches nvcc 13.0 and the GPU hosts' torch
APT_PACKAGES=(build-essential cmake ninja-build ccache pkg-config python3-venv
              libyaml-cpp-dev libfmt-dev catch2 libcli11-dev
              nlohmann-json3-dev libpcre2-dev
              libzstd-dev zlib1g-dev liblzma-dev  # loom preprocess: .zst/.gz/.xz corpora
              zstd   # the zstd tool: test_data_corpus.py and bench_preprocess.py compress with it
              libsentencepiece-dev libutf8proc-dev  # SentencePiece models; NFC/NFKC of tokenizer.json
              libcpp-httplib-dev   # loom serve's HTTP server (cpp-httplib 0.11)
              libgloo-dev   # headers only: the pip wheel links Gloo in but ships no gloo/*.h
              clang libclang-rt-14-dev  # libFuzzer and the sanitizers for tools/fuzz
              libprotobuf-dev protobuf-compiler  # TensorBoard event files (csrc/runlog: Event/Summary protobufs)
              iproute2)  # ip netns: the two-host test (tests/python/test_two_hosts.py)

sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[setup] installing Debian packages: ${missing[*]}" >&2
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv" >&2
  "$PY" -m venv .venv
fi
stamp=.venv/.loom-setup-stamp
want="torch==$TORCH_VERSION $(sha256sum tools/requirements-test.txt | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[setup] installing torch==$TORCH_VERSION and test packages into .venv" >&2
  .venv/bin/pip install -q --disable-pip-version-check "torch==$TORCH_VERSION"
  .venv/bin/pip install -q --disable-pip-version-check -r tools/requirements-test.txt
  echo "$want" > "$stamp"
fi

# minja: one header, checked by hash, taken from the llama-cpp-python sdist (PyPI), which
# vendors llama.cpp with vendor/minja. The sdist is ~50 MB and is fetched only when the header is
# missing or differs.
MINJA_SDIST=llama_cpp_python-0.3.16
MINJA_HEADERS=("minja.hpp abb5e1378834908ec8ae3035fae0a82b7b36e214f5808c7df50ccf0048acbcd1")
minja_ok() {
  for entry in "${MINJA_HEADERS[@]}"; do
    set -- $entry
    [ "$(sha256sum "third_party/minja/minja/$1" 2>/dev/null | cut -c1-64)" = "$2" ] || return 1
  done
}
if ! minja_ok; then
  echo "[setup] fetching minja from the $MINJA_SDIST sdist into third_party/minja" >&2
  tmp=$(mktemp -d)
  .venv/bin/pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
    "llama-cpp-python==${MINJA_SDIST#llama_cpp_python-}" -d "$tmp"
  tar xzf "$tmp/$MINJA_SDIST.tar.gz" -C "$tmp" "$MINJA_SDIST/vendor/llama.cpp/vendor/minja"
  mkdir -p third_party/minja/minja
  cp "$tmp/$MINJA_SDIST/vendor/llama.cpp/vendor/minja/minja.hpp" third_party/minja/minja/
  rm -rf "$tmp"
  minja_ok || { echo "[setup] error: third_party/minja: the header's sha256 differs from the pinned one" >&2; exit 1; }
fi
echo "[setup] ok: $(.venv/bin/python -c 'import torch; print("torch", torch.__version__)')" >&2
