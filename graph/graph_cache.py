"""The graph policy as a prefix-cache simulator for `replay` (the protocol is in `simulators`).

Provides `GraphCache(capacity_blocks, weights)` with `process(blocks, sources) -> hit_blocks` and the
counters `evictions`, `size`, `reuse` (the learned `ReuseStats`).

It keeps the same counters as `KVCacheGraph` and updates them in the same order, so the block it evicts is
the one `GraphEvictionAdvisor` ranks first on the same history (tests/graph/test_graph_live_vs_replay.py).
Candidates are leaves only. Each reuse class has a heap of its leaves keyed by their priority without the
reuse term, which is the same for the whole class; an eviction compares the heads of the classes with the
reuse term of the moment added, so learning a new reuse probability never reorders a heap. A class's head
and rank are cached until its heap, its counters or the request (the pinned blocks) change.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Sequence

import numpy as np

from tiercache.graph import scoring
from tiercache.graph.reuse import N_CLASSES, ReuseStats, reuse_class
from tiercache.graph.scoring import ScoreWeights


class GraphCache:
    """Leaves of the prefix tree only, lowest `scoring.priority` first (ties: the earlier access)."""

    def __init__(self, capacity_blocks: int, weights: ScoreWeights | None = None) -> None:
        self.capacity = capacity_blocks
        self.weights = weights or ScoreWeights()
        self.reuse = ReuseStats(self.weights.reuse_window)
        self.evictions = 0
        self.tick = 0
        self._parent: dict[Hashable, Hashable | None] = {}
        self._children: dict[Hashable, int] = {}
        self._hits: dict[Hashable, int] = {}
        self._chain: dict[Hashable, float] = {}
        self._branches: dict[Hashable, int] = {}
        self._branches_hit: dict[Hashable, int] = {}
        self._source: dict[Hashable, int] = {}
        self._run: dict[Hashable, int] = {}
        self._class: dict[Hashable, int] = {}
        self._key: dict[Hashable, float] = {}  # priority without the reuse term
        self._seq: dict[Hashable, int] = {}
        self._heaps: list[list[tuple[float, int, Hashable]]] = [[] for _ in range(N_CLASSES)]
        self._counter = 0
        self._rank: dict[int, tuple[float, int, Hashable]] = {}  # class → (priority, seq, block) of its head
        self._dirty: set[int] = set()  # classes whose cached head may be out of date
        self._halvings = 0

    @property
    def size(self) -> int:
        return len(self._parent)

    def __contains__(self, block: Hashable) -> bool:
        return block in self._parent

    def process(self, blocks: Sequence[Hashable], sources: Sequence[int]) -> int:
        blocks = blocks[: self.capacity]
        hit = 0
        while hit < len(blocks) and blocks[hit] in self._parent:
            hit += 1
        for b in blocks:
            if b in self._parent:  # a hit by a new request (every request of a replay is new)
                self.reuse.reused(self._class[b])
                self._hits[b] += 1
                parent = self._parent[b]
                if self._hits[b] == 1 and parent is not None:
                    self._branches_hit[parent] = self._branches_hit.get(parent, 0) + 1
                self._chain[b] = max(self._chain[b], self._hits[b], self._inherited(parent))
                self._start_lifetime(b)
        pinned = set(blocks)
        self._dirty = set(range(N_CLASSES))  # the pinned blocks changed
        for i, b in enumerate(blocks):
            if b in self._parent:
                continue
            while len(self._parent) >= self.capacity:
                self._evict_one(pinned)
            self._insert(b, blocks[i - 1] if i else None, sources[i])
        return hit

    def _inherited(self, parent: Hashable | None) -> float:
        if parent is None:
            return 0.0
        if self._children[parent] > 1 or self.weights.is_protected(self._source[parent]):
            n = self._branches.get(parent, 0)
            return self._branches_hit.get(parent, 0) / n if n else 0.0
        return self._chain[parent]

    def _insert(self, b: Hashable, parent: Hashable | None, source: int) -> None:
        if parent is not None and parent not in self._parent:
            parent = None  # inconsistent trace (the parent was dropped while its child stayed): a root
        self._dirty.add(self.reuse.stored(b))
        self._parent[b] = parent
        self._children[b] = 0
        self._hits[b] = 0
        self._source[b] = source
        if parent is not None:
            self._children[parent] += 1
            self._branches[parent] = self._branches.get(parent, 0) + 1
            self._dirty.add(self._class[parent])  # no longer a leaf
        self._chain[b] = self._inherited(parent)
        self._run[b] = self._run[parent] + 1 if parent is not None and self._hits[parent] == 0 else 1
        self.tick += 1
        self._start_lifetime(b)

    def _start_lifetime(self, b: Hashable) -> None:
        parent = self._parent[b]
        opens_branch = (
            parent is None or self.weights.is_protected(self._source[parent]) or self._children[parent] > 1
        )
        code = reuse_class(self._chain[b], self._run[b], opens_branch)
        self._class[b] = code
        self.reuse.start(code)
        self._dirty.add(code)
        # requests = hits + 1: in a replay every access comes from a new request.
        key = scoring.priority(
            self.weights, self.tick, self.capacity, self._chain[b], self._hits[b] + 1, self._source[b]
        )
        self._key[b] = key
        self._counter += 1
        self._seq[b] = self._counter
        if not self._children[b]:
            heapq.heappush(self._heaps[code], (key, self._counter, b))

    def _head(self, heap: list, pinned: set[Hashable]) -> tuple[float, int, Hashable] | None:
        """The heap's lowest entry that is a current leaf outside `pinned` (stale entries dropped)."""
        skipped, found = [], None
        while heap:
            item = heap[0]
            b = item[2]
            if self._seq.get(b) != item[1] or self._children[b]:
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
        if self.reuse.halvings != self._halvings:  # every class's counters changed
            self._halvings = self.reuse.halvings
            self._dirty = set(range(N_CLASSES))
        self._dirty.discard(None)
        if self._dirty:
            codes = sorted(self._dirty)
            ps = np.array([self.reuse.probability(code) for code in codes])
            for code, term in zip(codes, scoring.reuse_terms(self.weights, ps).tolist(), strict=True):
                item = self._head(self._heaps[code], pinned) if self._heaps[code] else None
                if item is None:
                    self._rank.pop(code, None)
                else:  # the same operations as scoring.priority_array: key + horizon · reuse term
                    self._rank[code] = (item[0] + self.capacity * term, item[1], item[2])
            self._dirty.clear()
        _, _, victim = min(self._rank.values())  # (priority, seq): seqs are unique, blocks never compared
        parent = self._parent.pop(victim)
        code = self._class.pop(victim)
        for d in (self._children, self._hits, self._chain, self._source, self._run, self._key, self._seq):
            del d[victim]
        self._branches.pop(victim, None)
        self._branches_hit.pop(victim, None)
        self.reuse.evicted(victim, code, len(self._parent))
        self.evictions += 1
        self._dirty.add(code)
        if parent is not None:
            self._children[parent] -= 1
            if self._children[parent] == 0:
                p_class = self._class[parent]
                heapq.heappush(self._heaps[p_class], (self._key[parent], self._seq[parent], parent))
                self._dirty.add(p_class)
