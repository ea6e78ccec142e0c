#!/usr/bin/env bash
# Create a venv and install lerobot_sql with its test extras. torch goes first, pinned to the local CPU wheel:
# an unpinned torch would pull several GB of CUDA packages.
#   LSQL_VENV         venv folder (default .venv)
#   LSQL_CONSTRAINTS  pip constraints file (default constraints.txt: the newest known-good releases;
#                     constraints-floor.txt: pyproject.toml's lower bounds with PyAV 15, where lerobot users are)
#   LSQL_EXTRAS       the extra to install (default test: what the fast tier needs; test-slow adds Ray, moto/boto3/
#                     s3fs, Jupyter and matplotlib for the slow tier, `pytest -m ""`)
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
VENV=${LSQL_VENV:-.venv}
CONSTRAINTS=${LSQL_CONSTRAINTS:-constraints.txt}
EXTRAS=${LSQL_EXTRAS:-test}
[ -f "$CONSTRAINTS" ] || { echo "setup.sh: constraints file $CONSTRAINTS not found" >&2; exit 1; }
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip show torch >/dev/null 2>&1 || "$VENV/bin/python" -m pip install -q torch==2.13.0
"$VENV/bin/python" -m pip install -q -e ".[$EXTRAS]" -c "$CONSTRAINTS"
# Fail loudly rather than test against a CUDA build that some resolver step swapped in.
"$VENV/bin/python" -c "import torch, sys; v = torch.__version__; sys.exit(0 if v.startswith('2.13.0') else f'setup.sh: torch {v} was installed instead of 2.13.0 (CPU)')"
