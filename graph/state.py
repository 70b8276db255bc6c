"""Per-block counters as numpy columns, so one advisor cycle scores every block in a few vector operations.

Provides `BlockTable` (slots recycled through a free list; columns grow by doubling) and `TableCopy`
(a consistent copy of the used prefix of every column, taken under the graph's lock in O(memcpy)).
A slot is live when its `uid` is non-zero; uids are never reused, so a child's `parent_uid` tells whether
the parent it was linked to is still the block in `parent` slot.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

COLUMNS: dict[str, type] = {
    "uid": np.int64,  # 0 = free slot
    "tier": np.int8,  # index into the graph's tiers
    "source": np.int8,  # scoring.SOURCES code
    "hits": np.int32,  # later requests that found the block cached
    "requests": np.int32,  # distinct requests that used it
    "chain_hits": np.float32,  # max(hits, value inherited from the parent): see scoring
    "branches": np.int32,  # children ever stored under this block
    "branches_hit": np.int32,  # of those, children that were later hit
    "run": np.int32,  # never-reused blocks of the chain ending here, when stored: see reuse
    "reuse_class": np.int8,  # reuse.reuse_class at the last access
    "tick": np.int64,  # the tier's store counter at the last access
    "seq": np.int64,  # the graph's access counter at the last store, hit or move: LRU order within a tier
    "last_access": np.float64,  # clock() at the last access
    "created": np.float64,
    "importance": np.float32,
    "parent": np.int64,  # parent slot or -1
    "parent_uid": np.int64,
    "last_request": np.int64,  # hash of the last request id that used it
    "last_vt": np.int64,  # the graph's block-request clock (vt) at the last store or hit
    "gap": np.uint8,  # scoring.GAPS bucket of the last reuse distance in vt (0: never reused)
    "loop": np.int8,  # 1: the last reuse came from farther than recency reaches (see counters)
    "orphan": np.int8,  # 1: a block of its prefix was removed while it was cached: no lookup reaches it
    "arc_out": np.int8,  # 1: the shadow ARC does not hold it (evicted first while the cache follows ARC: arc)
}


@dataclass(frozen=True)
class TableCopy:
    """A copy of the used slots [0, n): one array per column, `children` [n, n_tiers], `hashes` [n];
    `reuse_p` [reuse.N_CLASSES] and `loop_p` [reuse.N_BUCKETS]: the learned reuse probability of each class
    and on-time return probability of each loop bucket at the time of the copy; `tier_ticks` (each tier's
    store counter) and `vt` (block requests so far): the clocks then; `mode`: the ranking the cache
    follows ("graph", or "arc": `tiercache.graph.arc`)."""

    columns: dict[str, np.ndarray]
    children: np.ndarray
    hashes: list
    tier_sizes: list[int]
    reuse_p: np.ndarray
    loop_p: np.ndarray
    tier_ticks: list[int]
    vt: int
    mode: str = "graph"

    def __getattr__(self, name: str) -> np.ndarray:
        try:
            return self.columns[name]
        except KeyError:
            raise AttributeError(name) from None


class BlockTable:
    """Columns indexed by slot, plus `children[slot, tier]`: cached children of the block in each tier."""

    def __init__(self, n_tiers: int, capacity: int = 1024) -> None:
        self.n_tiers = n_tiers
        self.high = 0  # slots [0, high) have been used at least once
        self._free: list[int] = []
        self._next_uid = 1
        self._alloc_columns(capacity)

    def _alloc_columns(self, capacity: int) -> None:
        old = {name: getattr(self, name, None) for name in (*COLUMNS, "children")}
        for name, dtype in COLUMNS.items():
            setattr(self, name, np.zeros(capacity, dtype=dtype))
        self.children = np.zeros((capacity, self.n_tiers), dtype=np.int32)
        for name, arr in old.items():
            if arr is not None:
                getattr(self, name)[: len(arr)] = arr
        self._columns = tuple(getattr(self, name) for name in COLUMNS)
        self.capacity = capacity

    def alloc(self) -> int:
        """A fresh slot with a new uid; its counters are zero."""
        if self._free:
            slot = self._free.pop()
        else:
            if self.high == self.capacity:
                self._alloc_columns(2 * self.capacity)
            slot = self.high
            self.high += 1
        # Counters are already zero: fresh columns are zeros and free() zeroes what it recycles.
        self.parent[slot] = -1
        self.uid[slot] = self._next_uid
        self._next_uid += 1
        return slot

    def free(self, slot: int) -> None:
        """Zero the slot's counters (nothing outlives a removal) and recycle it."""
        for column in self._columns:
            column[slot] = 0
        self.children[slot] = 0
        self._free.append(slot)

    def live_parent(self, slot: int) -> int:
        """The parent slot if the parent this block was linked to is still stored, else -1."""
        p = self.parent.item(slot)
        if p >= 0 and self.uid.item(p) == self.parent_uid.item(slot):
            return p
        return -1

    def copy(
        self, hashes: list, tier_sizes: list[int], reuse_p, loop_p, tier_ticks: list[int], vt: int, mode: str
    ):
        """A `TableCopy` of the used slots with these per-graph values (the caller holds the lock)."""
        n = self.high
        cols = {name: getattr(self, name)[:n].copy() for name in COLUMNS}
        children, sizes, ticks = self.children[:n].copy(), list(tier_sizes), list(tier_ticks)
        return TableCopy(cols, children, list(hashes[:n]), sizes, reuse_p, loop_p, ticks, vt, mode)

    def nbytes(self) -> int:
        return sum(getattr(self, name).nbytes for name in COLUMNS) + self.children.nbytes
