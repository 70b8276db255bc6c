"""Invariant checks of a TierManager (used by its quick_check() and check(), and by the tests).

Provides:
    quick_check(manager)   O(1): slots in use = stored blocks + move destinations + retired slots
    full_check(manager)    O(capacity + blocks): every used slot owned by exactly one block (current slot,
                           move destination or retired slot), allocators consistent, recency order = ready
                           blocks per tier, counters match
"""

from __future__ import annotations

from tiercache.events import DRAM, VRAM


def quick_check(m) -> None:
    """O(1) invariant: slots in use = stored blocks + move destinations + retired slots."""
    used = m.alloc[VRAM].num_used + m.alloc[DRAM].num_used
    expected = len(m.index) + m.mover.moving_blocks + m.mover.retired_slots
    assert used == expected, f"slots in use {used} != blocks {len(m.index)} + moving + retired"


def full_check(m) -> None:
    """Full invariant check, O(capacity + blocks): every used slot is owned by exactly one thing."""
    owners: dict[tuple[str, int], bytes] = {}

    def own(tier: str, slot: int, block_hash: bytes) -> None:
        assert (tier, slot) not in owners, f"{tier} slot {slot} owned twice"
        assert m.alloc[tier].is_used(slot), f"{tier} slot {slot} owned but free"
        owners[tier, slot] = block_hash

    retired = moving = 0
    for block_hash, entry in m.index.entries.items():
        own(entry.tier, entry.slot, block_hash)
        assert entry.refs >= 0
        assert (block_hash in m.index.order[entry.tier]) == entry.ready
        if entry.move is not None:
            own(entry.move.to_tier, entry.move.to_slot, block_hash)
            moving += 1
        for tier, slot in entry.retired:
            own(tier, slot, block_hash)
            retired += 1
    assert moving == m.mover.moving_blocks and retired == m.mover.retired_slots
    for tier, alloc in m.alloc.items():
        alloc.check()
        assert alloc.num_used == sum(1 for t, _ in owners if t == tier), f"{tier}: leaked slots"
        assert len(m.index.order[tier]) == sum(
            1 for e in m.index.entries.values() if e.tier == tier and e.ready
        )
