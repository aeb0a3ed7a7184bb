#!/usr/bin/env bash
# The GPU bring-up (tools/gpu_bringup.py; `--help` lists its numbered steps and budgets) under the
# name tools/test.sh, tools/gpu_bundle.sh and the docs use; here it runs with .venv's python.
cd "$(dirname "$0")/.." || exit 1
py=python3; [ -x .venv/bin/python ] && py=.venv/bin/python
exec "$py" tools/gpu_bringup.py "$@"
