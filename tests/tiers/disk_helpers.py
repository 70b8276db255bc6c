"""Helpers of the disk tier's tests (test_disk_store.py, test_disk_format.py): a small layout, blocks written
through the write-behind queue, where a block's slot is."""

from __future__ import annotations

import os

import torch

from tiercache.codecs import KVCodecSpec
from tiercache.disk.index import INDEX_NAME, read_index
from tiercache.disk.segments import segment_name
from tiercache.disk.store import DiskStore
from tiercache.layout import BlockLayout
from tiercache.remote.format import RemoteNamespace
from tiercache.worker.integrity import checksums_of
from tiercache.worker.pools import block_views
from tiercache.worker.remote_io import RemoteWriter

LAYOUT = BlockLayout.from_spec(KVCodecSpec.from_preset("k8v4"), 2, 2, 64, 32)


def namespace(codec: str = "codec-a", model: str = "org/model") -> RemoteNamespace:
    return RemoteNamespace(model, codec, LAYOUT, rank=0)


def rows(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, LAYOUT.dram_stride), dtype=torch.uint8, generator=g)


def write(store: DiskStore, hashes: list[bytes], data: torch.Tensor, batch: int = 4) -> RemoteWriter:
    writer = RemoteWriter(store, max_blocks=64, batch_blocks=batch)
    pieces = checksums_of(block_views(data, LAYOUT))
    for h, row, p in zip(hashes, data, pieces, strict=True):
        assert writer.offer(h, row, p)
    assert writer.flush(30)
    return writer


def where(directory: str, block_hash: bytes) -> tuple[str, int]:
    """The segment file and offset of a block's slot, as the index names it."""
    found = read_index(os.path.join(directory, INDEX_NAME))
    slot = next(e.slot for e in found.entries if e.block_hash == block_hash)
    seg, k = divmod(slot, found.head.segment_slots)
    return os.path.join(directory, segment_name(seg)), k * found.head.slot_bytes


def segment_bytes(directory: str) -> int:
    return sum(e.stat().st_size for e in os.scandir(directory) if e.name.endswith(".dat"))
