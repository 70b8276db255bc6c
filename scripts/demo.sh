#!/usr/bin/env bash
# The main job: set up, then show what the codec does at head_dim 128 (error, compression, CPU speed).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
exec .venv/bin/tiercache codec-report "$@"
