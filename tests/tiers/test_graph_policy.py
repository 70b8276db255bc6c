"""The graph advisor behind the manager's eviction seam: decisions, fallback, the graph kept in step."""

import logging
import random

from tiercache.config import EvictionConfig
from tiercache.graph import GraphEvictionAdvisor, KVCacheGraph
from tiercache.scheduler.events import EvictionEvent
from tiercache.scheduler.manager import TierManager
from tiercache.scheduler.policies import make_policy
from tiercache.scheduler.policies.graph import GraphPolicy
from tiercache.wire import DRAM, VRAM


def h(i: int) -> bytes:
    return i.to_bytes(8, "little")


def make(vram=8, dram=8, watermark=0.0):
    advisor = GraphEvictionAdvisor(KVCacheGraph(tiers=(VRAM, DRAM)), interval_s=60, max_stale_s=60)
    manager = TierManager(vram, dram, "c", policy=GraphPolicy(advisor), spill_watermark=watermark)
    return manager, advisor


def store(m, ids):
    out = m.prepare_store([h(i) for i in ids])
    m.complete_store(out.block_hashes)


def evictions(m):
    return [e for e in m.take_events() if isinstance(e, EvictionEvent)]


def test_decisions_come_from_the_snapshot_with_components():
    m, advisor = make()
    store(m, range(4))
    advisor.refresh()
    assert m.spill(2) == 2
    first, _ = evictions(m)
    assert first.policy == "graph" and "lowest priority" in first.reason
    assert dict(first.components)["total"] == first.score and first.snapshot_age is not None
    assert first.tier_from == VRAM and first.tier_to == DRAM


def test_no_snapshot_falls_back_to_lru_and_says_so():
    m, _ = make()
    store(m, range(4))
    m.spill(1)
    (event,) = evictions(m)
    assert event.policy == "lru-fallback" and "no snapshot" in event.reason


def test_graph_follows_spills_and_drops():
    m, advisor = make(vram=2, dram=2, watermark=0.5)
    graph = advisor.graph
    store(m, [1, 2])
    for job in m.take_jobs():
        m.complete_transfer(job.job_id)
    spilled = [b.block_hash for b in m.view().blocks(DRAM)]
    assert spilled and all(graph.tier_of(b) == DRAM for b in spilled)
    store(m, [3, 4, 5, 6])  # DRAM fills: victims dropped from the graph too
    for job in m.take_jobs():
        m.complete_transfer(job.job_id)
    assert set(graph.nx.nodes) == set(m.view().hashes())
    for b in m.view().hashes():
        assert graph.tier_of(b) == m.view().block(b).tier
    graph.check_invariants()


def test_random_workload_with_the_graph_policy(caplog):
    caplog.set_level(logging.ERROR)
    rng = random.Random(3)
    m, advisor = make(vram=16, dram=32, watermark=0.125)
    for step in range(3000):
        start = rng.randrange(120)
        hashes = [h((start + i) % 120) for i in range(rng.randint(1, 5))]
        if rng.random() < 0.5:
            out = m.prepare_store(hashes)
            if out is not None:
                m.complete_store(out.block_hashes)
        else:
            n = m.lookup(hashes)
            out = m.prepare_load(hashes[:n]) if n else None
            if out is not None:
                m.complete_load(out.block_hashes)
        for job in m.take_jobs():
            m.complete_transfer(job.job_id, ok=rng.random() > 0.05)
        if step % 50 == 0:
            advisor.refresh()
        m.quick_check()
    m.check()
    advisor.graph.check_invariants()
    assert set(advisor.graph.nx.nodes) == set(m.view().hashes())
    assert not [r for r in caplog.records if r.name.startswith("tiercache")]
    assert {e.policy for e in m.take_events() if isinstance(e, EvictionEvent)} >= {"graph"}


def test_make_policy_graph_runs_and_stops_the_advisor():
    policy = make_policy(EvictionConfig(policy="graph", advisor_interval=0.01, max_stale=1.0))
    assert isinstance(policy, GraphPolicy) and policy.advisor.running
    manager = TierManager(4, 4, "c", policy=policy)
    manager.close()
    assert not policy.advisor.running


def test_connector_hints_give_the_graph_parents_requests_and_hits():
    """observe_request before a store links each block to its prefix parent (leaves-first needs it);
    HitEvents after it count against that request; observe_step adds co_attend edges."""
    m, advisor = make(vram=16, dram=16)
    graph, policy = advisor.graph, m.policy
    policy.observe_request("req-a", [h(1), h(2), h(3)])
    store(m, [1, 2, 3])
    assert graph.parent_of(h(2)) == h(1) and graph.parent_of(h(3)) == h(2)
    assert graph.parent_of(h(1)) is None
    assert not graph.is_evictable(h(1), VRAM) and graph.is_evictable(h(3), VRAM)  # leaves first
    policy.observe_request("req-b", [h(1), h(2), h(4)])
    assert m.lookup([h(1), h(2)]) == 2
    assert graph.info(h(1))["hits"] == 1 and graph.info(h(2))["hits"] == 1
    store(m, [4])
    assert graph.parent_of(h(4)) == h(2)
    policy.observe_step([h(1), h(4)])
    assert "co_attend" in graph.edge_types(h(1), h(4))
    assert not policy._lineage  # every remembered lineage was consumed by its store
