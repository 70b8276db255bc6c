"""The graph advisor behind the manager's eviction seam (adapter; the advisor lives in tiercache.graph).

Provides:
    GraphPolicy(advisor)              EvictionPolicy: choose_victims asks advisor.choose_victims (snapshot, or
                                      its LRU fallback over the manager's candidates, recorded as such);
                                      observe() keeps the graph's tiers in step with the manager's events
    make_graph_policy(eviction_config) a KVCacheGraph + started GraphEvictionAdvisor wrapped in GraphPolicy;
                                      close() stops the advisor thread (TierManager.close() calls it)

Event → graph notification:
    StoreEvent(stored)                 on_store(hash, tier) unless the graph already has it (the connector
                                       should call graph.on_store with parent, request, span and source
                                       first, at prepare_store time; this only fills in what it missed)
    SpillEvent / WarmEvent "done"      on_move(hash, from, to)
    EvictionEvent(to None), DropEvent, StoreEvent(not stored)   on_remove(hash)
Hits are left to the connector (graph.on_hit with the request id), since lookups repeat every step.
"""

from __future__ import annotations

import dataclasses

from tiercache.events import (
    DRAM,
    VRAM,
    DropEvent,
    EvictionEvent,
    SpillEvent,
    StoreEvent,
    TierEvent,
    WarmEvent,
)
from tiercache.policy import Candidates, EvictionPolicy, VictimDecision


class GraphPolicy(EvictionPolicy):
    name = "graph"

    def __init__(self, advisor) -> None:
        self.advisor = advisor
        self.graph = advisor.graph

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

    def observe(self, event: TierEvent) -> None:
        graph, h = self.graph, event.block_hash
        if isinstance(event, StoreEvent):
            if event.stored and h not in graph:
                graph.on_store(h, tier=event.tier)
            elif not event.stored:
                graph.on_remove(h)
        elif isinstance(event, (SpillEvent, WarmEvent)) and event.stage == "done" and h in graph:
            src, dst = (VRAM, DRAM) if isinstance(event, SpillEvent) else (DRAM, VRAM)
            if graph.tier_of(h) == src:
                graph.on_move(h, src, dst)
        elif (isinstance(event, EvictionEvent) and event.tier_to is None) or isinstance(event, DropEvent):
            graph.on_remove(h)

    def close(self) -> None:
        self.advisor.stop()


def make_graph_policy(eviction_config) -> GraphPolicy:
    from tiercache.graph import GraphEvictionAdvisor, KVCacheGraph

    advisor = GraphEvictionAdvisor(
        KVCacheGraph(tiers=(VRAM, DRAM)),
        interval_s=eviction_config.advisor_interval,
        max_stale_s=eviction_config.max_stale,
    )
    advisor.start()
    return GraphPolicy(advisor)


def _components(components) -> tuple[tuple[str, float], ...]:
    if components is None:
        return ()
    return tuple((k, float(v)) for k, v in dataclasses.asdict(components).items())
