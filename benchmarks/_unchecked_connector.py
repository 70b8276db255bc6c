"""The TierCacheConnector with its piece checksums off, for measuring what they cost in serving (issue 26).

Provides:
    UncheckedTierCacheConnector    TierCacheConnector whose worker neither computes checksums on save nor
                                   verifies them on load (TierWorker.checksums = None, the state the worker's
                                   own benchmarks use), with the unverified decode compiled at registration
                                   as the served connector's kernels are. Not a product setting: every served
                                   engine checks.

vLLM loads it by module path: kv_transfer_config = {"kv_connector": "UncheckedTierCacheConnector",
"kv_connector_module_path": "benchmarks._unchecked_connector", …} (vLLM 0.26 and later read the path).
"""

from __future__ import annotations

import torch

from tiercache.connectors.vllm import TierCacheConnector
from tiercache.connectors.worker.codec_io import decode_blocks, encode_blocks
from tiercache.connectors.worker.warm_start import WARM_COUNTS


class UncheckedTierCacheConnector(TierCacheConnector):
    def register_kv_caches(self, kv_caches) -> None:
        super().register_kv_caches(kv_caches)  # warms the verifying kernels the served connector uses
        worker = self.worker
        worker.tiers.checksums = None
        if worker.geometry.primary or worker.tiers.vram.device.type != "cuda":
            return
        for n in WARM_COUNTS:  # the unverified decode's variants, straight and from DRAM staging, written
            ids = [0] * n  # only into vLLM's null block 0 (no request's KV lives there)
            blocks = encode_blocks(worker.codec, worker.k_views, worker.v_views, ids, worker.layout)
            rows = torch.arange(n, device=blocks.k_packed.device)
            decode_blocks(worker.codec, blocks, worker.k_views, worker.v_views, ids, rows)
            slots = list(range(min(n, worker.tiers.dram.num_blocks)))
            if slots:
                worker.tiers.engine.write_dram(slots, blocks.select(slots))
                staged, at = worker.tiers.engine.stage_dram(slots)
                decode_blocks(worker.codec, staged, worker.k_views, worker.v_views, ids[: len(slots)], at)
        torch.cuda.synchronize()
