"""Issue 42, item 4: when a connection is idle, and when it leaves. A connection is idle only when nothing it
sent waits unanswered, in the service's buffer or still in the kernel's, and no reply is owed: only then may
a newcomer take its place (after evict_after) or the service close it (after idle_timeout). A frame begun and
stalled is not idle either; it has request_timeout to arrive whole, and gives its place to a newcomer only
when no connection is idle (a client that drips its request cannot hold a place against one that sends its
requests whole). A connection whose client has closed leaves the count at once.
"""

from __future__ import annotations

import socket
import time

import pytest
from inspect_helpers import ask, loop_in_thread, raw

from tiercache.inspect import InspectError, InspectionService, ServiceLimits, connect
from tiercache.inspect.admission import admit, hung_up, make_room
from tiercache.inspect.connection import Connection
from tiercache.inspect.handlers import METHODS
from tiercache.inspect.protocol import MAX_RESPONSE_BYTES, pack_frame, recv_frame

FRAME = pack_frame({"method": "stats"}, 1 << 10)
HALF = len(FRAME) // 2
LIMITS = ServiceLimits(idle_timeout=5.0, request_timeout=2.0, evict_after=1.0)
T0, LATER = 100.0, 110.0  # the service's clock (time.monotonic) when the peer acted, and 10 s later


def _peer_does(what: str) -> tuple[Connection, socket.socket]:
    """A service-side Connection (made at T0) whose peer did `what`; the service read what it says."""
    ours, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ours.setblocking(False)
    conn = Connection(ours, pid=1, now=T0)
    if what in ("request unread", "request read"):
        peer.sendall(FRAME)
    if what in ("half read", "half read, rest unread"):
        peer.sendall(FRAME[:HALF])
    if what in ("request read", "half read", "half read, rest unread"):
        assert conn.read(T0)
    if what == "half read, rest unread":
        peer.sendall(FRAME[HALF:])
    if what == "reply owed":
        conn.queue({"ok": True, "result": {}}, T0)
    return conn, peer


# what the peer did, 10 s ago: (idle?, stalled?, what its deadlines say then)
STATES = {
    "nothing": (True, False, "drop"),
    "request unread": (False, False, None),  # arrived, waiting its turn (the bug: counted as idle)
    "request read": (False, False, None),  # buffered, to be answered
    "half read": (False, True, "incomplete"),  # the rest never came: an error reply, then the close
    "half read, rest unread": (False, False, None),  # the rest arrived, not read yet
    "reply owed": (False, False, "drop"),  # being answered; a reply not taken in request_timeout is dropped
}


@pytest.mark.parametrize("what", list(STATES))
def test_only_a_connection_with_nothing_in_progress_is_idle(what):
    idle, stalled, verdict = STATES[what]
    conn, peer = _peer_does(what)
    try:
        assert conn.idle(LATER, LIMITS.evict_after) is idle
        assert conn.stalled(LATER, LIMITS.evict_after) is stalled
        assert conn.overdue(LATER, LIMITS) == verdict
        assert make_room([conn], LATER, LIMITS) is (conn if idle or stalled else None)
        assert not conn.idle(T0 + 0.5, LIMITS.evict_after)  # nothing is idle before evict_after
    finally:
        conn.sock.close()
        peer.close()


def test_an_idle_connection_makes_room_before_a_stalled_one():
    (half, p1), (idle, p2), (busy, p3) = (_peer_does(w) for w in ("half read", "nothing", "request unread"))
    try:
        assert make_room([busy, half, idle], LATER, LIMITS) is idle
        assert make_room([busy, half], LATER, LIMITS) is half
        assert make_room([busy], LATER, LIMITS) is None
    finally:
        for s in (half.sock, idle.sock, busy.sock, p1, p2, p3):
            s.close()


def test_closed_peers_leave_the_count_at_once():
    conns = [_peer_does("request read") for _ in range(4)]
    try:
        conns[0][1].close()  # closed by its client, its request unanswered: nobody would read the reply
        conns[1][1].shutdown(socket.SHUT_WR)  # done sending, still reading: it stays
        assert hung_up([c for c, _ in conns]) == [conns[0][0]]
        limits = ServiceLimits(max_connections=4, max_per_client=4)
        refusal, leaving = admit([c for c, _ in conns], 1, T0, limits)
        assert refusal is None and leaving == [conns[0][0]]  # the newcomer takes the closed one's place
        conns[1][1].close()
        refusal, leaving = admit([c for c, _ in conns[1:]], 1, T0, ServiceLimits(max_per_client=3))
        assert refusal is None and leaving == [conns[1][0]]
    finally:
        for c, peer in conns:
            c.sock.close()
            peer.close()


def _burn(state, params: dict) -> dict:
    """A request that costs the service params["seconds"] of CPU (50 ms): over a tiny CPU share, it pauses."""
    end = time.thread_time() + params.get("seconds", 0.05)
    while time.thread_time() < end:
        pass
    return {}


def test_a_request_waiting_its_turn_is_not_evicted(lru_run, short_dir, monkeypatch):
    """The issue's resets, made deterministic: the service pauses (over its CPU share) with one place, held
    by a client whose next request arrives during the pause; a newcomer arrives too. The request is
    answered, and the newcomer is told to retry. Before: the waiting request's connection counted as idle
    (no byte read for evict_after) and was closed to make room: ConnectionResetError."""
    monkeypatch.setitem(METHODS, "burn", _burn)
    tiny = dict(cpu_share=0.01, idle_cpu_share=0.01, cpu_burst=0.005)
    limits = ServiceLimits(max_connections=1, evict_after=0.2, **tiny)
    path = short_dir / "w.sock"
    with loop_in_thread(lru_run.state, path, limits), raw(path) as held:
        assert ask(held, {"method": "burn"})["ok"]
        held.sendall(pack_frame({"method": "stats"}, 1 << 10))  # arrives while the service pauses
        with raw(path) as newcomer:
            assert recv_frame(held, MAX_RESPONSE_BYTES)["ok"] is True
            refusal = recv_frame(newcomer, MAX_RESPONSE_BYTES)
    assert refusal["ok"] is False
    assert "too many inspection clients (1), none idle for 0.2s; retry in a moment" in refusal["error"]


def test_half_a_request_paused_past_evict_after_keeps_its_place(lru_run, short_dir):
    """A connection that sent nothing for evict_after makes room; one that has sent half a request and paused
    as long keeps its place, and is answered once the rest arrives."""
    limits = ServiceLimits(max_connections=2, evict_after=0.2, request_timeout=5.0)
    service = InspectionService(lru_run.state, short_dir / "h.sock", limits=limits)
    with service, raw(service.path) as half, raw(service.path) as quiet:
        assert ask(quiet, {"method": "ping"})["ok"]
        half.sendall(FRAME[:HALF])
        time.sleep(0.4)
        with raw(service.path) as newcomer:
            assert ask(newcomer, {"method": "ping"})["ok"] is True
        assert quiet.recv(16) == b""  # closed to make room (an InspectClient reconnects on its own)
        half.sendall(FRAME[HALF:])
        assert recv_frame(half, MAX_RESPONSE_BYTES)["ok"] is True


SHORT = dict(cpu_share=0.03, idle_cpu_share=0.03, cpu_burst=0.002)  # 2 ms of CPU, then a pause


@pytest.mark.parametrize(
    "limits",
    [ServiceLimits(max_per_client=4, **SHORT), ServiceLimits(max_connections=4, **SHORT)],
    ids=["per process", "in all"],
)
def test_closing_n_then_opening_n_up_to_the_limit(lru_run, short_dir, monkeypatch, limits):
    """Four connections, each used just now (none idle for evict_after: none could make room), then closed,
    and four opened at once while the service pauses (each request spent its CPU share: ~0.1 s), so that
    it sees the closes and the newcomers in one turn: all four newcomers are served. Before: they were
    refused, the closed connections counting until the service read their end."""
    monkeypatch.setitem(METHODS, "burn", _burn)
    path = short_dir / "n.sock"
    with loop_in_thread(lru_run.state, path, limits):
        for _ in range(2):
            used = [raw(path) for _ in range(4)]
            assert all(ask(s, {"method": "burn", "params": {"seconds": 0.003}})["ok"] for s in used)
            for s in used:
                s.close()
            fresh = [raw(path) for _ in range(4)]
            replies = [ask(s, {"method": "ping"}) for s in fresh]
            assert all(r["ok"] for r in replies), replies
            for s in fresh:
                s.close()


@pytest.mark.parametrize(
    ("limits", "fragment"),
    [
        (ServiceLimits(max_per_client=1), r"too many inspection connections from process \d+ \(1\); reuse"),
        (ServiceLimits(max_connections=1), r"too many inspection clients \(1\), none idle for 1s; retry"),
    ],
    ids=["per process", "in all"],
)
def test_a_refused_client_is_told_why(lru_run, short_dir, limits, fragment):
    """The service says why at once and closes; the client reads that even when its own send already failed
    (the close can come first), and raises it as InspectError, not as a broken pipe."""
    service = InspectionService(lru_run.state, short_dir / "r.sock", limits=limits)
    with service, connect(service.path, timeout=5) as holder:
        holder.ping()
        for pause in (0.0, 0.05):  # the client's request before, and after, the service's close
            late = connect(service.path, timeout=5)
            late._transport._connect(time.monotonic() + 5)
            time.sleep(pause)
            with pytest.raises(InspectError, match=fragment):
                late.ping()
            late.close()
        assert holder.ping()["pid"]


def test_a_client_that_closed_mid_request_frees_its_place(lru_run, short_dir):
    limits = ServiceLimits(max_connections=1)
    with InspectionService(lru_run.state, short_dir / "c.sock", limits=limits) as service:
        gone = raw(service.path)
        assert ask(gone, {"method": "ping"})["ok"]
        gone.sendall(FRAME[:HALF])  # half a request, then the client goes
        gone.close()
        with connect(service.path, timeout=5) as client:
            assert client.ping()["pid"]
