"""Prefix-cache simulators for `replay`: LRU, ARC and the graph policy, all on the same request protocol.

Provides `LRUCache` (over `tiercache.scheduler.recency.RecencyOrder`, the recency order the tier index keeps
too), `ARCCache` (its own T1/T2/B1/B2 lists: they are ARC's algorithm), `GraphCache` (from `graph_cache`: a
one-tier `KVCacheGraph`) and `make_cache(policy, capacity_blocks, weights)`, each with
`process(blocks, sources) -> hit_blocks` and the counters `evictions`, `size`.

The protocol, identical for the three (so they differ only in whom they evict):
- Capacity is a number of blocks; a block is one cache entry whatever its tokens.
- A request is a list of block hashes in prefix order. Its hit length is the longest prefix whose blocks are
  all cached when the request arrives (block i without block i−1 is useless to a prefix cache).
- Then every block of the request is accessed: cached ones are touched, missing ones are inserted, and each
  insertion into a full cache evicts one block that is not part of the current request. Only the first
  `capacity` blocks of a request longer than the cache are cached.
- Recency order after a request puts its first block most recent (vLLM frees a request's blocks tail
  first), so LRU and ARC also tend to drop leaves before their parents; the graph policy enforces it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence

from tiercache.graph.graph_cache import GraphCache
from tiercache.graph.scoring import ScoreWeights
from tiercache.scheduler.recency import RecencyOrder


def _hit_length(blocks: Sequence[Hashable], cached) -> int:
    n = 0
    for b in blocks:
        if b not in cached:
            break
        n += 1
    return n


class LRUCache:
    """Least recently used over blocks, in the project's one recency structure (`RecencyOrder`)."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity = capacity_blocks
        self.evictions = 0
        self._order = RecencyOrder()

    @property
    def size(self) -> int:
        return len(self._order)

    def __contains__(self, block: Hashable) -> bool:
        return block in self._order

    def process(self, blocks: Sequence[Hashable], sources: Sequence[int]) -> int:
        order = self._order
        blocks = blocks[: self.capacity]
        hit = _hit_length(blocks, order)
        for b in reversed(blocks):  # touch first: the request's own blocks leave the LRU end
            if b in order:
                order.touch(b)
        for b in reversed(blocks):
            if b not in order:
                if len(order) >= self.capacity:
                    order.pop_oldest()
                    self.evictions += 1
                order.add(b)
        for b in reversed(blocks):
            order.touch(b)
        return hit


class ARCCache:
    """Adaptive Replacement Cache (Megiddo & Modha, FAST 2003) over blocks, with ghost lists B1/B2."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity = capacity_blocks
        self.evictions = 0
        self.p = 0.0
        self.t1: OrderedDict[Hashable, None] = OrderedDict()
        self.t2: OrderedDict[Hashable, None] = OrderedDict()
        self.b1: OrderedDict[Hashable, None] = OrderedDict()
        self.b2: OrderedDict[Hashable, None] = OrderedDict()
        self._pinned: set[Hashable] = set()

    @property
    def size(self) -> int:
        return len(self.t1) + len(self.t2)

    def __contains__(self, block: Hashable) -> bool:
        return block in self.t1 or block in self.t2

    def process(self, blocks: Sequence[Hashable], sources: Sequence[int]) -> int:
        blocks = blocks[: self.capacity]
        hit = _hit_length(blocks, self)
        self._pinned = set(blocks)
        for b in reversed(blocks):
            if b in self:
                self._access(b)
        for b in reversed(blocks):
            if b not in self:
                self._access(b)
        for b in reversed(blocks):
            (self.t1 if b in self.t1 else self.t2).move_to_end(b)
        self._pinned = set()
        return hit

    def _access(self, x: Hashable) -> None:
        c, t1, t2, b1, b2 = self.capacity, self.t1, self.t2, self.b1, self.b2
        if x in t1:
            del t1[x]
            t2[x] = None
        elif x in t2:
            t2.move_to_end(x)
        elif x in b1:
            self.p = min(float(c), self.p + max(len(b2) / len(b1), 1.0))
            self._replace(in_b2=False)
            del b1[x]
            t2[x] = None
        elif x in b2:
            self.p = max(0.0, self.p - max(len(b1) / len(b2), 1.0))
            self._replace(in_b2=True)
            del b2[x]
            t2[x] = None
        else:
            l1 = len(t1) + len(b1)
            if l1 >= c:
                if len(t1) < c:
                    b1.popitem(last=False)
                    self._replace(in_b2=False)
                else:
                    self._evict_from(t1, ghost=None)
            elif l1 + len(t2) + len(b2) >= c:
                if l1 + len(t2) + len(b2) >= 2 * c:
                    b2.popitem(last=False)
                self._replace(in_b2=False)
            t1[x] = None

    def _replace(self, in_b2: bool) -> None:
        if len(self.t1) + len(self.t2) < self.capacity:
            return
        t1_first = len(self.t1) > 0 and (len(self.t1) > self.p or (in_b2 and len(self.t1) == self.p))
        first, second = (self.t1, self.t2) if t1_first else (self.t2, self.t1)
        if not self._evict_from(first, ghost=self.b1 if t1_first else self.b2):
            self._evict_from(second, ghost=self.b2 if t1_first else self.b1)

    def _evict_from(self, lst: OrderedDict, ghost: OrderedDict | None) -> bool:
        for b in lst:  # the LRU end, skipping the current request's blocks
            if b not in self._pinned:
                del lst[b]
                if ghost is not None:
                    ghost[b] = None
                self.evictions += 1
                return True
        return False


def make_cache(policy: str, capacity_blocks: int, weights: ScoreWeights | None = None):
    """A simulator for `policy` ("graph" | "lru" | "arc")."""
    if policy == "lru":
        return LRUCache(capacity_blocks)
    if policy == "arc":
        return ARCCache(capacity_blocks)
    if policy == "graph":
        return GraphCache(capacity_blocks, weights)
    raise ValueError(f"unknown policy {policy!r}; valid: 'graph', 'lru', 'arc'")
