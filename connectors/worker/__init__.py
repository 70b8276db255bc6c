"""The connector's worker role (each GPU worker process): executes StepPlans on vLLM's cache and the pools.

Provides:
    ConnectorWorker         connector_worker.py: loads, stores and jobs of one step; a WorkerReport out
    encode_blocks / decode_blocks   codec_io.py: vLLM blocks ↔ the tiers' TurboQuant format
    kv_access, BlockAccess  kv_views.py: K and V views over vLLM's per-layer caches, per backend layout
"""

from .codec_io import decode_blocks, encode_blocks
from .connector_worker import ConnectorWorker
from .kv_views import BlockAccess, kv_access

__all__ = ["BlockAccess", "ConnectorWorker", "decode_blocks", "encode_blocks", "kv_access"]
