"""The graph advisor behind the manager's eviction seam (adapter; the advisor lives in tiercache.graph).

Provides:
    GraphPolicy(advisor)              EvictionPolicy: choose_victims asks advisor.choose_victims (snapshot, or
                                      its LRU fallback over the manager's candidates, recorded as such);
                                      decline (admission control) asks advisor.admission for each new block
                                      beyond the free room, and declines a block whose prefix block was
                                      declined (useless without it); observe() keeps the graph's tiers in
                                      step with the manager's events
    make_graph_policy(eviction_config) a KVCacheGraph + started GraphEvictionAdvisor wrapped in GraphPolicy;
                                      close() stops the advisor thread (TierManager.close() calls it)

Connector hints (called by the scheduler side before the events they explain):
    observe_request(request_id, block_hashes)   a request was admitted: graph.on_request (the shadow ARC the
                                       graph falls back to, tiercache.graph.arc); remembers each block's
                                       parent (the previous hash of its prefix chain) and request, for its
                                       StoreEvent, and attributes the HitEvents that follow to this request
    observe_step(block_hashes)         blocks loaded in the same step → on_step (co_attend edges)

Event → graph notification:
    StoreEvent(stored)                 on_store(hash, parent, request, tier) with the lineage remembered by
                                       observe_request (parent only when it is itself stored), unless the
                                       graph already has the block
    HitEvent                           on_hit(hash, request of the latest observe_request)
    MoveEvent "done"                   on_move(hash, tier_from, tier_to)
    EvictionEvent(to None), DropEvent, StoreEvent(not stored)   on_remove(hash) (its reuse class is kept
                                       as a ghost: stored again, the graph learns that it came back)
    DeclineEvent                       on_decline(hash, parent): a block request, and a ghost
Hits are left to the connector (graph.on_hit with the request id), since lookups repeat every step.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

from tiercache.scheduler.events import (
    DeclineEvent,
    DropEvent,
    EvictionEvent,
    HitEvent,
    MoveEvent,
    StoreEvent,
    TierEvent,
)
from tiercache.scheduler.policies.base import Candidates, DeclineDecision, EvictionPolicy, VictimDecision
from tiercache.wire import TIERS


class GraphPolicy(EvictionPolicy):
    name = "graph"

    MAX_LINEAGE = 1 << 20  # remembered (parent, request) of blocks not stored yet; oldest forgotten first

    def __init__(self, advisor) -> None:
        self.advisor = advisor
        self.graph = advisor.graph
        self._lineage: OrderedDict[bytes, tuple[bytes | None, str]] = OrderedDict()
        self._request: str | None = None

    def observe_request(self, request_id: str, block_hashes) -> None:
        self._request = request_id
        self.graph.on_request(block_hashes)  # the shadow ARC the graph falls back to sees every request
        parent = None
        for block_hash in block_hashes:
            if block_hash not in self.graph and block_hash not in self._lineage:
                self._lineage[block_hash] = (parent, request_id)
            parent = block_hash
        while len(self._lineage) > self.MAX_LINEAGE:
            self._lineage.popitem(last=False)

    def observe_step(self, block_hashes) -> None:
        self.graph.on_step(block_hashes)

    def choose_victims(self, tier: str, n: int, candidates: Candidates) -> list[VictimDecision]:
        decisions = self.advisor.choose_victims(n, tier, candidates_lru_order=iter(candidates))
        return [
            VictimDecision(
                d.block_hash,
                d.reason,
                d.score,
                _components(d.components),
                d.policy_used,
                d.snapshot_age_s,
            )
            for d in decisions
        ]

    def decline(self, tier: str, hashes, room: int, candidates: Candidates) -> list[DeclineDecision]:
        """Admission control: a block whose prefix block is declined (now or lately) and not stored; and,
        beyond the first `room` blocks, one the advisor's admission declines (scored against the snapshot)."""
        graph, out, stored = self.graph, [], set()
        frontiers, frontier, spared = self.advisor.frontier_blocks(tier, candidates), None, None
        for i, h in enumerate(hashes):
            parent = self._lineage.get(h, (None, None))[0]
            why = None
            if parent is not None and parent not in graph and parent not in stored:
                why = f"not stored: its prefix block {_short(parent)} is not stored, so no lookup reaches it"
            elif parent is not None and parent in graph and graph.is_orphan(parent):
                why = f"not stored: its prefix block {_short(parent)} is unreachable (a hole above it)"
            if why is not None:
                out.append(DeclineDecision(h, why, policy=self.name))
                continue
            stored.add(h)
            if i < room:
                continue
            if frontier is None:  # the block the next one stored would evict
                spared, frontier = next(frontiers, (None, None))
            d = self.advisor.judge(h, parent, tier, frontier, frontier_block=spared)
            if d is None:
                frontier = None  # stored: it evicts that one
                continue
            comp = _components(d.components)
            if d.frontier is not None:  # the priority of the block storing it would have evicted
                comp = (*comp, ("frontier", d.frontier))
            out.append(DeclineDecision(h, d.reason, d.score, comp, self.name, d.snapshot_age_s))
            stored.discard(h)
        return out

    def observe(self, event: TierEvent) -> None:
        graph, h = self.graph, event.block_hash
        if isinstance(event, DeclineEvent):
            parent, _ = self._lineage.pop(h, (None, None))
            graph.on_decline(h, parent)
        elif isinstance(event, StoreEvent):
            parent, request = self._lineage.pop(h, (None, None))
            if event.stored and h not in graph:  # under a parent not stored: an orphan (see the graph)
                graph.on_store(h, parent_hash=parent, request_id=request, tier=event.tier)
            elif not event.stored:
                graph.on_remove(h)
        elif isinstance(event, HitEvent) and h in graph:
            graph.on_hit(h, self._request)
        elif isinstance(event, MoveEvent) and event.stage == "done" and h in graph:
            if graph.tier_of(h) == event.tier_from:
                graph.on_move(h, event.tier_from, event.tier_to)
        elif (isinstance(event, EvictionEvent) and event.tier_to is None) or isinstance(event, DropEvent):
            graph.on_remove(h)

    def close(self) -> None:
        self.advisor.stop()


def make_graph_policy(eviction_config) -> GraphPolicy:
    from tiercache.graph import GraphEvictionAdvisor, KVCacheGraph

    advisor = GraphEvictionAdvisor(
        KVCacheGraph(tiers=TIERS),
        interval_s=eviction_config.advisor_interval,
        max_stale_s=eviction_config.max_stale,
    )
    advisor.start()
    return GraphPolicy(advisor)


def _short(block_hash) -> str:
    return block_hash.hex()[:16] if isinstance(block_hash, bytes) else repr(block_hash)


def _components(components) -> tuple[tuple[str, float], ...]:
    if components is None:
        return ()
    return tuple((k, float(v)) for k, v in dataclasses.asdict(components).items())
