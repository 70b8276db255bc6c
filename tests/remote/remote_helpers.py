"""Small shared pieces of the remote-tier tests: a layout, a namespace, random DRAM rows."""

from __future__ import annotations

import torch

from tiercache.config_remote import RemoteConfig
from tiercache.layout import BlockLayout
from tiercache.remote.format import RemoteNamespace
from tiercache.remote.store import RemoteStore

LAYOUT = BlockLayout(num_layers=2, block_size=32, num_kv_heads=2, k_packed_dim=64, v_packed_dim=32)
CODEC = "K:tq8-d64-haar-s0|V:tq4-d64-haar-s0"


def namespace(codec: str = CODEC, model: str = "tiny-llama", layout: BlockLayout = LAYOUT) -> RemoteNamespace:
    return RemoteNamespace(model=model, codec_id=codec, layout=layout, rank=0)


def store(url: str, ns: RemoteNamespace | None = None, timeout: float = 0.5, **kw) -> RemoteStore:
    return RemoteStore(RemoteConfig(url=url, timeout=timeout), ns or namespace(), **kw)


def rows(n: int, seed: int = 0, layout: BlockLayout = LAYOUT) -> torch.Tensor:
    """[n, dram_stride] uint8 random bytes (any bytes are a valid DRAM row for the store)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, layout.dram_stride), dtype=torch.uint8, generator=g)


def hashes(n: int, salt: int = 0) -> list[bytes]:
    return [bytes([salt, i % 256, i // 256]) * 8 for i in range(n)]
