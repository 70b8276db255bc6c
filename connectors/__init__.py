"""vLLM KV connector, importable as tiercache.connectors."""
