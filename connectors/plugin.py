"""vLLM general plugin: registers "TierCacheConnector" with KVConnectorFactory (entry point
vllm.general_plugins → tiercache = "tiercache.connectors.plugin:register"), so kv_connector can name it
without kv_connector_module_path. Idempotent: vLLM loads general plugins in every process.
"""

from __future__ import annotations

NAME = "TierCacheConnector"


def register() -> None:
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    if NAME not in KVConnectorFactory._registry:
        KVConnectorFactory.register_connector(NAME, "tiercache.connectors.vllm", "TierCacheConnector")
