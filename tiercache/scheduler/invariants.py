"""Invariant checks of a TierManager's state (its quick_check() and check() call them; the tests use those).

Provides:
    quick_check(alloc, blocks, moving, retired)   O(1): slots in use = stored blocks + move destinations +
                                                  retired slots
    full_check(index, alloc, moving, retired)     O(capacity + blocks): every used slot owned by exactly one
                                                  block (current slot, move destination or retired slot),
                                                  allocators consistent, recency order = ready blocks per
                                                  tier, counters match
"""

from __future__ import annotations

from collections.abc import Mapping

from tiercache.scheduler.allocator import SlotAllocator
from tiercache.scheduler.blocks import BlockIndex


def quick_check(alloc: Mapping[str, SlotAllocator], blocks: int, moving: int, retired: int) -> None:
    used = sum(a.num_used for a in alloc.values())
    assert used == blocks + moving + retired, f"slots in use {used} != blocks {blocks} + moving + retired"


def full_check(index: BlockIndex, alloc: Mapping[str, SlotAllocator], moving: int, retired: int) -> None:
    owners: dict[tuple[str, int], bytes] = {}

    def own(tier: str, slot: int, block_hash: bytes) -> None:
        assert (tier, slot) not in owners, f"{tier} slot {slot} owned twice"
        assert alloc[tier].is_used(slot), f"{tier} slot {slot} owned but free"
        owners[tier, slot] = block_hash

    seen_retired = seen_moving = 0
    for block_hash, entry in index.entries.items():
        own(entry.tier, entry.slot, block_hash)
        assert entry.refs >= 0
        assert (block_hash in index.order[entry.tier]) == entry.ready
        if entry.move is not None:
            own(entry.move.to_tier, entry.move.to_slot, block_hash)
            seen_moving += 1
        for tier, slot in entry.retired:
            own(tier, slot, block_hash)
            seen_retired += 1
    assert seen_moving == moving and seen_retired == retired
    for tier, allocator in alloc.items():
        allocator.check()
        assert allocator.num_used == sum(1 for t, _ in owners if t == tier), f"{tier}: leaked slots"
        assert len(index.order[tier]) == sum(1 for e in index.entries.values() if e.tier == tier and e.ready)
