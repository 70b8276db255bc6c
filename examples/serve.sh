#!/usr/bin/env bash
# Serve a model with vLLM's OpenAI server and tiercache as its KV connector; tier sizes from tiers.yaml.
# Then, from another shell: `tiercache inspect` (tiers, hit rates, the latest eviction decisions).
set -euo pipefail
model="${1:?usage: examples/serve.sh MODEL_PATH_OR_NAME}"
vllm serve "$model" \
  --kv-transfer-config '{"kv_connector": "TierCacheConnector", "kv_role": "kv_both",
                         "kv_connector_extra_config": {"config": "examples/tiers.yaml"}}'
