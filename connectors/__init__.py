"""vLLM KV connector, importable as tiercache.connectors. One folder per role, as in tiercache itself.

Provides (vLLM is imported only by the modules that need it):
    vllm.TierCacheConnector     the KVConnectorBase_V1 subclass: the boundary vLLM calls (both roles),
                                where connector errors are caught and turned into misses
    scheduler/                  scheduler role: ConnectorScheduler (owns the TierManager), RequestTracker
    worker/                     worker role: ConnectorWorker (owns the TierWorker), codec_io, kv_views
    metadata                    vLLM's metadata objects carrying the encoded StepPlan / WorkerReports
    common                      config resolution and block geometry both roles derive identically
    preset_dtypes               vLLM ≥ 0.33's --kv-cache-dtype tiercache_<preset> names (the codec they name)
    plugin.register()           registers "TierCacheConnector" with vLLM's KVConnectorFactory, the attention
                                backends and the preset dtype names

Enable it with
    --kv-transfer-config '{"kv_connector": "TierCacheConnector", "kv_role": "kv_both",
                           "kv_connector_extra_config": {"config": "tiers.yaml", "codec": "k8v4"}}'
(inline keys override the file; without "config", $TIERCACHE_CONFIG is read, else defaults).
"""
