"""The graph policy as a prefix-cache simulator for `replay` (the protocol is in `simulators`).

Provides `GraphCache(capacity_blocks, weights, admission=True)` with `process(blocks, sources) ->
hit_blocks`, the counters `evictions`, `declined`, `size`, and `graph` (the one-tier `KVCacheGraph` it
drives) with its `reuse` (`ReuseStats`).

Every per-block counter (hits, chain_hits, branches, run, reuse class, lifetimes and ghosts, reuse
distances and loops, leaf status) is the graph's: each request notifies `on_hit` / `on_store` /
`on_decline` / `on_remove` under a request id of its own, exactly as the tier manager does, so the block
this simulator evicts is the one `GraphEvictionAdvisor` ranks first on the same history, and the blocks it
declines are the ones the advisor's `admission` declines (tests/graph/test_graph_live_vs_replay.py).

Admission: when the cache is full, a missing block is scored as if stored (`BlockCounters.offer`) against
the block that storing it would evict; if `BlockCounters.decline_reason` says no, it is not stored, and
neither is the rest of the request's missing blocks (useless without their prefix).

Mode (`tiercache.graph.arc`): each request is first given to the graph's shadow ARC (`on_request`); while
the graph follows ARC (`graph.mode == "arc"`), the victim is the first leaf the shadow ARC dropped
(`KVCacheGraph.arc_victims`), the graph's own choice when there is none, and nothing is declined.

What it keeps on top is the victim index, which makes an eviction O(log N) instead of a full ranking:
- each reuse class has a heap of its leaves ranked by recency, keyed by their priority without the reuse
  term (`scoring.priority` with `reuse_p` = 1 and the capacity as horizon: the cache is full whenever it
  evicts), which is the same for the whole class; an eviction compares the heads of the classes with the
  reuse term of the moment added (`scoring.reuse_terms`), so learning never reorders a heap;
- each reuse-distance bucket has a heap of its leaves ranked by their loop, keyed by `scoring.loop_key`;
  the part that moves with the clocks (`scoring.loop_shift`) is the same for the whole bucket and added
  when the heads are compared; a timer heap moves a loop block to its class heap when it becomes overdue.
A heap entry is current while the block's `seq` (its last access) is the one it was pushed with and the
block is a leaf (and, for a loop entry, not overdue); a class's head and rank are cached until its heap,
its reuse counters or the request (the pinned blocks) change.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Sequence

import numpy as np

from tiercache.graph import scoring
from tiercache.graph.kvgraph import KVCacheGraph
from tiercache.graph.reuse import N_CLASSES, ReuseStats
from tiercache.graph.scoring import GAP_VALUES, SOURCES, ScoreWeights

TIER = "cache"
_ALL = frozenset(range(N_CLASSES))


class GraphCache:
    """Leaves of the prefix tree only, lowest priority first (ties: the earlier access)."""

    def __init__(self, capacity_blocks: int, weights: ScoreWeights | None = None, admission: bool = True):
        self.capacity = capacity_blocks
        self.admission = admission
        self.graph = KVCacheGraph(tiers=(TIER,), weights=weights)
        self.weights = self.graph.weights
        self.evictions = self.declined = 0
        self._requests = 0  # request ids: every request of a replay is a new one
        self._heaps: list[list[tuple[float, int, Hashable]]] = [[] for _ in range(N_CLASSES)]
        self._rank: dict[int, tuple[float, int, Hashable, int]] = {}  # class → (priority, seq, block, class)
        self._dirty: set[int] = set()  # classes whose cached head may be out of date
        self._halvings = 0
        self._loops: dict[int, list[tuple[float, int, Hashable, float]]] = {}  # bucket → (key, seq, b, vt)
        self._loop_head: dict[int, tuple[float, int, Hashable, float] | None] = {}
        self._loop_dirty: set[int] = set()
        self._timers: list[tuple[float, int, Hashable]] = []  # (overdue after this vt, seq, block)
        self._arc_evicted = False  # cached heads may be stale (an ARC-mode eviction since)

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
        g.on_request(blocks)
        self._requests += 1
        request = self._requests
        for b in blocks:
            if b in g:
                g.on_hit(b, request)
                self._indexed(b)
        pinned = set(blocks)
        self._dirty = set(_ALL)  # the pinned blocks changed
        self._loop_dirty = set(self._loops)
        declined = False
        for i, b in enumerate(blocks):
            if b in g:
                continue
            parent = blocks[i - 1] if i else None
            while not declined and len(g) >= self.capacity:
                victim = self._victim(pinned)
                arc = g.mode == "arc"  # following the shadow ARC: no admission control
                if self.admission and not arc and self._declines(b, parent, sources[i], victim[0]):
                    g.bet(b, victim[2])  # settled by which of the two is requested first
                    declined = g.modes.admit  # admission declines while its bets prove it right
                if not declined:
                    self._evict(victim)
            if declined:
                self._decline(b, parent)
                continue
            ghost = g.reuse.ghost(b, len(g))
            if ghost is not None:  # its return is credited to the class it was evicted in, its loop's
                self._dirty.add(ghost.code)
                self._loop_dirty.add(ghost.bucket)
            g.on_store(b, parent, request, tier=TIER, source=SOURCES[sources[i]])
            self._dirty.add(g.class_of(b))  # a lifetime opened in its class (even ranked by its loop)
            self._indexed(b)  # its parent (in this request: pinned) is no leaf now; the heap drops it lazily
        return hit

    # --- admission -----------------------------------------------------------------------------------
    def _declines(self, b: Hashable, parent: Hashable | None, source: int, frontier: float) -> bool:
        g = self.graph
        offer = g.offer(b, parent, self.capacity, g.tier_ticks[0], g.vt, source)
        return g.decline_reason(offer, frontier) is not None

    def _decline(self, b: Hashable, parent: Hashable | None) -> None:
        g = self.graph
        ghost = g.reuse.ghost(b, len(g))
        if ghost is not None:
            self._dirty.add(ghost.code)
            self._loop_dirty.add(ghost.bucket)
        self._dirty.add(g.on_decline(b, parent))  # a lifetime opened (and ended) in its class
        self.declined += 1

    # --- the victim index ----------------------------------------------------------------------------
    def _indexed(self, b: Hashable) -> None:
        """`b` was stored or hit, or became a leaf: push it if it is a leaf; its heap's head may change.
        (A hit block that is no leaf needs no push, and process() marks every heap dirty after hits.)"""
        g = self.graph
        if not g.is_evictable(b, TIER):
            return
        loop = g.loop_rank_key(b, self.capacity)
        if loop is None:
            code, key, seq = g.rank_key(b, self.capacity)
            heapq.heappush(self._heaps[code], (key, seq, b))
            self._dirty.add(code)
            return
        bucket, key, seq, overdue = loop
        heapq.heappush(self._loops.setdefault(bucket, []), (key, seq, b, overdue))
        heapq.heappush(self._timers, (overdue, seq, b))
        self._loop_dirty.add(bucket)

    def _head(self, heap: list, pinned: set[Hashable], vt: int = 0) -> tuple | None:
        """The heap's lowest entry that is a current leaf outside `pinned` (stale entries dropped)."""
        evictable_seq = self.graph.evictable_seq
        skipped, found = [], None
        while heap:
            item = heap[0]
            b = item[2]
            if evictable_seq(b, TIER) != item[1] or (len(item) == 4 and item[3] < vt):
                heapq.heappop(heap)  # stale, overdue, or no leaf now (pushed again when it becomes one)
            elif b in pinned:
                skipped.append(heapq.heappop(heap))
            else:
                found = item
                break
        for item in skipped:
            heapq.heappush(heap, item)
        return found

    def _arc_victim(self, pinned: set[Hashable]) -> tuple[float, int, Hashable, int] | None:
        """The first evictable leaf the shadow ARC dropped (`KVCacheGraph.arc_victims`) outside `pinned`."""
        g = self.graph
        for b in g.arc_victims(TIER):
            if b not in pinned:
                return 0.0, g.table.seq.item(g._slot[b]), b, -1 - len(GAP_VALUES)
        return None

    def _victim(self, pinned: set[Hashable]) -> tuple[float, int, Hashable, int]:
        """(priority, seq, block, heap: class code, or -1 - bucket for a loop heap) of the lowest leaf;
        following the shadow ARC (mode "arc"), the first leaf it dropped, if any."""
        g = self.graph
        if g.mode == "arc":
            found = self._arc_victim(pinned)
            if found is not None:
                return found
        if self._arc_evicted:
            self._arc_evicted = False
            self._dirty = set(_ALL)
            self._loop_dirty = set(self._loops)
        vt = g.vt
        while self._timers and self._timers[0][0] < vt:  # overdue: ranked by recency again
            _, seq, b = heapq.heappop(self._timers)
            if g.evictable_seq(b, TIER) == seq:
                self._indexed(b)
        if g.reuse.halvings != self._halvings:  # every class's counters changed
            self._halvings = g.reuse.halvings
            self._dirty = set(_ALL)
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
        for bucket in self._loop_dirty:
            if bucket in self._loops:
                self._loop_head[bucket] = self._head(self._loops[bucket], pinned, vt)
        self._loop_dirty.clear()
        best = min(self._rank.values(), default=None)
        heads = []
        for bucket, item in self._loop_head.items():
            if item is not None and item[3] < vt:  # became overdue since its head was taken
                item = self._loop_head[bucket] = self._head(self._loops[bucket], pinned, vt)
            if item is not None:
                heads.append((bucket, item))
        if heads:
            w, now_tick, cap = self.weights, g.tier_ticks[0], self.capacity
            ps = np.array([g.reuse.loop_probability(bucket) for bucket, _ in heads])
            for (bucket, item), term in zip(heads, scoring.reuse_terms(w, ps).tolist(), strict=True):
                # the same operations as the advisor's: (loop_shift + key) + horizon · reuse term
                shift = scoring.loop_shift(w, cap, now_tick, vt, GAP_VALUES[bucket])
                rank = ((shift + item[0]) + cap * term, item[1], item[2], -1 - bucket)
                if best is None or rank < best:
                    best = rank
        assert best is not None, "a full cache with no evictable block outside the request"
        return best

    def _evict(self, victim: tuple[float, int, Hashable, int]) -> None:
        g = self.graph
        _, _, b, heap = victim
        if heap >= 0:
            self._dirty.add(heap)
        elif heap > -1 - len(GAP_VALUES):
            self._loop_dirty.add(-1 - heap)
        else:  # an ARC-mode victim: any class's or loop's cached head may be this block
            self._arc_evicted = True
        parent = g.parent_of(b)
        g.on_remove(b)
        self.evictions += 1
        if parent is not None and g.is_evictable(parent, TIER):
            self._indexed(parent)  # a leaf again, its counters as at its last access
