"""The offline bound beside `replay`: Belady's rule (evict the block requested again farthest in the future)
under the replay's protocol, with admission: a block requested again later than every block it could
replace is not stored, and neither is the rest of its request's new blocks (a prefix cache cannot use a
block without its prefix), as the graph policy's admission control may decline them.

Provides `offline_bound(requests, capacity_blocks, admission=True) -> ReplayResult` (policy "offline").

It reads the whole trace first (the next request of every block), so it is a bound to compare with, not a
policy. Deeper blocks of a chain are never requested again before their prefix, so evicting the farthest
first (ties: the deeper block) keeps what stays cached prefix-closed. `admission=False` stores every block,
as LRU and ARC do.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable, Sequence

from tiercache.graph.replay import ReplayResult, split_request


def offline_bound(requests: Iterable[Sequence], capacity_blocks: int, admission: bool = True) -> ReplayResult:
    """Hits of Belady's farthest-next-use rule on `requests` (as `replay` takes them) at this capacity."""
    if capacity_blocks < 1:
        raise ValueError(f"capacity_blocks must be >= 1, got {capacity_blocks}")
    full = [split_request(r)[0] for r in requests]
    trace = [blocks[:capacity_blocks] for blocks in full]
    nexts = _next_uses(trace)
    cached: dict[Hashable, int] = {}  # block → its next request (len(trace): never)
    heap: list[tuple[int, int, Hashable]] = []  # (-next, -depth, block); stale entries skipped lazily
    n_hit = n_req_hit = evictions = 0
    for i, blocks in enumerate(trace):
        hit = 0
        while hit < len(blocks) and blocks[hit] in cached:
            hit += 1
        n_hit += hit
        n_req_hit += hit > 0
        pinned, declined = set(blocks), False
        for j, b in enumerate(blocks):
            nxt = nexts[i][j]
            if b not in cached:
                if declined:
                    continue
                if len(cached) >= capacity_blocks:
                    far = _farthest(heap, cached, pinned)
                    if admission and -far[0] <= nxt:
                        declined = True  # b would be the next to go: it is not stored, nor its suffix
                        continue
                    del cached[far[2]]  # its heap entry is stale now
                    evictions += 1
            cached[b] = nxt
            heapq.heappush(heap, (-nxt, -j, b))
    n_blocks = sum(len(blocks) for blocks in full)
    return ReplayResult("offline", capacity_blocks, len(trace), n_blocks, n_hit, evictions, n_req_hit)


def _next_uses(trace: list[list[Hashable]]) -> list[list[int]]:
    never = len(trace)
    nexts: list[list[int]] = [[] for _ in trace]
    last: dict[Hashable, int] = {}
    for i in range(len(trace) - 1, -1, -1):
        nexts[i] = [last.get(b, never) for b in trace[i]]
        for b in trace[i]:
            last[b] = i
    return nexts


def _farthest(heap: list, cached: dict, pinned: set) -> tuple[int, int, Hashable]:
    """The current entry with the farthest next use outside `pinned` (stale entries dropped on the way)."""
    skipped = []
    while True:
        item = heap[0]
        if cached.get(item[2]) != -item[0]:
            heapq.heappop(heap)  # stale: the block was used again (a newer entry exists) or is gone
        elif item[2] in pinned:
            skipped.append(heapq.heappop(heap))
        else:
            break
    for it in skipped:
        heapq.heappush(heap, it)
    return item
