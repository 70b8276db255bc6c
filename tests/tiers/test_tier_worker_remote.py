"""TierWorker's DRAM-row verbs for the remote tier: dram_rows (an upload's bytes and recorded checksum, only
from a slot that holds the block) and fill_dram (fetched rows into DRAM: loaded and verified like a store)."""

import pytest
import torch
from tier_blocks import random_blocks

from tiercache.layout import BlockLayout
from tiercache.wire import DRAM, LoadItem, RemoteItem, StoreItem
from tiercache.worker.integrity import block_checksum, checksums_of
from tiercache.worker.pools import block_views
from tiercache.worker.tier_worker import TierWorker

LAYOUTS = [BlockLayout(2, 16, 2, 32, 32), BlockLayout(2, 3, 3, 30, 41)]
CODEC = "codec"


def name(i: int) -> bytes:
    return bytes([i]) * 16


def worker_with_dram_blocks(layout: BlockLayout, checksums: bool = True) -> TierWorker:
    worker = TierWorker.create(layout, 2, 4, CODEC, device="cpu", pin=False)
    if not checksums:
        worker.checksums = None
    data = random_blocks(layout, 4, seed=3)
    worker.store([StoreItem(name(i), DRAM, i, i) for i in range(4)], data)
    return worker


@pytest.mark.parametrize("checksums", [True, False])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_dram_rows_are_the_slots_bytes_with_their_stored_checksum(layout, checksums):
    worker = worker_with_dram_blocks(layout, checksums)
    got = worker.dram_rows([RemoteItem(name(2), 2), RemoteItem(name(0), 0), RemoteItem(name(9), 1)])
    for (row, sums), slot in zip(got[:2], (2, 0), strict=True):
        assert torch.equal(row, worker.dram.buffer[slot])
        expected = block_checksum(checksums_of(worker.dram.read([slot])), layout)[0].tolist()
        assert list(sums) == expected
    assert isinstance(got[2], str) and got[2].startswith("not uploaded")  # slot 1 holds block 1, not 9
    row, _ = got[0]
    worker.dram.buffer[2].zero_()
    assert not torch.equal(row, worker.dram.buffer[2])  # a copy: the slot may be reused at once


@pytest.mark.parametrize("layout", LAYOUTS)
def test_filled_rows_load_and_verify_like_stored_blocks(layout):
    source = worker_with_dram_blocks(layout)
    uploads = source.dram_rows([RemoteItem(name(i), i) for i in range(3)])
    rows = torch.stack([row for row, _ in uploads])
    sums = checksums_of(block_views(rows, layout))  # a fetch's piece sums, verified against its header's
    assert block_checksum(sums, layout).tolist() == [list(s) for _, s in uploads]
    target = TierWorker.create(layout, 2, 4, CODEC, device="cpu", pin=False)
    fetched = [RemoteItem(name(i), slot) for i, slot in zip(range(3), (3, 1, 0), strict=True)]
    with pytest.raises(ValueError, match=r"piece checksums \[3, 2, \d+, 2\]"):
        target.fill_dram(fetched, rows, block_checksum(sums, layout))
    target.fill_dram(fetched, rows, sums)
    items = [LoadItem(f.block_hash, DRAM, f.slot, 0) for f in fetched]
    assert [target.refusal(x) for x in items] == [None] * 3
    blocks = target.load(items)
    assert target.verify(items, blocks) == [None] * 3
    assert blocks.equal(block_views(rows, layout))
    wrong = torch.zeros(1, 2, target.dram.layout.num_layers, 2, dtype=torch.int64)
    target.checksums.record(DRAM, [1], wrong)  # a wrong sum is caught
    assert target.verify(items, target.load(items))[1].startswith("checksum mismatch")
