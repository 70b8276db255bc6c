"""Issue 42, item 1: a plan's slot outside its pool — negative (Python's -1 is the last slot) or too large —
is refused before any tag, checksum or byte changes. A transfer job with destination slot -1 used to clear
the last slot's tag and overwrite its checksum; a store or fetch into slot -1 wrote the last slot's bytes."""

from __future__ import annotations

import pytest
import torch
from tier_blocks import random_blocks

from tiercache.layout import BlockLayout
from tiercache.wire import DRAM, VRAM, LoadItem, RemoteItem, StoreItem, TransferJob
from tiercache.worker.tags import SlotTags
from tiercache.worker.tier_worker import TierWorker

LAYOUT = BlockLayout(2, 16, 2, 32, 32)
SLOTS = 4  # per tier
BAD = [-1, -SLOTS, SLOTS, 10**6]


def name(i: int) -> bytes:
    return bytes([i]) * 16


def full_worker() -> TierWorker:
    """Blocks 0–3 in VRAM slots 0–3, blocks 4–7 in DRAM slots 0–3."""
    worker = TierWorker.create(LAYOUT, SLOTS, SLOTS, "codec", device="cpu", pin=False)
    items = [StoreItem(name(i), VRAM if i < SLOTS else DRAM, i % SLOTS, i) for i in range(2 * SLOTS)]
    worker.store(items, random_blocks(LAYOUT, 2 * SLOTS, seed=1))
    return worker


def state(worker: TierWorker) -> tuple:
    """Every tag, checksum and byte of both tiers."""
    tags = [worker.tags.tag(t, s) for t in (VRAM, DRAM) for s in range(SLOTS)]
    sums = [worker.checksums.get(t, list(range(SLOTS))).clone() for t in (VRAM, DRAM)]
    pools = [t.clone() for t in (*worker.vram.views().values(), worker.dram.buffer)]
    return tags, sums, pools


def unchanged(worker: TierWorker, before: tuple) -> bool:
    tags, sums, pools = state(worker)
    return (tags == before[0] and all(torch.equal(a, b) for a, b in zip(sums, before[1], strict=True))
            and all(torch.equal(a, b) for a, b in zip(pools, before[2], strict=True)))  # fmt: skip


def all_load(worker: TierWorker) -> bool:
    items = [LoadItem(name(i), VRAM if i < SLOTS else DRAM, i % SLOTS, i) for i in range(2 * SLOTS)]
    return worker.refusals_before_read(items) == [None] * len(items) and worker.verify(
        items, worker.load(items)
    ) == [None] * len(items)


@pytest.mark.parametrize("slot", BAD)
@pytest.mark.parametrize(("src_tier", "dst_tier"), [(VRAM, DRAM), (DRAM, VRAM)])
def test_a_job_with_a_bad_destination_slot_fails_and_changes_nothing(src_tier, dst_tier, slot):
    worker = full_worker()
    before = state(worker)
    worker.submit(TransferJob(9, src_tier, dst_tier, (0, 1), (2, slot), (name(0), name(1))))
    (result,) = worker.wait()
    assert not result.ok and result.job_id == 9 and worker.jobs_in_flight == 0
    assert f"destination check failed: {dst_tier} slots [{slot}] are out of range [0, 4)" in result.error
    assert unchanged(worker, before) and all_load(worker)  # slot 3's tag and checksum (-1) untouched


@pytest.mark.parametrize("slot", BAD)
def test_a_job_with_a_bad_source_slot_fails(slot):
    worker = full_worker()
    worker.submit(TransferJob(9, VRAM, DRAM, (slot,), (1,), (name(0),)))
    (result,) = worker.wait()
    assert not result.ok and f"vram slot {slot} is out of range [0, 4)" in result.error


@pytest.mark.parametrize("slot", BAD)
@pytest.mark.parametrize("tier", [VRAM, DRAM])
def test_a_store_with_a_bad_slot_writes_nothing(tier, slot):
    worker = full_worker()
    before = state(worker)
    items = [StoreItem(name(9), VRAM, 0, 0), StoreItem(name(10), tier, slot, 1)]  # a good one first
    refusal = rf"{tier} slots \[{slot}\] are out of range \[0, 4\).*refused before"
    with pytest.raises(IndexError, match=refusal):
        worker.store(items, random_blocks(LAYOUT, 2, seed=2))
    calls = []
    with pytest.raises(IndexError, match=r"vram slots \[.*\] are out of range"):
        worker.store_in_place([StoreItem(name(9), VRAM, slot, 0)], lambda pool, slots: calls.append(slots))
    assert calls == [] and unchanged(worker, before) and all_load(worker)


@pytest.mark.parametrize("slot", BAD)
def test_a_fetch_into_a_bad_dram_slot_writes_nothing(slot):
    worker = full_worker()
    before = state(worker)
    rows = torch.zeros(1, worker.dram.stride, dtype=torch.uint8)
    sums = torch.zeros(1, 2, LAYOUT.num_layers, 2, dtype=torch.int64)
    with pytest.raises(IndexError, match=r"dram slots \[.*\] are out of range"):
        worker.fill_dram([RemoteItem(name(9), slot)], rows, sums)
    assert unchanged(worker, before) and all_load(worker)


def test_an_upload_from_a_bad_dram_slot_is_not_uploaded():
    worker = full_worker()
    got = worker.dram_rows([RemoteItem(name(7), -1), RemoteItem(name(5), 1), RemoteItem(name(7), 10**6)])
    assert got[0] == "not uploaded: dram slot -1 is out of range [0, 4)"
    assert got[2] == "not uploaded: dram slot 1000000 is out of range [0, 4)"
    row, _ = got[1]
    assert torch.equal(row, worker.dram.buffer[1])


def test_slot_tags_refuse_a_wrapping_slot_and_change_nothing():
    tags = SlotTags({VRAM: 3})
    tags.set(VRAM, [0, 1, 2], [name(0), name(1), name(2)], "c")
    for call in (lambda: tags.clear(VRAM, [0, -1]), lambda: tags.set(VRAM, [0, -3], [name(5)] * 2, "c")):
        with pytest.raises(IndexError, match=r"vram slots \[-\d\] are out of range \[0, 3\)"):
            call()
    assert [tags.tag(VRAM, s) for s in range(3)] == [(name(i), "c") for i in range(3)]
    assert tags.out_of_range(VRAM, range(3)) is None
    assert len(tags.out_of_range(VRAM, range(-(10**6), 0))) < 300  # a long list is shown shortened
