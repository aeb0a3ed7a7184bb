#!/usr/bin/env bash
# The whole test suite on a fresh machine: set-up, build, C++ tests (ctest), Python tests (pytest).
#   tools/test.sh            (README command (b); .ci/run runs exactly this)
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
tools/build.sh
echo "[test] C++ tests" >&2
(cd build && ctest --output-on-failure --timeout 900 -j "${LOOM_TEST_JOBS:-1}")
echo "[test] Python tests" >&2
.venv/bin/python -m pytest -q tests/python
