"""tiercache: a tiered, TurboQuant-compressed KV-cache memory manager for vLLM.

Subpackages: tiercache.kernels (codec and kernels), tiercache.graph (block graph and eviction advisor),
tiercache.connectors (the vLLM KV connector).
"""

__version__ = "0.1.0"
