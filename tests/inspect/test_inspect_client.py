"""The in-process client: same methods and types as over the socket; publication and discovery rules."""

from __future__ import annotations

import threading

import pytest
from inspect_helpers import Workload

from tiercache.inspect import (
    BlockRecord,
    Decision,
    Explanation,
    InspectError,
    InspectionService,
    InspectionState,
    Stats,
    TierStats,
    connect,
)
from tiercache.inspect import paths as inspect_paths


def test_in_process_and_socket_answers_are_the_same(served):
    run, service = served
    local, remote = connect(state=run.state), connect(service.path)
    assert local.where == "in-process" and remote.where == str(service.path)
    for client in (local, remote):
        assert isinstance(client.stats(), Stats)
        assert all(isinstance(t, TierStats) for t in client.tiers())
        assert all(isinstance(d, Decision) for d in client.decisions())
        assert all(isinstance(b, BlockRecord) for b in client.blocks())
        assert isinstance(client.explain(client.decisions(1)[0].block_hash), Explanation)
    same = lambda ds: [(d.seq, d.reason, d.score, dict(d.components)) for d in ds]
    assert same(local.decisions(limit=100)) == same(remote.decisions(limit=100))
    assert local.tiers() == remote.tiers()
    remote.close()


def test_connect_prefers_the_live_in_process_state(lru_run, monkeypatch):
    monkeypatch.delenv(inspect_paths.SOCKET_ENV, raising=False)
    client = connect()
    assert client.where == "in-process"
    assert connect(in_process=True).stats().evictions > 0


def test_connect_in_process_without_a_state(monkeypatch):
    monkeypatch.setattr("tiercache.inspect.client.live_states", lambda: [])
    with pytest.raises(InspectError, match="no live InspectionState in this process"):
        connect(in_process=True)


def test_the_recording_thread_sees_unpublished_events():
    w = Workload("lru")
    try:
        w.state.min_interval = 3600.0  # publish() will not run again by itself
        w.step([1])
        for i in range(30):
            w.step([100 + i])
        client = connect(state=w.state)
        assert client.stats().stores == 31  # published on demand: this thread records
        seen = []
        thread = threading.Thread(target=lambda: seen.append(client.stats().stores))
        w.step([500])
        thread.start()
        thread.join()
        assert seen == [31]  # another thread reads the last published snapshot only
        assert client.stats().stores == 32
    finally:
        w.close()


def test_publish_rate_limit_and_bounded_decisions():
    w = Workload("lru")
    try:
        w.state = InspectionState(max_decisions=5)
        w.step([1])
        assert w.state.publish(w.manager.view(), force=True)
        assert not w.state.publish(w.manager.view())  # within min_interval
        for i in range(40):
            w.step([10 + i])
        w.state.publish(w.manager.view(), force=True)
        assert len(connect(state=w.state).decisions(limit=100)) == 5
    finally:
        w.state.close()
        w.close()


def test_tokens_ttft_and_bytes(short_dir):
    w = Workload("lru")
    w.state = InspectionState(bytes_per_block={"vram": 100, "dram": 100})
    try:
        w.step([1, 2, 3])
        w.state.record_tokens(loaded=96, recomputed=32)
        for t in (0.01, 0.02, 0.03):
            w.state.record_ttft(t, hit=True)
        w.state.record_ttft(0.5, hit=False)
        w.state.publish(w.manager.view(), force=True)
        with InspectionService(w.state, short_dir / "t.sock") as service, connect(service.path) as client:
            stats = client.stats()
        assert stats.token_hit_rate == 0.75 and stats.tokens_loaded == 96
        assert stats.ttft_hit.count == 3 and stats.ttft_hit.p50_s == 0.02 and stats.ttft_miss.mean_s == 0.5
        vram = stats.tier("vram")
        assert vram.capacity_bytes == 800 and vram.used_bytes == 100 * vram.used_slots
    finally:
        w.state.close()
        w.close()
