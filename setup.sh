#!/usr/bin/env bash
# Create .venv and install lerobot_sql with its test extras. torch goes first, pinned to the local CPU wheel:
# an unpinned torch would pull several GB of CUDA packages.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip show torch >/dev/null 2>&1 || .venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e '.[test]'
