"""Random tier blocks for the tier tests: every section filled, reproducible by seed."""

from __future__ import annotations

import torch

from tiercache.layout import BlockLayout
from tiercache.worker.pools import KVBlocks


def random_blocks(layout: BlockLayout, n: int, seed: int, device="cpu") -> KVBlocks:
    g = torch.Generator().manual_seed(seed)
    L, BS, H = layout.num_layers, layout.block_size, layout.num_kv_heads
    return KVBlocks(
        torch.randint(0, 256, (L, n, BS, H, layout.k_packed_dim), generator=g, dtype=torch.uint8),
        torch.randint(0, 256, (L, n, BS, H, layout.v_packed_dim), generator=g, dtype=torch.uint8),
        torch.randn(L, n, BS, H, generator=g),
        torch.randn(L, n, BS, H, generator=g),
    ).to(device)
