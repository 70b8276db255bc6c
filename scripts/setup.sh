#!/usr/bin/env bash
# Create .venv (once) and install tiercache with the given extras (default: dev).
# torch is pinned to 2.13.0 *before* anything else: an unpinned torch pulls several GB of CUDA packages
# on CPU-only machines. Usage: bash scripts/setup.sh [EXTRAS]   e.g.  bash scripts/setup.sh dev,model
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-dev}"
if [ ! -x .venv/bin/python ]; then
  "${PYTHON:-python3}" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
if ! python -c "import torch" 2>/dev/null; then
  pip install --quiet torch==2.13.0
fi
pip install --quiet -e ".[${extras}]"
