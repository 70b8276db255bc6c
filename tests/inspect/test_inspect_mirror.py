"""What the service process answers from (messages.py, feed.py, mirror.py): every value crosses the process
boundary unchanged, a mirror fed by the engine's feed answers as the engine's own state does, a service
that does not read never blocks the scheduler, and what it missed arrives with the next Update."""

from __future__ import annotations

import dataclasses
import socket
import time

import pytest
from inspect_helpers import Workload, h

from tiercache.inspect import InspectionState, prompt_digest
from tiercache.inspect.explain import read_points
from tiercache.inspect.feed import Feed
from tiercache.inspect.handlers import Deferred, handle
from tiercache.inspect.messages import EVENT_TYPES, PointQuery, PointReply, Sizes, Update
from tiercache.inspect.mirror import Mirror
from tiercache.inspect.protocol import HEADER, FrameBuffer
from tiercache.inspect.request_log import Departures, RequestRecord
from tiercache.inspect.snapshot import BLOCK_FIELDS
from tiercache.scheduler.events import (
    DeclineEvent,
    DropEvent,
    EvictionEvent,
    HitEvent,
    MissEvent,
    MoveEvent,
    StoreEvent,
)
from tiercache.scheduler.views import BlockView

PARTS = (("tick", 3.0), ("horizon", 8.0), ("total", 11.5))  # an eviction's score components
EVENTS = [
    StoreEvent(1, 0.5, h(1), "c", "stored", tier="dram", slot=3, stored=False),
    HitEvent(2, 0.6, h(2), "c", "lookup", tier="vram", slot=1),
    MissEvent(3, 0.7, h(3), "c", "not stored"),
    MoveEvent(4, 0.8, h(4), "c", "load hit", tier_from="dram", tier_to="vram", stage="failed", job_id=7),
    EvictionEvent(5, 0.9, h(5), "c", "lowest", tier_to=None, policy="graph", score=1.5, components=PARTS),
    DropEvent(6, 1.0, h(6), "c", "load failed: checksum mismatch", tier="dram", slot=2),
    DeclineEvent(7, 1.1, h(7), "c", "predicted", policy="graph", score=None, components=PARTS),
]


def test_block_rows_are_block_views():
    assert tuple(f.name for f in dataclasses.fields(BlockView)) == BLOCK_FIELDS


def test_every_event_type_is_sent():
    assert {type(e) for e in EVENTS} == set(EVENT_TYPES)


def _record(i: int, departed=None) -> RequestRecord:
    return RequestRecord(
        request_id=f"r-{i}", external_id=f"cmpl-{i}", digest=prompt_digest((i,)), clock=0.25, wall=1.5,
        block_size=16, block_hashes=(h(1), h(2), h(3)), vllm_blocks=1, hit_blocks=1, where="vdx",
        unreadable={2: "store in flight"}, departed=departed or {}, prompt_tokens=49, tokens_loaded=16,
        tokens_recomputed=17,
    )  # fmt: skip


def test_an_update_crosses_unchanged():
    w = Workload("graph").run()
    try:
        snap = w.state.snapshot
        update = Update(
            snapshot=snap, decisions=tuple(EVENTS), departures=(h(8), EVENTS[5]),
            requests=(_record(0, {0: EVENTS[4]}), _record(1)), forgotten=3, full=Sizes(1000, 128, 65_536),
        )  # fmt: skip
        back = Update.decode(update.encode())
    finally:
        w.close()
    assert back.decisions == update.decisions and back.requests == update.requests
    assert back.departures == update.departures and back.forgotten == 3 and back.full == update.full
    for field in dataclasses.fields(snap):
        if field.name not in ("decisions", "blocks"):
            assert getattr(back.snapshot, field.name) == getattr(snap, field.name), field.name
    assert {t: [dataclasses.astuple(b) for b in bs] for t, bs in back.snapshot.blocks.items()} == {
        t: [tuple(getattr(b, f) for f in BLOCK_FIELDS) for b in bs] for t, bs in snap.blocks.items()
    }
    reads = ({"block": None, "on_disk": True, "advisor": False},)
    assert PointReply.decode(PointReply(4, reads).encode()) == PointReply(4, reads)
    assert PointQuery.decode(PointQuery(3, (h(1),)).encode()) == PointQuery(3, (h(1),))
    with pytest.raises(ValueError, match="malformed inspection update"):
        Update.decode(b"\x91\x01")


def _reader() -> tuple[socket.socket, socket.socket]:
    ours, theirs = socket.socketpair()
    theirs.setblocking(False)
    return ours, theirs


def _drain(sock: socket.socket, mirror: Mirror, inbuf: FrameBuffer) -> int:
    applied = 0
    while True:
        try:
            data = sock.recv(1 << 20)
        except BlockingIOError:
            return applied
        inbuf.feed(data)
        while (body := inbuf.next_frame()) is not None:
            mirror.apply(Update.decode(body))
            applied += 1


def _sync(feed: Feed, sock: socket.socket, mirror: Mirror, inbuf: FrameBuffer) -> None:
    """The service reading while the engine's publishes flush, until nothing is left on the way."""
    while _drain(sock, mirror, inbuf) or feed.pending:
        feed.flush()


def _same(state: InspectionState, mirror: Mirror, requests: list[dict]) -> None:
    """Every answer of the mirror equals the state's, but for the ages (measured when each is made)."""
    for request in requests:
        ours, theirs = handle(state, request), handle(mirror, request)
        if isinstance(theirs, Deferred):  # explain: the engine's reads, as the service process gets them
            theirs = theirs.finish(read_points(state.view, theirs.hashes))
        assert _ageless(theirs) == _ageless(ours), request


def _ageless(value):
    if isinstance(value, dict):
        return {k: _ageless(v) for k, v in value.items() if not k.endswith(("_s", "_at")) and k != "summary"}
    if isinstance(value, list):
        return [_ageless(v) for v in value]
    return value


def test_a_mirror_fed_by_the_feed_answers_as_the_state_does():
    w = Workload("graph", vram=8, dram=8)
    w.state.min_interval = 0.0
    ours, theirs = _reader()
    mirror, inbuf = Mirror(0), FrameBuffer(1 << 30)
    feed = Feed(ours, w.state)
    w.state.attach(feed)
    try:
        w.run()
        for i in range(4):
            w.state.record_request(_record(i, {0: EVENTS[4]}))
        w.state.record([EVENTS[5]])  # a failed load's drop: the one departure explain_request reads
        w.state.publish(w.manager.view(), force=True)
        assert _drain(theirs, mirror, inbuf) > 1
        stored = w.manager.view().hashes()
        _same(w.state, mirror, [
            {"method": "stats"}, {"method": "tiers"}, {"method": "decisions", "params": {"limit": 1000}},
            {"method": "decisions", "params": {"kinds": ["eviction"], "limit": 5}},
            {"method": "blocks", "params": {"limit": 1000}}, {"method": "blocks", "params": {"tier": "dram"}},
            *({"method": "explain_request", "params": {"request_id": f"cmpl-{i}"}} for i in range(4)),
            {"method": "explain", "params": {"block_hash": stored[0]}},
            {"method": "explain", "params": {"block_hash": stored[-1].hex()[:20]}},
            {"method": "explain", "params": {"block_hash": h(6)}},
            {"method": "explain_request", "params": {"request_id": "nope"}},
        ])  # fmt: skip
        assert mirror.departures.get(h(6)) == EVENTS[5] and mirror.departures.forgotten == 0
    finally:
        feed.close()
        theirs.close()
        w.close()


def test_a_service_that_does_not_read_never_blocks_the_scheduler():
    """The socket full, publishes return at once and build nothing new; once the service reads again, the
    next Update carries everything since the last one it was sent."""
    w = Workload("lru", vram=8, dram=8)
    w.state.min_interval = 0.0
    ours, theirs = _reader()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    theirs.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    feed = Feed(ours, w.state)
    w.state.attach(feed)
    mirror, inbuf = Mirror(0), FrameBuffer(1 << 30)
    try:
        slowest = 0.0
        for turn in range(300):
            w.state.record_request(_record(turn))
            start = time.perf_counter()
            w.step([50_000 + turn])
            slowest = max(slowest, time.perf_counter() - start)
        assert feed.pending and slowest < 0.05
        assert feed.updates < 100  # publishes while the socket was full built no Update
        _sync(feed, theirs, mirror, inbuf)  # the service reads again
        w.state.publish(w.manager.view())  # the next Update: everything since the last one sent
        _sync(feed, theirs, mirror, inbuf)
        assert tuple(mirror.decisions) == tuple(w.state.decisions)
        assert mirror.snapshot.counters == w.state.snapshot.counters
        assert [mirror.requests.find(f"cmpl-{i}") for i in range(172, 300)] == [
            w.state.requests.find(f"cmpl-{i}") for i in range(172, 300)
        ]
    finally:
        feed.close()
        theirs.close()
        w.close()


def test_what_an_engine_records_after_its_last_publish_reaches_the_mirror_once_it_stops_stepping():
    """Admissions and decisions recorded within publish's min_interval of the last publish, then no step:
    the inspection thread's catch_up sends them (not before `idle` seconds without a publish), once."""
    w = Workload("lru", vram=8, dram=8).run()
    ours, theirs = _reader()
    feed = Feed(ours, w.state)
    w.state.attach(feed)
    mirror, inbuf = Mirror(0), FrameBuffer(1 << 30)
    try:
        w.state.min_interval = 60.0  # every publish after the forced one is skipped
        w.state.publish(w.manager.view(), force=True)
        _sync(feed, theirs, mirror, inbuf)
        for i in range(3):
            w.state.record_request(_record(i))
            w.step([70_000 + i])  # recorded, not published: the last step's changes
        _sync(feed, theirs, mirror, inbuf)
        assert mirror.requests.find("cmpl-2") is None
        feed.catch_up(idle=60.0)  # the engine stepped just now: nothing is sent yet
        assert _drain(theirs, mirror, inbuf) == 0
        time.sleep(0.05)
        feed.catch_up(idle=0.04)
        assert _drain(theirs, mirror, inbuf) == 1
        assert [mirror.requests.find(f"cmpl-{i}") for i in range(3)] == [
            w.state.requests.find(f"cmpl-{i}") for i in range(3)
        ]
        assert tuple(mirror.decisions) == tuple(w.state.decisions)
        feed.catch_up(idle=0.04)  # nothing new: no Update
        assert _drain(theirs, mirror, inbuf) == 0
    finally:
        feed.close()
        theirs.close()
        w.close()


def test_a_new_channel_gets_everything_at_once():
    w = Workload("lru").run()
    try:
        w.state.record_request(_record(0))
        ours, theirs = _reader()
        Feed(ours, w.state)  # a restarted service process: its first Update is full
        mirror = Mirror(0)
        assert _drain(theirs, mirror, FrameBuffer(1 << 30)) == 1
        assert tuple(mirror.decisions) == tuple(w.state.decisions) and mirror.requests.find("cmpl-0")
        assert mirror.snapshot.version == w.state.snapshot.version
        theirs.close()
    finally:
        w.close()


def test_departures_since_a_serial():
    gone = Departures(3)
    drops = [DropEvent(i, float(i), h(i % 4), "c", "clear") for i in range(6)]
    for e in drops[:3]:
        gone.record(e)
    mark = gone.serial
    for e in drops[3:]:  # h(3), then h(0) and h(1) again: they move to the end, h(2) is forgotten
        gone.record(e)
    assert gone.since(mark) == drops[3:] and gone.since(0) == drops[3:] and gone.forgotten == 3
    assert gone.since(gone.serial) == [] and gone.get(h(2)) is None and gone.get(h(0)) == drops[4]


def test_frames_carry_updates_whole():
    body = Update(snapshot=None).encode()
    buffer = FrameBuffer(1 << 20)
    buffer.feed(HEADER.pack(len(body)) + body[:3])
    assert buffer.next_frame() is None
    buffer.feed(body[3:])
    assert Update.decode(buffer.next_frame()) == Update(snapshot=None)
