"""The graph policy replayed as it runs live: the advisor ranks on its own schedule in the trace's time, and
evictions and admission read its last published snapshot, not a ranking taken before each eviction.

Provides `timed_replay(requests, timestamps_s, capacity_blocks, ...) -> ReplayResult` (policy
"graph-live"). `replay(policy="graph")` ranks before every eviction (the advisor's first choice on the
history so far); this one drives `KVCacheGraph` + `GraphEvictionAdvisor` as the tier manager does:

- the cache protocol is `simulators`' (capacity in blocks, full-prefix hits, a request's own blocks are
  never evicted); the manager's recency order (a `RecencyOrder`, least recently used first) is what the
  advisor falls back to for blocks its snapshot does not rank (stored since it was taken);
- a request at time T uses the snapshot of the last cycle that ended by T. A cycle starts once the graph
  has changed since the previous cycle (every request changes it) and the rest after the previous cycle
  is over: `cadence.rest_after(d, interval_s)` after it ended, `d` being the cycle's duration (measured
  with `time.perf_counter`, or `cycle_s` when given, for a deterministic run), and publishes `d` later.
  The graph changes only when a request arrives, so the snapshot such a cycle publishes is the state after
  the previous request: requests closer together than a cycle and its rest share one snapshot, as live;
- each request is first given to the graph's shadow ARC (`on_request`, as `GraphPolicy.observe_request`
  does live), which decides whether the cache follows the graph's ranking or ARC (`tiercache.graph.arc`);
- admission and eviction per missing block are `GraphEvictionAdvisor.admission` and `choose_victims`
  (the snapshot's frontier and ranking, then LRU for what it does not rank), the declined block and the
  rest of its request are not stored (`on_decline`), as `GraphPolicy.decline` does. A victim is the
  snapshot's lowest-ranked evictable block outside the request (a manager asked for one victim might be
  handed one of the request's own blocks, ignore it and fill with LRU; this replay looks past them).
`max_stale_s` is the advisor's: a snapshot older than that is not used (LRU fallback, everything stored).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence

from tiercache.graph.advisor import GraphEvictionAdvisor
from tiercache.graph.cadence import MIN_GAP_S, rest_after
from tiercache.graph.kvgraph import KVCacheGraph
from tiercache.graph.replay import ReplayResult, split_request
from tiercache.graph.scoring import SOURCES, ScoreWeights
from tiercache.scheduler.recency import RecencyOrder

TIER = "cache"


class _Clock:
    """The trace's time, in seconds: what the graph and the advisor read as `clock()`."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Unpinned:
    """The manager's candidates: stored blocks outside the current request, least recently used first."""

    def __init__(self, order: RecencyOrder, pinned: set[Hashable]) -> None:
        self.order, self.pinned = order, pinned

    def __contains__(self, block: object) -> bool:
        return block not in self.pinned and block in self.order

    def __iter__(self):
        return (b for b in self.order if b not in self.pinned)


def timed_replay(
    requests: Iterable[Sequence],
    timestamps_s: Iterable[float],
    capacity_blocks: int,
    weights: ScoreWeights | None = None,
    interval_s: float = 0.5,
    max_stale_s: float = 2.0,
    cycle_s: float | None = None,
) -> ReplayResult:
    """Hits of the graph policy on `requests` (as `replay` takes them) arriving at `timestamps_s`
    (non-decreasing seconds), its advisor cycling as it does live (defaults: `EvictionConfig`'s)."""
    if capacity_blocks < 1:
        raise ValueError(f"capacity_blocks must be >= 1, got {capacity_blocks}")
    clock = _Clock()
    g = KVCacheGraph(tiers=(TIER,), clock=clock, weights=weights)
    adv = GraphEvictionAdvisor(g, interval_s=interval_s, max_stale_s=max_stale_s, clock=clock)
    order = RecencyOrder()
    ready, d_est = 0.0, cycle_s or 0.0  # when the next cycle may start; how long one takes
    n_req = n_blocks = n_hit = n_req_hit = evictions = 0
    for rid, (request, now) in enumerate(zip(requests, timestamps_s, strict=True)):
        if rid and now < clock.now:
            raise ValueError(f"timestamps must not decrease: request {rid} at {now}s after {clock.now}s")
        if rid:  # the last request changed the graph: seen at the next poll (half a gap later, on average)
            start = max(ready, clock.now + MIN_GAP_S / 2)
            if start + d_est <= now:  # that cycle published before this request (its length: the last's)
                idle = int((now - d_est - start) // (d_est + interval_s))  # unchanged: every interval
                clock.now = start + idle * (d_est + interval_s)
                measured = adv.refresh().cycle_s
                d_est = measured if cycle_s is None else cycle_s
                ready = clock.now + d_est + rest_after(d_est, interval_s)
        clock.now = now
        blocks, sources = split_request(request)
        n_blocks += len(blocks)  # as `replay` counts: a request longer than the cache misses its tail
        blocks, sources = blocks[:capacity_blocks], sources[:capacity_blocks]
        hit = 0
        while hit < len(blocks) and blocks[hit] in g:
            hit += 1
        n_req, n_hit = n_req + 1, n_hit + hit
        n_req_hit += hit > 0
        g.on_request(blocks)
        for b in blocks:
            if b in g:
                g.on_hit(b, rid)
        evictions += _store_missing(g, adv, order, blocks, sources, rid, capacity_blocks)
        for b in reversed(blocks):  # the request's first block most recent, as `simulators` orders it
            if b in g:
                order.add(b)
    return ReplayResult("graph-live", capacity_blocks, n_req, n_blocks, n_hit, evictions, n_req_hit)


def _store_missing(
    g: KVCacheGraph,
    adv: GraphEvictionAdvisor,
    order: RecencyOrder,
    blocks: list[Hashable],
    sources: list[int],
    rid: int,
    capacity: int,
) -> int:
    """Store the request's missing blocks in prefix order, each admitted (or not) and making room as the
    manager does: the advisor's admission, then its first choice of victim outside the request. Returns
    the evictions."""
    pinned, declined, evictions = set(blocks), False, 0
    candidates = _Unpinned(order, pinned)
    for i, b in enumerate(blocks):
        if b in g:
            continue
        parent = blocks[i - 1] if i else None
        if not declined and len(g) >= capacity:
            declined = adv.admission(b, parent, TIER, candidates, sources[i]) is not None
            if not declined:
                victim = _victim(g, adv, candidates)
                g.on_remove(victim)
                order.discard(victim)
                evictions += 1
        if declined:
            g.on_decline(b, parent)
            continue
        g.on_store(b, parent, rid, tier=TIER, source=SOURCES[sources[i]])
        order.add(b)
    return evictions


def _victim(g: KVCacheGraph, adv: GraphEvictionAdvisor, candidates: _Unpinned) -> Hashable:
    """`choose_victims`' first pick outside the request: the snapshot's lowest-ranked evictable block when
    the snapshot is fresh, else (or when it ranks none) the least recently used evictable block."""
    age = adv.snapshot_age()
    if age is not None and age <= adv.max_stale_s:
        for b in adv.suggest_eviction(len(candidates.pinned) + 1, TIER):
            if b not in candidates.pinned:
                return b
    return next(b for b in candidates if g.is_evictable(b, TIER))
