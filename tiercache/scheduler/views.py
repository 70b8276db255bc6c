"""Read-only views of a TierManager, for inspection, invariant checks and tests: nothing here can change a
block's state, and nothing outside the manager needs its index or allocators.

Provides:
    TierView      one tier now: capacity, used and free slots, stored (ready) blocks
    BlockView     one block now: where it is, its times and hits, what keeps it from being evicted
    ManagerView(manager, index, alloc)        built by TierManager.view()
        codec_id, policy, clock()             what the manager runs with (policy: for its own explanations)
        tiers() -> tuple[TierView, ...]       fastest first;  tier(name) -> TierView
        block(hash) -> BlockView | None       a point read
        blocks(tier, limit=None)              that tier's ready blocks, most recently used first (lazy)
        hashes() / __len__ / __contains__     every stored block, stores in flight included
        slot_used(tier, slot) -> bool         the slot is owned (by a block, a move or a retired slot)
        on_disk(hash) -> bool                 the disk tier holds a file of it (False without a disk tier)
        stats() -> dict                       counters (blocks, free slots, jobs in flight, …)

Views read live state without a lock: call them on the scheduler thread, or accept that a block moving at
that instant may show fields from adjacent steps (the inspection service's point reads do).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any

from tiercache.scheduler.allocator import SlotAllocator
from tiercache.scheduler.blocks import BlockEntry, BlockIndex
from tiercache.wire import TIERS


@dataclass(frozen=True)
class TierView:
    name: str
    capacity_blocks: int
    used_slots: int
    free_slots: int
    stored_blocks: int


@dataclass(frozen=True)
class BlockView:
    block_hash: bytes
    tier: str
    slot: int
    hits: int
    stored_at: float  # on the manager's clock
    last_access: float
    ready: bool  # False while its store is in flight
    loads_in_flight: int
    moving: bool
    evictable: bool

    @classmethod
    def of(cls, e: BlockEntry) -> BlockView:
        return cls(e.block_hash, e.tier, e.slot, e.hits, e.stored_at, e.last_access, e.ready, e.refs,
                   e.move is not None, e.evictable)  # fmt: skip


class ManagerView:
    def __init__(self, manager, index: BlockIndex, alloc: dict[str, SlotAllocator]) -> None:
        self._m = manager
        self._index = index
        self._alloc = alloc

    @property
    def codec_id(self) -> str:
        return self._m.codec_id

    @property
    def policy(self):
        return self._m.policy

    @property
    def clock(self) -> Callable[[], float]:
        return self._m.clock

    def tier(self, name: str) -> TierView:
        alloc = self._alloc[name]
        stored = len(self._index.order[name])
        return TierView(name, alloc.capacity, alloc.num_used, alloc.num_free, stored)

    def tiers(self) -> tuple[TierView, ...]:
        return tuple(self.tier(name) for name in TIERS)

    def block(self, block_hash: bytes) -> BlockView | None:
        entry = self._index.get(block_hash)
        return None if entry is None else BlockView.of(entry)

    def blocks(self, tier: str, limit: int | None = None) -> Iterator[BlockView]:
        entries = self._index.entries
        for block_hash in islice(reversed(self._index.order[tier]), limit):
            yield BlockView.of(entries[block_hash])

    def hashes(self) -> list[bytes]:
        return list(self._index.entries)

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self._index

    def slot_used(self, tier: str, slot: int) -> bool:
        return self._alloc[tier].is_used(slot)

    def on_disk(self, block_hash: bytes) -> bool:
        disk = self._m._disk
        return disk is not None and block_hash in disk

    def stats(self) -> dict[str, Any]:
        return self._m.stats()
