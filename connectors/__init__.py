"""vLLM KV connector, importable as tiercache.connectors.

Provides (vLLM is imported only by the modules that need it):
    vllm.TierCacheConnector     the KVConnectorBase_V1 subclass (thin glue, delegates by role)
    scheduler.ConnectorScheduler   scheduler side: owns the TierManager, turns decisions into metadata
    worker.ConnectorWorker         worker side: owns the TierWorker, encodes saves, decodes loads
    metadata                    plain-data (msgpack-able) connector and worker metadata
    kv_views                    K and V views over vLLM's per-layer caches for the running backend
    common                      config resolution and block geometry shared by both sides
    plugin.register()           registers "TierCacheConnector" with vLLM's KVConnectorFactory

Enable it with
    --kv-transfer-config '{"kv_connector": "TierCacheConnector", "kv_role": "kv_both",
                           "kv_connector_extra_config": {"config": "tiers.yaml", "codec": "k8v4"}}'
(inline keys override the file; without "config", $TIERCACHE_CONFIG is read, else defaults).
"""
