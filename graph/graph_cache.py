"""The graph policy as a prefix-cache simulator for `replay` (the protocol is in `simulators`).

Provides `GraphCache(capacity_blocks, weights)` with `process(blocks, sources) -> hit_blocks`, the counters
`evictions`, `size`, and `graph` (the one-tier `KVCacheGraph` it drives) with its `reuse` (`ReuseStats`).

Every per-block counter (hits, chain_hits, branches, run, reuse class, lifetimes and ghosts, leaf status)
is the graph's: each request notifies `on_hit` / `on_store` / `on_remove` under a request id of its own,
exactly as the tier manager does, so the block this simulator evicts is the one `GraphEvictionAdvisor`
ranks first on the same history (tests/graph/test_graph_live_vs_replay.py). What it keeps on top is the
victim index, which makes an eviction O(log N) instead of a full ranking: each reuse class has a heap of
its leaves keyed by their priority without the reuse term (`scoring.priority` with `reuse_p` = 1 and the
capacity as horizon: the cache is full whenever it evicts), which is the same for the whole class; an
eviction compares the heads of the classes with the reuse term of the moment added
(`scoring.reuse_terms`), so learning a new reuse probability never reorders a heap. A heap entry is
current while the block's `seq` (its last access) is the one it was pushed with and the block is a leaf;
a class's head and rank are cached until its heap, its reuse counters or the request (the pinned blocks)
change.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Sequence

import numpy as np

from tiercache.graph import scoring
from tiercache.graph.kvgraph import KVCacheGraph
from tiercache.graph.reuse import N_CLASSES, ReuseStats
from tiercache.graph.scoring import SOURCES, ScoreWeights

TIER = "cache"


class GraphCache:
    """Leaves of the prefix tree only, lowest `scoring.priority` first (ties: the earlier access)."""

    def __init__(self, capacity_blocks: int, weights: ScoreWeights | None = None) -> None:
        self.capacity = capacity_blocks
        self.graph = KVCacheGraph(tiers=(TIER,), weights=weights)
        self.weights = self.graph.weights
        self.evictions = 0
        self._requests = 0  # request ids: every request of a replay is a new one
        self._heaps: list[list[tuple[float, int, Hashable]]] = [[] for _ in range(N_CLASSES)]
        self._rank: dict[int, tuple[float, int, Hashable, int]] = {}  # class → (priority, seq, block, class)
        self._dirty: set[int] = set()  # classes whose cached head may be out of date
        self._halvings = 0

    @property
    def size(self) -> int:
        return len(self.graph)

    @property
    def reuse(self) -> ReuseStats:
        return self.graph.reuse

    def __contains__(self, block: Hashable) -> bool:
        return block in self.graph

    def process(self, blocks: Sequence[Hashable], sources: Sequence[int]) -> int:
        """One request, a new one (the protocol is in `simulators`); returns its hit length in blocks."""
        g = self.graph
        blocks = blocks[: self.capacity]
        hit = 0
        while hit < len(blocks) and blocks[hit] in g:
            hit += 1
        self._requests += 1
        request = self._requests
        for b in blocks:
            if b in g:
                g.on_hit(b, request)
                self._indexed(b)
        pinned = set(blocks)
        self._dirty = set(range(N_CLASSES))  # the pinned blocks changed
        for i, b in enumerate(blocks):
            if b in g:
                continue
            while len(g) >= self.capacity:
                self._evict_one(pinned)
            ghost = g.reuse.ghosts.get(b)
            if ghost is not None:  # its return is credited to the class it was evicted in
                self._dirty.add(ghost)
            g.on_store(b, blocks[i - 1] if i else None, request, tier=TIER, source=SOURCES[sources[i]])
            self._indexed(b)  # its parent (in this request: pinned) is no leaf now; the heap drops it lazily
        return hit

    def _indexed(self, b: Hashable) -> None:
        """`b` was stored or hit, or became a leaf: push it if it is a leaf; its class's head may change.
        (A hit block that is no leaf needs no push, and process() marks every class dirty after hits.)"""
        g = self.graph
        if g.is_evictable(b, TIER):
            code, key, seq = g.rank_key(b, self.capacity)
            heapq.heappush(self._heaps[code], (key, seq, b))
            self._dirty.add(code)

    def _head(self, heap: list, pinned: set[Hashable]) -> tuple[float, int, Hashable] | None:
        """The heap's lowest entry that is a current leaf outside `pinned` (stale entries dropped)."""
        evictable_seq = self.graph.evictable_seq
        skipped, found = [], None
        while heap:
            item = heap[0]
            b = item[2]
            if evictable_seq(b, TIER) != item[1]:
                heapq.heappop(heap)  # stale entry, or no longer a leaf (pushed again when it becomes one)
            elif b in pinned:
                skipped.append(heapq.heappop(heap))
            else:
                found = item
                break
        for item in skipped:
            heapq.heappush(heap, item)
        return found

    def _evict_one(self, pinned: set[Hashable]) -> None:
        g = self.graph
        if g.reuse.halvings != self._halvings:  # every class's counters changed
            self._halvings = g.reuse.halvings
            self._dirty = set(range(N_CLASSES))
        if self._dirty:
            codes = sorted(self._dirty)
            ps = np.array([g.reuse.probability(code) for code in codes])
            for code, term in zip(codes, scoring.reuse_terms(self.weights, ps).tolist(), strict=True):
                item = self._head(self._heaps[code], pinned) if self._heaps[code] else None
                if item is None:
                    self._rank.pop(code, None)
                else:  # the same operations as scoring.priority_array: key + horizon · reuse term
                    self._rank[code] = (item[0] + self.capacity * term, item[1], item[2], code)
            self._dirty.clear()
        _, _, victim, code = min(self._rank.values())  # (priority, seq) decides: seqs are unique
        self._dirty.add(code)
        parent = g.parent_of(victim)
        g.on_remove(victim)
        self.evictions += 1
        if parent is not None and g.is_evictable(parent, TIER):
            self._indexed(parent)  # a leaf again, its counters as at its last access
