"""vLLM general plugin (entry point vllm.general_plugins → "tiercache.connectors.plugin:register"), loaded
by vLLM in every process (engine core and workers are spawned, so registering anywhere else misses
them). Idempotent. Registers:
    "TierCacheConnector" with KVConnectorFactory   kv_connector can name it without kv_connector_module_path
    AttentionBackendEnum.CUSTOM                     primary mode's backend (--attention-backend CUSTOM)
    AttentionBackendEnum.CPU_ATTN (CPU platform)    a CPU backend that is vLLM's own unless CUSTOM was
                                                    selected (the CPU platform ignores the selection)
    --kv-cache-dtype tiercache_<preset> (vLLM ≥ 0.33)  the codec named on the command line
                                                    (preset_dtypes.py)
"""

from __future__ import annotations

NAME = "TierCacheConnector"
BACKENDS = "tiercache.connectors.attention.backend"


def register() -> None:
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    if NAME not in KVConnectorFactory._registry:
        KVConnectorFactory.register_connector(NAME, "tiercache.connectors.vllm", "TierCacheConnector")
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    register_backend(AttentionBackendEnum.CUSTOM, f"{BACKENDS}.TierCacheAttentionBackend")
    if current_platform.is_cpu():
        register_backend(AttentionBackendEnum.CPU_ATTN, f"{BACKENDS}.TierCacheCPUAttentionBackend")
    from .preset_dtypes import register_preset_dtypes

    register_preset_dtypes()
