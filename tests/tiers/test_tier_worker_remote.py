"""TierWorker's DRAM-row verbs for the remote tier: dram_rows (an upload's bytes and recorded checksum, only
from a slot that holds the block) and fill_dram (fetched rows into DRAM: loaded and verified like a store);
remote_io.upload_rows: the same for uploads from VRAM slots too (write: through, reused)."""

import pytest
import torch
from tier_blocks import random_blocks

from tiercache.layout import BlockLayout
from tiercache.remote.format import HEADER_BYTES, RemoteNamespace, encode_value
from tiercache.wire import DRAM, VRAM, LoadItem, RemoteItem, StoreItem
from tiercache.worker.integrity import block_checksum, checksums_of
from tiercache.worker.pools import block_views
from tiercache.worker.remote_io import upload_rows
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
    for (row, pieces), slot in zip(got[:2], (2, 0), strict=True):
        assert torch.equal(row, worker.dram.buffer[slot])
        assert torch.equal(pieces, checksums_of(worker.dram.read([slot]))[0])
    assert isinstance(got[2], str) and got[2].startswith("not uploaded")  # slot 1 holds block 1, not 9
    row, pieces = got[0]
    assert row.data_ptr() == worker.dram.buffer[2].data_ptr()  # a view of the slot, not a copy
    # the writer's copy, made at once (RemoteWriter.offer)
    ns = RemoteNamespace("model", CODEC, layout)
    value = encode_value(ns, name(2), pieces, row)
    worker.dram.buffer[2].zero_()  # the slot reused: the value keeps the block
    assert not torch.equal(value[HEADER_BYTES : ns.pieces_at], worker.dram.buffer[2])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_filled_rows_load_and_verify_like_stored_blocks(layout):
    source = worker_with_dram_blocks(layout)
    uploads = source.dram_rows([RemoteItem(name(i), i) for i in range(3)])
    rows = torch.stack([row for row, _ in uploads])
    sums = checksums_of(block_views(rows, layout))  # a fetch's piece sums, verified against its value's
    assert all(torch.equal(a, b) for a, (_, b) in zip(sums, uploads, strict=True))
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


@pytest.mark.parametrize("checksums", [True, False])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_uploads_from_vram_slots_are_the_dram_rows_of_the_same_blocks(layout, checksums):
    """A block uploaded from VRAM is byte for byte, checksum included, what the same block uploaded from DRAM
    is: the store holds one format, whichever tier a block went up from."""
    data = random_blocks(layout, 4, seed=5)
    in_dram = worker_with_dram_blocks(layout, checksums)  # blocks 0..3 in DRAM slots 0..3 (seed 3)
    in_dram.store([StoreItem(name(i), DRAM, i, i) for i in range(4)], data)
    in_vram = TierWorker.create(layout, 4, 2, CODEC, device="cpu", pin=False)
    if not checksums:
        in_vram.checksums = None
    in_vram.store([StoreItem(name(i), VRAM, 3 - i, i) for i in range(4)], data)  # block i in VRAM slot 3-i
    want = in_dram.dram_rows([RemoteItem(name(i), i) for i in (2, 0)])
    got = upload_rows(in_vram, [RemoteItem(name(2), 1, VRAM), RemoteItem(name(0), 3, VRAM)])
    for (row, sums), (want_row, want_sums) in zip(got, want, strict=True):
        assert same_sections(row, want_row, layout) and torch.equal(sums, want_sums)
        assert row.device.type == "cpu" and row.shape == (layout.dram_stride,)
    mixed = upload_rows(
        in_vram, [RemoteItem(name(1), 2, VRAM), RemoteItem(name(9), 0, VRAM), RemoteItem(name(3), 0, VRAM)]
    )
    assert same_sections(mixed[0][0], in_dram.dram_rows([RemoteItem(name(1), 1)])[0][0], layout)
    assert mixed[1].startswith("not uploaded") and "holds block" in mixed[1]  # slot 0 holds block 3
    assert isinstance(mixed[2], tuple)
    both = upload_rows(in_dram, [RemoteItem(name(1), 1), RemoteItem(name(2), 1, VRAM)])
    assert isinstance(both[0], tuple) and "holds no block" in both[1]  # in_dram's VRAM slots are empty


def same_sections(a: torch.Tensor, b: torch.Tensor, layout: BlockLayout) -> bool:
    """Two DRAM rows hold the same block (bytes between sections, alignment padding, are no part of it)."""
    return block_views(a.unsqueeze(0), layout).equal(block_views(b.unsqueeze(0), layout))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("checksums", [True, False])
def test_gpu_vram_uploads_reach_the_host_later_with_the_bytes_of_their_store(checksums):
    """On a GPU a VRAM block goes up through the upload stream (a PendingRow, nothing waits at upload_rows):
    its row and checksum are what the same block's DRAM upload gives, even when the step rewrites the slot
    right after, and a writer encodes it like a row offered at once."""
    from tiercache.worker.remote_io import PendingRow

    layout = LAYOUTS[1]
    data, other = random_blocks(layout, 4, seed=5), random_blocks(layout, 4, seed=6)
    in_dram = worker_with_dram_blocks(layout, checksums)
    in_dram.store([StoreItem(name(i), DRAM, i, i) for i in range(4)], data)
    in_vram = TierWorker.create(layout, 4, 2, CODEC, device="cuda", pin=True)
    if not checksums:
        in_vram.checksums = None
    in_vram.store([StoreItem(name(i), VRAM, 3 - i, i) for i in range(4)], data.to("cuda"))
    got = upload_rows(in_vram, [RemoteItem(name(2), 1, VRAM), RemoteItem(name(0), 3, VRAM)])
    in_vram.store([StoreItem(name(9 + i), VRAM, i, i) for i in range(4)], other.to("cuda"))  # slots rewritten
    want = in_dram.dram_rows([RemoteItem(name(i), i) for i in (2, 0)])
    assert all(isinstance(pending, PendingRow) for pending in got)
    for pending, (want_row, want_sums) in zip(got, want, strict=True):
        row, sums = pending.result()
        assert row.device.type == "cpu" and row.is_pinned() and row.shape == (layout.dram_stride,)
        assert same_sections(row, want_row, layout) and torch.equal(sums, want_sums)
