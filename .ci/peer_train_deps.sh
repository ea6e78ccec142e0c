#!/usr/bin/env bash
# Make a lerobot 0.4.4 peer (../shared/tools/install_peer.sh, the lean install: only what lerobot.datasets needs)
# able to run lerobot's training script and lerobot_sql (tests/test_train.py):
#   bash .ci/peer_train_deps.sh PEER_VENV
# Adds what lerobot-train's imports need beyond the lean set (found by importing lerobot.scripts.lerobot_train and
# lerobot.policies.act / diffusion in the lean peer until they load) and lerobot_sql's two dependencies lerobot
# does not bring (duckdb, sqlglot, at our floors). torch stays the peer's CPU build (constrained to its version).
set -euo pipefail
PEER=${1:?usage: peer_train_deps.sh PEER_VENV}
PY="$PEER/bin/python"
TORCH=$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])')
cons=$(mktemp); trap 'rm -f "$cons"' EXIT
printf 'torch==%s\n' "$TORCH" > "$cons"
"$PY" -m pip install -q -c "$cons" imageio diffusers pyserial deepdiff einops gymnasium 'duckdb==2.0.1' 'sqlglot==30.30.0' \
  2>&1 | grep -v "requires torch\|incompatible" || true
"$PY" -c 'from lerobot.scripts import lerobot_train; from lerobot.policies.act.modeling_act import ACTPolicy; from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy; import duckdb, sqlglot, torch; print("peer can train: torch", torch.__version__, "duckdb", duckdb.__version__)'
