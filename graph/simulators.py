"""Prefix-cache simulators for `replay`: LRU, ARC and the graph policy, all on the same request protocol.

Provides `LRUCache` (over `tiercache.scheduler.recency.RecencyOrder`, the recency order the tier index keeps
too), `ARCCache` (`arc.py`: its own T1/T2/B1/B2 lists, ARC's algorithm; the graph's shadow ARC is one),
`GraphCache` (from `graph_cache`: a one-tier `KVCacheGraph`) and `make_cache(policy, capacity_blocks,
weights)`, each with `process(blocks, sources) -> hit_blocks` and the counters `evictions`, `size`.

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

from collections.abc import Hashable, Sequence

from tiercache.graph.arc import ARCCache, prefix_hit
from tiercache.graph.graph_cache import GraphCache
from tiercache.graph.scoring import ScoreWeights
from tiercache.scheduler.recency import RecencyOrder


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
        hit = prefix_hit(blocks, order)
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


def make_cache(policy: str, capacity_blocks: int, weights: ScoreWeights | None = None):
    """A simulator for `policy` ("graph" | "lru" | "arc")."""
    if policy == "lru":
        return LRUCache(capacity_blocks)
    if policy == "arc":
        return ARCCache(capacity_blocks)
    if policy == "graph":
        return GraphCache(capacity_blocks, weights)
    raise ValueError(f"unknown policy {policy!r}; valid: 'graph', 'lru', 'arc'")
