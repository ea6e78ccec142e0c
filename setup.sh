#!/usr/bin/env bash
# Create .venv and install lerobot_sql with its test extras. torch goes first, pinned to the local CPU wheel:
# an unpinned torch would pull several GB of CUDA packages.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip show torch >/dev/null 2>&1 || .venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e '.[test]' -c constraints.txt
# Fail loudly rather than test against a CUDA build that some resolver step swapped in.
.venv/bin/python -c "import torch, sys; v = torch.__version__; sys.exit(0 if v.startswith('2.13.0') else f'setup.sh: torch {v} was installed instead of 2.13.0 (CPU)')"

