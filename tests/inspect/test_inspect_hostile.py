"""Issue 26, item 2: the inspection service cannot starve the engine. Hostile clients (other processes, as
benchmarks/inspect_attack.py runs them) against a live manager, state and service while a scheduler loop
steps in this thread; every malformed request gets an error reply; idle clients are closed in seconds while
active ones keep being served. Before: a 200,000-kind filter cost 1.3-1.8 s of the engine's CPU, a request
nested 1,000 deep closed the connection without a reply, 32 idle connections locked everyone out for 600 s.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import pytest
from inspect_helpers import Workload, ask, ask_raw, raw

from tiercache.inspect import InspectionService, InspectionState, connect
from tiercache.inspect.handlers import MAX_FILTER, MAX_LIMIT, handle
from tiercache.inspect.limits import MAX_PAUSE, SAMPLE, WINDOW, CpuBudget, ServiceLimits, process_cpu
from tiercache.inspect.protocol import HEADER, MAX_REQUEST_BYTES, MAX_REQUEST_DEPTH

ATTACK = Path(__file__).resolve().parents[2] / "benchmarks" / "inspect_attack.py"
GOOD = {"v": 1, "method": "stats", "params": {}}


def _nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


# (request, fragment of the error reply); each must be answered, and the connection stay usable
HOSTILE = [
    ({"method": "decisions", "params": {"kinds": ["warm"] * 65}}, "request too large"),
    ({"method": "decisions", "params": {"kinds": ["warm"] * (MAX_FILTER + 1)}}, "at most 16"),
    ({"method": "decisions", "params": {"kinds": _nested(1000)}}, "request too large"),
    ({"method": "decisions", "params": {"kinds": _nested(MAX_REQUEST_DEPTH + 1)}}, "nested deeper than 8"),
    ({"method": "decisions", "params": {"limit": MAX_LIMIT + 1}}, "limit: expected an integer 0..1000"),
    ({"method": "blocks", "params": {"tier": "x" * 5000}}, "tier: expected one of"),
    ({"method": "explain", "params": {"block_hash": "ab" * 2000}}, "at most 64 bytes"),
    ({"method": "explain", "params": {"block_hash": b"\x01" * 65}}, "at most 64 bytes"),
    ({"method": "m" * 10_000}, "unknown method"),
    ({"v": 2**64 - 1, "method": "stats"}, "newer than this server"),
]  # fmt: skip


@pytest.mark.parametrize(("request_obj", "fragment"), HOSTILE, ids=[f"{i}" for i in range(len(HOSTILE))])
def test_hostile_requests_get_short_error_replies(served, request_obj, fragment):
    _, service = served
    with raw(service.path) as sock:
        start = time.thread_time()
        reply = ask(sock, request_obj)
        assert reply["ok"] is False and fragment in reply["error"], reply
        assert len(reply["error"]) < 600 and "internal error" not in reply["error"]
        assert ask(sock, GOOD)["ok"] is True
    assert time.thread_time() - start < 0.1


def test_the_issues_requests(served):
    """A 200,000-kind filter (1 MB) is refused by its length prefix before a byte of it is read; a request
    nested 1,000 deep gets an error reply (it used to close the connection without one)."""
    _, service = served
    with raw(service.path) as sock:
        body = msgpack.packb({"method": "decisions", "params": {"kinds": ["warm"] * 200_000}})
        sock.sendall(HEADER.pack(len(body)) + body[:100])
        reply = ask_raw_reply(sock)
        assert reply["ok"] is False and f"the limit is {MAX_REQUEST_BYTES:,}" in reply["error"]
    with raw(service.path) as sock:
        reply = ask_raw(sock, msgpack.packb({"method": "decisions", "params": {"kinds": _nested(1000)}}))
        assert reply["ok"] is False and "request too large" in reply["error"]
        assert ask(sock, GOOD)["ok"] is True


def ask_raw_reply(sock) -> dict:
    head = sock.recv(4)
    data = b""
    while len(data) < HEADER.unpack(head)[0]:
        data += sock.recv(1 << 16)
    return msgpack.unpackb(data)


def test_handlers_check_sizes_before_work():
    w = Workload("lru").run()
    try:
        start = time.thread_time()
        request = {"method": "decisions", "params": {"kinds": ["warm"] * 200_000, "limit": 1000}}
        reply = handle(w.state, request)
        assert reply["ok"] is False and "at most 16" in reply["error"] and len(reply["error"]) < 400
        assert time.thread_time() - start < 0.05  # was 1.3-1.8 s with a full decision ring
        assert len(handle(w.state, {"method": "decisions", "params": {"limit": 1000}})["result"]) <= 1000
    finally:
        w.close()


def test_cpu_budget():
    budget = CpuBudget(share=0.05, burst=0.01)
    assert budget.pause() == 0
    budget.charge(0.02)  # 10 ms over the burst
    assert 0.15 < budget.pause() <= 0.2
    budget.charge(10.0)  # a huge slice (a garbage collection on this thread): the pause is capped
    assert budget.pause() == pytest.approx(MAX_PAUSE, rel=0.01)
    with pytest.raises(ValueError, match="cpu_share"):
        ServiceLimits(cpu_share=2.0)


def test_the_service_budget_follows_the_engines_cpu():
    """The service process's share: the strict one while its engine's process uses CPU (or cannot be read),
    the idle one once the engine has been quiet for a window."""
    engine: list = [1.0]
    budget = CpuBudget(share=0.25, burst=0.02, idle_share=0.5, others=lambda: engine[0])
    assert budget.share_now() == 0.25  # strict until the engine has been seen quiet
    time.sleep(WINDOW + SAMPLE)
    budget.share_now()
    time.sleep(SAMPLE)
    assert budget.share_now() == 0.5
    engine[0] += 0.01  # the engine used 10 ms of CPU
    time.sleep(SAMPLE)
    assert budget.share_now() == 0.25
    engine[0] = None  # gone, or unreadable
    time.sleep(WINDOW + SAMPLE)
    assert budget.share_now() == 0.25
    assert process_cpu(os.getpid())() > 0 and process_cpu(2**22 + 1)() is None


def _steps_per_second(w: Workload, seconds: float, counter=[0]) -> float:  # noqa: B006
    start, n = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        i = counter[0] = counter[0] + 1
        w.step([10_000 + 2 * i, 10_001 + 2 * i], lookups=[10_000 + 2 * (i // 2)])
        n += 1
    return n / (time.perf_counter() - start)


def _thread_cpu(tid: int) -> float:
    fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads per-thread CPU time from /proc")
def test_hostile_processes_against_a_live_scheduler(short_dir):
    """Four hostile processes hammer the socket while the scheduler steps: the service process stays within
    its CPU share, the engine's point-read thread within its own, the scheduler keeps most of its speed, a
    legitimate client keeps being answered."""
    w = Workload("lru", vram=32, dram=64)
    w.state = InspectionState(max_decisions=1000)
    service = InspectionService(w.state, short_dir / "h.sock")
    procs = []
    # The objects earlier tests left in this process (in-process vLLM engines: ~0.7M) would make every full
    # garbage collection, triggered by the feed's allocations, scan them (~0.4 s each); a vLLM engine
    # freezes its start-up heap the same way (gc.freeze), so measure as it runs.
    gc.freeze()
    try:
        _steps_per_second(w, 0.3)  # fill the tiers and the decision ring
        alone = _steps_per_second(w, 1.0)
        cmd = [sys.executable, str(ATTACK), "--hostile"]
        args = [str(service.path), str(MAX_REQUEST_BYTES)]
        procs = [subprocess.Popen([*cmd, kind, *args]) for kind in ("flood", "deep", "frames", "churn")]
        time.sleep(0.5)
        tid, pid = service._thread.native_id, service.pid
        cpu0, engine0, wall0 = _process_cpu(pid), _thread_cpu(tid), time.monotonic()
        attacked = _steps_per_second(w, 1.5)
        wall = time.monotonic() - wall0
        share, engine_share = (_process_cpu(pid) - cpu0) / wall, (_thread_cpu(tid) - engine0) / wall
        with connect(service.path, timeout=5) as client:
            for _ in range(3):
                assert client.stats().stores > 0
    finally:
        gc.unfreeze()
        for p in procs:
            p.kill()
            p.wait()
        service.close()
        w.close()
    limits = service.limits
    assert share <= limits.cpu_share + 0.1, share  # its own budget (+ a burst, the feed, clock ticks)
    assert engine_share <= 2 * limits.engine_cpu_share + 0.02, engine_share  # explain's reads (flood asks)
    assert attacked >= 0.7 * alone, (attacked, alone)  # ≥ 90 % in benchmarks/inspect_attack.py; CI is noisy


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads process CPU time from /proc")
@pytest.mark.parametrize(("share", "most"), [(0.02, 0.06), (1.0, None)], ids=["2 %", "uncapped"])
def test_one_connection_gets_its_allowance_not_the_service(short_dir, share, most):
    """A client asking heavy requests back to back (the flood attack: one connection, 16 pipelined) takes
    what one connection may (client_cpu_share of a core, and a burst), not what the service may (50 % of a
    core while the engine idles, as here); a light client is answered at once meanwhile."""
    w = Workload("lru", vram=64, dram=256)
    w.state = InspectionState(max_decisions=1000)
    _steps_per_second(w, 0.5)  # a full decision ring: decisions(limit=1000) costs the service ~5 ms
    w.state.publish(w.manager.view(), force=True)
    limits = ServiceLimits(client_cpu_share=share)
    service = InspectionService(w.state, short_dir / "a.sock", limits=limits)
    with service:
        cmd = [sys.executable, str(ATTACK), "--hostile", "flood", str(service.path), str(MAX_REQUEST_BYTES)]
        flood = subprocess.Popen(cmd)
        try:
            time.sleep(0.5)  # its burst spent
            cpu0, wall0 = _process_cpu(service.pid), time.monotonic()
            with connect(service.path, timeout=5) as client:
                for _ in range(10):
                    start = time.monotonic()
                    assert client.stats().stores > 0
                    assert time.monotonic() - start < 0.25
                    time.sleep(0.1)
            used = (_process_cpu(service.pid) - cpu0) / (time.monotonic() - wall0)
        finally:
            flood.kill()
            flood.wait()
            w.close()
    if most is None:
        assert used > 0.08, used  # what the cap holds back: ~15 % here, as fast as the flood's own loop goes
    else:
        assert used <= most, used  # 2-3 % here


def test_idle_clients_are_closed_in_seconds_and_reconnect(lru_run, short_dir):
    limits = ServiceLimits(idle_timeout=0.3)
    with InspectionService(lru_run.state, short_dir / "i.sock", limits=limits) as service:
        with connect(service.path) as client:
            assert client.ping()["pid"] == os.getpid()
            idle = raw(service.path)
            time.sleep(0.8)
            assert idle.recv(16) == b""  # closed, silently: no request was in progress
            assert client.stats().evictions > 0  # its connection was closed too: reconnected once, quietly
        idle.close()


def test_idle_connections_of_other_processes_do_not_lock_clients_out(lru_run, short_dir):
    """64 idle connections from each of two processes: each holds at most max_per_client, and a newcomer
    takes the place of the longest idle; before, 32 idle connections locked everyone out for 600 s."""
    limits = ServiceLimits(max_connections=16, evict_after=0.2)
    with InspectionService(lru_run.state, short_dir / "l.sock", limits=limits) as service:
        cmd = [sys.executable, str(ATTACK), "--hostile", "idle", str(service.path), str(MAX_REQUEST_BYTES)]
        procs = [subprocess.Popen(cmd) for _ in range(2)]
        try:
            time.sleep(1.0)
            start = time.monotonic()
            with connect(service.path, timeout=5) as client:
                assert client.stats().evictions > 0
                assert client.ping()["connections"] <= 16  # this one included
            assert time.monotonic() - start < 2
        finally:
            for p in procs:
                p.kill()
                p.wait()


def test_a_byte_dripping_client_gets_an_error_and_the_close(served):
    _, service = served  # request_timeout 0.5 s
    frame = HEADER.pack(40) + msgpack.packb({"method": "stats"})
    with raw(service.path) as sock:
        start = time.monotonic()
        for i in range(len(frame)):  # a byte every 100 ms: the frame is not whole after 0.5 s
            try:
                sock.send(frame[i : i + 1])
            except BrokenPipeError:  # answered and closed already
                break
            time.sleep(0.1)
        reply = ask_raw_reply(sock)
        assert reply["ok"] is False and "request not whole after 0.5s" in reply["error"]
        assert sock.recv(16) == b"" and time.monotonic() - start < 3
