"""Primary mode's attention backend (worker role): vLLM's own paged KV cache holds TurboQuant pages
(tiercache.pages), written and attended by our kernels (tiercache.worker.paged_attention).

Provides (vLLM is imported by the modules that need it):
    selection.py    whether this process serves primary mode, with which codec
    cache_dtypes.py what each vLLM's --kv-cache-dtype gives primary mode (0.26: the page; ≥ 0.32: a marker)
    exact_layers.py the layers kept exact (codec.exact_layers) and vLLM's flags that give them dense pages
    backend.py      TierCacheAttentionBackend (registered as CUSTOM: GPUs) and TierCacheCPUAttentionBackend
                    (registered over CPU_ATTN: the CPU platform ignores the selection and always asks for
                    CPU_ATTN; it serves primary mode when CUSTOM was selected, vLLM's own CPU attention
                    otherwise)
    impl.py         PrimaryAttentionImpl: do_kv_cache_update (encode + store) and forward (decode, prefill)
    metadata.py     PrimaryMetadata and its builder (decodes first)

Enable: `--attention-backend CUSTOM` (or `attention_config={"backend": "CUSTOM"}`), with the codec from the
tiercache config (kv_connector_extra_config when the connector is on, else $TIERCACHE_CONFIG, else k8v4).
"""
