"""Small shared pieces of the remote-tier tests: a layout, a namespace, random DRAM rows, encoded values, and
the Redis key of a block (to corrupt, delete or forge its value from outside tiercache)."""

from __future__ import annotations

import torch

from tiercache.config_remote import RemoteConfig
from tiercache.layout import BlockLayout
from tiercache.remote.format import RemoteNamespace, encode_value
from tiercache.remote.secret import RemoteSecret
from tiercache.remote.store import RemoteStore
from tiercache.worker.integrity import checksums_of
from tiercache.worker.pools import block_views

LAYOUT = BlockLayout(num_layers=2, block_size=32, num_kv_heads=2, k_packed_dim=64, v_packed_dim=32)
CODEC = "K:tq8-d64-haar-s0|V:tq4-d64-haar-s0"


def namespace(codec: str = CODEC, model: str = "tiny-llama", layout: BlockLayout = LAYOUT) -> RemoteNamespace:
    return RemoteNamespace(model=model, codec_id=codec, layout=layout, rank=0)


def store(
    url: str,
    ns: RemoteNamespace | None = None,
    timeout: float = 0.5,
    secret: RemoteSecret | None = None,
    **kw,
) -> RemoteStore:
    return RemoteStore(RemoteConfig(url=url, timeout=timeout, secret=secret), ns or namespace(), **kw)


def rows(n: int, seed: int = 0, layout: BlockLayout = LAYOUT) -> torch.Tensor:
    """[n, dram_stride] uint8 random bytes (any bytes are a valid DRAM row for the store)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, layout.dram_stride), dtype=torch.uint8, generator=g)


def hashes(n: int, salt: int = 0) -> list[bytes]:
    return [bytes([salt, i % 256, i // 256]) * 8 for i in range(n)]


def values(ns: RemoteNamespace, keys: list[bytes], data: torch.Tensor) -> list[torch.Tensor]:
    """The encoded values of `data`'s rows under `keys` (with their true piece checksums; signed when ns has
    a MAC key)."""
    pieces = checksums_of(block_views(data, ns.layout))
    return [encode_value(ns, h, p, row) for h, p, row in zip(keys, pieces, data, strict=True)]


def redis_key(server, block_hash: bytes, model: str = "") -> bytes:
    """The one Redis key holding `block_hash`'s value (of that model's, when given)."""
    keys = server.keys((f"{model}@" if model else "").encode() + b"*" + block_hash.hex().encode() + b"*")
    assert len(keys) == 1, keys
    return keys[0]
