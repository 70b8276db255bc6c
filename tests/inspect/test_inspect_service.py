"""The service over a real socket: decisions from a real TierManager (LRU and graph policy), permissions,
socket paths, auto discovery, shutdown."""

from __future__ import annotations

import os
import socket
import stat
import tempfile
import threading
import time

import pytest
from inspect_helpers import Workload, loop_in_thread

from tiercache.config import InspectConfig
from tiercache.inspect import InspectError, InspectionService, InspectionState, connect
from tiercache.inspect import paths as inspect_paths
from tiercache.scheduler.events import EvictionEvent


def test_lru_decisions_arrive_through_the_socket(served):
    run, service = served
    with connect(service.path, in_process=False) as client:
        decisions = client.decisions(limit=200)
        stats = client.stats()
    evictions = [e for e in run.events if isinstance(e, EvictionEvent)]
    assert stats.evictions == len(evictions) > 0 and stats.policy == "lru"
    assert stats.evictions_by_policy == {"lru": len(evictions)}
    kept = [d for d in decisions if d.kind == "eviction"]
    assert [d.seq for d in kept] == [e.seq for e in reversed(evictions)]  # newest first, none lost
    spill = next(d for d in kept if d.tier_to == "dram")
    drop = next(d for d in kept if d.tier_to is None)
    assert spill.action == "spill vram→dram" and drop.action == "drop dram"
    assert "least recently used" in spill.reason and spill.policy == "lru"
    assert set(spill.components) == {"idle_s"} and spill.score == -spill.components["idle_s"]
    assert isinstance(spill.block_hash, bytes) and len(spill.block_hash) == 32
    warm = next(d for d in decisions if d.kind == "warm")
    assert warm.stage == "planned" and warm.action == "warm dram→vram" and "load hit" in warm.reason


def test_stats_and_tiers_match_the_manager(served):
    run, service = served
    m = run.manager
    with connect(service.path, in_process=False) as client:
        stats, tiers = client.stats(), client.tiers()
    assert stats.tiers == tiers
    for t in tiers:
        tier = m.view().tier(t.name)
        assert (t.capacity_blocks, t.free_slots, t.used_slots) == (
            tier.capacity_blocks,
            tier.free_slots,
            tier.used_slots,
        )
        assert t.stored_blocks == tier.stored_blocks and 0 <= t.occupancy <= 1
    kinds = [e.kind for e in run.events]
    assert stats.hits == kinds.count("hit") == sum(stats.hits_by_tier.values())
    assert stats.misses == kinds.count("miss") and stats.stores == kinds.count("store")
    assert stats.hit_rate == pytest.approx(stats.hits / (stats.hits + stats.misses))
    assert stats.spills > 0 and stats.warms > 0 and stats.blocks == len(m.view())
    assert stats.tier("vram").evictions + stats.tier("dram").evictions == stats.evictions
    dropped = [e for e in run.events if e.kind == "eviction" and e.tier_to is None]
    assert stats.evictions_dropped == len(dropped) > 0


def test_blocks_most_recent_first(served):
    run, service = served
    with connect(service.path) as client:
        vram = client.blocks(tier="vram", limit=3)
        every = client.blocks(limit=1000)
    assert len(vram) == 3 and all(b.tier == "vram" for b in vram)
    assert len(every) == len(run.manager.view())
    assert [b.idle_s for b in every] == sorted(b.idle_s for b in every)
    entry = run.manager.view().block(every[0].block_hash)
    assert (every[0].tier, every[0].slot, every[0].hits) == (entry.tier, entry.slot, entry.hits)


def test_graph_policy_decisions_and_explain(graph_run, short_dir):
    with InspectionService(graph_run.state, short_dir / "g.sock") as service, connect(service.path) as client:
        decisions = client.decisions(limit=200, kinds=["eviction"])
        graph = [d for d in decisions if d.policy == "graph"]
        assert graph and "lowest priority leaf" in graph[0].reason
        assert {"tick", "horizon", "hits", "total"} <= set(graph[0].components)
        assert graph[0].score == graph[0].components["total"] and graph[0].snapshot_age_s is not None
        stored = graph_run.manager.view().hashes()[0]
        x = client.explain(stored)
        assert x.stored and x.policy == "graph" and x.block.block_hash == stored
        assert x.score == x.components["total"] and x.graph["tier"] == x.block.tier
        assert "graph priority" in x.summary
        gone = graph[0].block_hash
        if gone not in graph_run.manager.view():
            y = client.explain(gone.hex())
            assert y.decisions and y.decisions[0].seq == graph[0].seq and "Last decision" in y.summary


def test_explain_lru_by_bytes_hex_and_prefix(served):
    run, service = served
    with connect(service.path) as client:
        d = client.decisions(limit=1, kinds=["eviction"])[0]
        by_prefix = client.explain(d.block_hash.hex()[:16])
        assert by_prefix.block_hash == d.block_hash and by_prefix.decisions[0].seq == d.seq
        stored = run.manager.view().hashes()[0]
        x = client.explain(stored)
        assert x.policy == "lru" and x.block.tier == run.manager.view().block(stored).tier
        assert x.components["idle_s"] >= 0 and "LRU" in x.summary
        unknown = client.explain(b"\x01" * 32)
        assert not unknown.stored and not unknown.decisions and "No recent decision" in unknown.summary
        with pytest.raises(InspectError, match="matches .* blocks"):
            client.explain("00")  # every test hash starts with 00
        with pytest.raises(InspectError, match="block_hash"):
            client.explain("xyz")


def test_socket_is_0600_and_removed_on_close(lru_run, short_dir):
    service = InspectionService.start(InspectConfig(socket=str(short_dir / "p.sock")), lru_run.state)
    assert stat.S_IMODE(os.stat(service.path).st_mode) == 0o600
    assert stat.S_ISSOCK(os.stat(service.path).st_mode)
    assert [p.name for p in short_dir.iterdir()] == ["p.sock"]  # the private bind directory is gone
    service.close()
    assert not service.path.exists() and not service.running
    service.close()  # idempotent


def test_off_starts_nothing(lru_run):
    assert InspectionService.start(InspectConfig(socket="off"), lru_run.state) is None


def test_auto_path_pointer_and_discovery(lru_run, short_dir, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(short_dir))
    (short_dir / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(short_dir / "tmp"))  # not the machine's /tmp/tiercache-$UID
    own = short_dir / "tmp" / f"tiercache-{os.getuid()}"
    assert inspect_paths.socket_dirs() == [short_dir / "tiercache", own]
    monkeypatch.delenv(inspect_paths.SOCKET_ENV, raising=False)
    first = InspectionService.start(InspectConfig(socket="auto"), lru_run.state)
    second = InspectionService.start(InspectConfig(), lru_run.state)  # same process: its own path
    try:
        directory = short_dir / "tiercache"
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
        assert first.path == directory / f"tiercache-{os.getpid()}.sock"
        assert second.path == directory / f"tiercache-{os.getpid()}-1.sock"
        assert (directory / "latest").read_text().strip() == str(second.path)
        assert inspect_paths.discover() == second.path
        with connect(in_process=False) as client:
            assert client.where == str(second.path) and client.stats().evictions > 0
        second.close()
        assert not (directory / "latest").exists()
        assert inspect_paths.discover() == first.path  # the newest live socket left
    finally:
        first.close()
        second.close()
    assert inspect_paths.discover() is None
    with pytest.raises(InspectError, match="no tiercache inspection socket found"):
        connect(in_process=False)


def test_discovery_skips_dead_processes_and_foreign_dirs(short_dir, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(short_dir))
    directory = inspect_paths.private_dir(short_dir / "tiercache")
    import socket

    s = socket.socket(socket.AF_UNIX)
    s.bind(str(directory / "tiercache-999999999.sock"))  # a pid that cannot exist
    s.close()
    (directory / "latest").write_text(str(directory / "tiercache-999999999.sock"))
    monkeypatch.setattr(inspect_paths, "socket_dirs", lambda: [directory])
    assert inspect_paths.discover() is None
    os.chmod(directory, 0o755)
    with pytest.raises(InspectError, match="not a directory private to this user"):
        inspect_paths.private_dir(directory)


def test_explicit_path_errors_say_what_to_do(lru_run, short_dir):
    state = lru_run.state
    (short_dir / "file").write_text("x")
    with pytest.raises(InspectError, match="not a socket; remove it"):
        InspectionService(state, short_dir / "file")
    with pytest.raises(InspectError, match="does not exist; create it"):
        InspectionService(state, short_dir / "missing" / "s.sock")
    with pytest.raises(InspectError, match="limited to 107"):
        InspectionService(state, short_dir / ("x" * 120))
    with InspectionService(state, short_dir / "live.sock"), pytest.raises(InspectError, match="in use"):
        InspectionService(state, short_dir / "live.sock")
    import socket

    leftover = socket.socket(socket.AF_UNIX)
    leftover.bind(str(short_dir / "stale.sock"))
    leftover.close()  # a socket file nobody listens on: replaced
    with InspectionService(state, short_dir / "stale.sock") as service, connect(service.path) as client:
        assert client.ping()["pid"] == os.getpid()


def test_nothing_published_yet_is_an_error_reply(short_dir):
    state = InspectionState()
    try:
        with InspectionService(state, short_dir / "e.sock") as service, connect(service.path) as client:
            assert client.ping()["version"] == 0
            with pytest.raises(InspectError, match="nothing published yet"):
                client.stats()
    finally:
        state.close()


def test_requests_while_the_scheduler_runs(short_dir):
    """A client hammering the service while the scheduler thread records and publishes: no errors."""
    w = Workload("graph", vram=16, dram=16)
    w.state.min_interval = 0.0
    errors: list[BaseException] = []
    answered = [0]
    stop = threading.Event()

    def hammer(path):
        try:
            with connect(path) as client:
                while not stop.is_set():
                    client.stats()
                    for d in client.decisions(limit=20):
                        client.explain(d.block_hash)
                    client.blocks(limit=50)
                    answered[0] += 1
        except BaseException as exc:  # reported below
            errors.append(exc)

    try:
        w.step([0])
        with InspectionService(w.state, short_dir / "c.sock") as service:
            thread = threading.Thread(target=hammer, args=(service.path,))
            thread.start()
            deadline = time.monotonic() + 30
            turn = 0
            while (turn < 150 or answered[0] < 5) and time.monotonic() < deadline:
                w.step([1000 + 2 * turn, 1001 + 2 * turn], lookups=[1000 + 2 * (turn // 2)])
                turn += 1
            stop.set()
            thread.join(10)
    finally:
        w.close()
    assert not errors, errors
    # each explain is read by the engine's thread for the service, which the busy scheduler thread lets
    # run every few ms (reads.py: batches at most every 20 ms), so rounds take 0.2-0.5 s here
    assert answered[0] >= 5 and turn >= 150


def test_a_forked_child_leaves_the_parents_socket_alone(lru_run, short_dir):
    with InspectionService(lru_run.state, short_dir / "f.sock") as service:
        pid = os.fork()
        if pid == 0:  # the child: what its atexit would do
            service.close()
            os._exit(0)
        os.waitpid(pid, 0)
        assert service.path.exists()
        with connect(service.path) as client:
            assert client.ping()["pid"] == os.getpid()


def test_wiring_as_documented_for_the_connector(short_dir):
    """The calls the package docstring gives the connector, in order, with a real config."""
    from tiercache.config import TierCacheConfig
    from tiercache.scheduler.manager import TierManager

    config = TierCacheConfig.from_dict({"inspect": {"socket": str(short_dir / "w.sock")}})
    manager = TierManager(4, 4, "codec-A")
    state = InspectionState()
    service = InspectionService.start(config.inspect, state)
    try:
        for i in range(20):  # scheduler steps
            out = manager.prepare_store([bytes([i]) * 32])
            manager.complete_store(out.block_hashes)
            for job in manager.take_jobs():
                manager.complete_transfer(job.job_id)
            state.record(manager.take_events())
            state.publish(manager.view())
        state.record_tokens(loaded=32, recomputed=96)
        state.publish(manager.view(), force=True)
        with connect(service.path) as client:
            stats = client.stats()
            assert stats.stores == 20 and stats.evictions > 0 and stats.token_hit_rate == 0.25
            assert client.decisions(limit=1)[0].policy == "lru"
    finally:
        service.close()
        manager.close()
        state.close()
    assert not service.path.exists()


def test_peers_of_another_user_are_refused(lru_run, short_dir, monkeypatch):
    """The check the service process's loop makes at accept (loop.py), run here on a thread so that the peer's
    credentials can be those of another user."""
    from tiercache.inspect import listener

    someone = (1, os.getuid() + 4242)  # another user, not root
    monkeypatch.setattr(listener, "peer_creds", lambda sock: someone)
    path = short_dir / "u.sock"
    with loop_in_thread(lru_run.state, path):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(5)
        sock.connect(str(path))
        assert sock.recv(16) == b""  # closed without an answer
        sock.close()
        monkeypatch.undo()
        with connect(path) as client:
            assert client.ping()["pid"] == os.getpid()
