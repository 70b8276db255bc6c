"""Issue 7 against a live engine: after a workload that evicts, the inspection client — over the Unix
socket and in-process — reports the decisions (graph policy, with reasons and score components), the
token counts the connector recorded, and per-tier occupancy."""

from __future__ import annotations

import stat

import pytest
from helpers import BLOCK, connector_config, engine, generate, prompt, scheduler_side

from tiercache.inspect import connect


@pytest.fixture(scope="module")
def evicting_run(tiny_model, baseline):  # baseline first: its engine is freed before this one is built
    config = connector_config("tq4", vram=f"{6 * BLOCK} tokens", dram=f"{12 * BLOCK} tokens")
    config["kv_connector_extra_config"]["eviction"] = {"policy": "graph", "advisor_interval": "50ms"}
    with engine(tiny_model, config) as llm:
        prompts = [prompt(40 + i, 0) for i in range(5)] + [prompt(40, 1), prompt(41, 1)]
        outs = generate(llm, prompts)
        yield llm, scheduler_side(llm), outs


def test_decisions_reach_a_socket_client(evicting_run):
    _, sched, _ = evicting_run
    service = sched.inspection_service
    assert service is not None and stat.S_IMODE(service.path.stat().st_mode) == 0o600
    sched.inspection.publish(sched.manager.view(), force=True)
    with connect(service.path) as client:
        stats = client.stats()
        decisions = client.decisions(limit=50)
        tiers = {t.name: t for t in client.tiers()}
    assert stats.policy == "graph" and stats.evictions > 0 and decisions
    assert {"eviction"} <= {d.kind for d in decisions}
    assert all(d.reason for d in decisions)
    assert any(d.policy in ("graph", "lru-fallback") for d in decisions if d.kind == "eviction")
    assert tiers["vram"].capacity_blocks == 6 and tiers["dram"].capacity_blocks == 12
    assert stats.tokens_loaded > 0 and stats.tokens_recomputed > 0  # second turns reused what survived


def test_in_process_client_sees_the_same_state(evicting_run):
    _, sched, outs = evicting_run
    with connect(state=sched.inspection) as local, connect(sched.inspection_service.path) as remote:
        sched.inspection.publish(sched.manager.view(), force=True)
        a, b = local.stats(), remote.stats()
        assert (a.evictions, a.tokens_loaded, a.blocks) == (b.evictions, b.tokens_loaded, b.blocks)
        explained = local.explain(sched.manager.view().hashes()[0])
    assert explained.stored and explained.summary
    assert sum(o.num_cached_tokens for o in outs) == a.tokens_loaded
