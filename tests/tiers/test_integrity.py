"""Checksums of stored blocks on the TierWorker (CPU): one changed byte anywhere in a stored block — packed
bytes or norms, any layer, VRAM or DRAM slot — is a checksum mismatch naming the tier and slot, the slot's
tag is cleared, and the other blocks load; a block's checksum follows it through spill and warm."""

import pytest
import torch
from tier_blocks import random_blocks

from tiercache.layout import BlockLayout
from tiercache.wire import DRAM, VRAM, LoadItem, StoreItem, TransferJob
from tiercache.worker.integrity import checksums_of
from tiercache.worker.pools import SECTIONS, KVBlocks
from tiercache.worker.tier_worker import TierWorker

# TQ4 d64, K8V4 d128 (one layer piece per section small), and pieces that are not whole 32-bit words
LAYOUTS = [BlockLayout(2, 16, 2, 32, 32), BlockLayout(3, 4, 1, 128, 64), BlockLayout(2, 3, 3, 30, 41)]
CODEC = "codec"


def name(i: int) -> bytes:
    return i.to_bytes(32, "little")


def stored(layout: BlockLayout, checksums: bool = True) -> tuple[TierWorker, KVBlocks]:
    """A worker with blocks 0–3 stored in VRAM slots 0–3 and blocks 4–7 in DRAM slots 4–7."""
    worker = TierWorker.create(layout, 8, 8, CODEC, device="cpu", pin=False)
    if not checksums:
        worker.checksums = None
    data = random_blocks(layout, 8, seed=layout.num_layers)
    items = [StoreItem(name(i), VRAM if i < 4 else DRAM, i, i) for i in range(8)]
    worker.store(items, data)
    return worker, data


def loads(*places: tuple[str, int]) -> list[LoadItem]:
    return [LoadItem(name(slot), tier, slot, slot) for tier, slot in places]


def flip(worker: TierWorker, tier: str, slot: int, section: str, layer: int, byte: int, bits: int = 0x10):
    """XOR one byte of a stored block, addressed within the (layer, block) piece of a section."""
    pool = worker.vram if tier == VRAM else worker.dram
    piece = getattr(pool, section)[layer, slot]
    if piece.dtype != torch.uint8:
        piece = piece.view(torch.uint8)  # float32 norms [BS, H] → their bytes [BS, 4·H]
    piece.view(-1)[byte] ^= bits


def places_of(layout: BlockLayout):
    """Every section and layer, first and last byte of the piece."""
    L, BS, H = layout.num_layers, layout.block_size, layout.num_kv_heads
    sizes = {"k_packed": BS * H * layout.k_packed_dim, "v_packed": BS * H * layout.v_packed_dim}
    sizes |= {"k_norms": BS * H * 4, "v_norms": BS * H * 4}
    return [(s, layer, byte) for s in SECTIONS for layer in range(L) for byte in (0, sizes[s] - 1)]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("tier,slot", [(VRAM, 2), (DRAM, 5)])
def test_one_changed_byte_anywhere_is_a_mismatch_naming_tier_and_slot(layout, tier, slot):
    for section, layer, byte in places_of(layout):
        worker, _ = stored(layout)
        flip(worker, tier, slot, section, layer, byte)
        items = loads((VRAM, 1), (tier, slot), (DRAM, 7))
        got = worker.load(items)
        reasons = worker.verify(items, got)
        where = f"{section} layer {layer} byte {byte}"
        assert reasons[0] is None and reasons[2] is None, where
        assert reasons[1] and reasons[1].startswith(f"checksum mismatch: {tier} slot {slot} "), where
        assert "holds no block" in worker.refusal(items[1])  # the slot is not read again as that block


@pytest.mark.parametrize("layout", LAYOUTS)
def test_checksums_follow_blocks_through_spill_and_warm(layout):
    worker, data = stored(layout)
    worker.submit(TransferJob(1, VRAM, DRAM, (0, 1), (0, 1), (name(0), name(1))))  # spill
    worker.submit(TransferJob(2, DRAM, VRAM, (4, 5), (4, 5), (name(4), name(5))))  # warm
    assert all(r.ok for r in worker.wait())
    moved = [LoadItem(name(i), tier, i, i) for i, tier in ((0, DRAM), (1, DRAM), (4, VRAM), (5, VRAM))]
    got = worker.load(moved)
    assert got.equal(data.select([0, 1, 4, 5])) and worker.verify(moved, got) == [None] * 4
    # a block corrupted before a move is caught after it: the checksum moved, the bytes changed
    flip(worker, VRAM, 2, "v_norms", layout.num_layers - 1, 3)
    worker.submit(TransferJob(3, VRAM, DRAM, (2,), (2,), (name(2),)))
    assert all(r.ok for r in worker.wait())
    spilled = [LoadItem(name(2), DRAM, 2, 2)]
    assert worker.verify(spilled, worker.load(spilled))[0].startswith("checksum mismatch: dram slot 2 ")


def test_refusals_before_read_are_each_items_refusal_and_expected_sums_follow_the_items():
    """The batch check gives refusal(item) for every item of a mixed batch (held, wrong hash, wrong codec,
    cleared, out of range, refused by the manager, both tiers interleaved); expected_sums of a one-tier and
    of a two-tier batch are the recorded sums in item order, looked up per item or taken from what read
    gave (each source's own sums, in its positions' order)."""
    layout = LAYOUTS[0]
    worker, _ = stored(layout)
    worker.tags.set(VRAM, [3], [name(3)], "other codec")
    worker.tags.clear(DRAM, [6])
    items = [
        *loads((DRAM, 5), (VRAM, 0), (VRAM, 3), (DRAM, 6), (VRAM, 1)),
        LoadItem(name(9), VRAM, 2, 0),  # slot 2 holds block 2
        LoadItem(name(1), VRAM, 99, 0),
        LoadItem(name(4), None, 4, 0),
    ]
    reasons = worker.refusals_before_read(items)
    assert reasons == [worker.refusal(item) for item in items]
    assert reasons[0] is None and reasons[1] is None and reasons[4] is None
    assert "codec mismatch" in reasons[2] and "holds no block" in reasons[3] and "holds block" in reasons[5]
    assert "out of range" in reasons[6] and "refused it after the lookup" in reasons[7]
    assert worker.refusals_before_read(loads((VRAM, 0), (VRAM, 1))) == [None, None]
    mixed = loads((DRAM, 5), (VRAM, 0), (DRAM, 7), (VRAM, 2))
    table = worker.checksums
    want = torch.cat([table.get(tier, [slot]) for tier, slot in ((DRAM, 5), (VRAM, 0), (DRAM, 7), (VRAM, 2))])
    for batch, sums in ((mixed, want), (mixed[1::2], want[1::2]), (mixed[::2], want[::2])):  # two, one tier
        sources = worker.read(batch)
        assert torch.equal(worker.expected_sums(batch), sums)
        assert torch.equal(worker.expected_sums(batch, sources), sums)
        for source in sources:
            assert torch.equal(source.expected, sums[source.positions])
    unchecked, _ = stored(layout, checksums=False)
    assert all(source.expected is None for source in unchecked.read(mixed))
    assert unchecked.expected_sums(mixed, unchecked.read(mixed)) is None


def test_the_sums_recorded_are_those_of_the_stored_bytes():
    layout = LAYOUTS[0]
    worker, data = stored(layout)
    items = loads(*((VRAM, i) for i in range(4)), *((DRAM, i) for i in range(4, 8)))
    got = worker.load(items)
    assert got.equal(data) and torch.equal(checksums_of(got), checksums_of(data))


def test_without_checksums_a_changed_byte_is_served():
    """The off switch (for measuring the cost) really turns the check off: the feature is what detects."""
    worker, _ = stored(LAYOUTS[0], checksums=False)
    flip(worker, VRAM, 2, "k_packed", 0, 0)
    items = loads((VRAM, 2))
    assert worker.verify(items, worker.load(items)) == [None]


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gpu_checksums_are_the_references_and_follow_moves(layout):
    """On CUDA (the Triton kernel, pinned DRAM, transfers on their own streams): stores record the
    reference's sums, the sums follow a spill and a warm issued right after the store without a
    synchronisation, and one changed byte in either tier is caught."""
    worker = TierWorker.create(layout, 16, 16, CODEC, device="cuda")
    data = random_blocks(layout, 8, seed=7)
    items = [StoreItem(name(i), VRAM, i, i) for i in range(8)]
    worker.store(items, data.to("cuda"))
    assert torch.equal(checksums_of(worker.vram.read(range(8))).cpu(), checksums_of(data))  # Triton = torch
    spill = TransferJob(1, VRAM, DRAM, tuple(range(8)), tuple(range(8, 16)), tuple(map(name, range(8))))
    worker.submit(spill)
    assert all(r.ok for r in worker.wait())
    worker.submit(TransferJob(2, DRAM, VRAM, (8, 9), (14, 15), (name(0), name(1))))
    assert all(r.ok for r in worker.wait())
    items = [LoadItem(name(0), VRAM, 14, 0), LoadItem(name(1), VRAM, 15, 0), LoadItem(name(5), DRAM, 13, 0)]
    got = worker.load(items)
    assert got.equal(data.select([0, 1, 5])) and worker.verify(items, got) == [None] * 3
    flip(worker, VRAM, 15, "k_packed", layout.num_layers - 1, 0)
    flip(worker, DRAM, 13, "v_norms", 0, 2)
    reasons = worker.verify(items, worker.load(items))
    assert reasons[0] is None
    assert reasons[1].startswith("checksum mismatch: vram slot 15 ")
    assert reasons[2].startswith("checksum mismatch: dram slot 13 ")
