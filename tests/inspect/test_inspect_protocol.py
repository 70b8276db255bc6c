"""Protocol fuzz: random bytes, truncated frames, huge length prefixes, wrong msgpack types, unknown methods.
Each gets an error reply (or, for a lying length prefix, an error reply and a closed connection); the
server keeps answering."""

from __future__ import annotations

import random
import socket
import time

import msgpack
import pytest
from inspect_helpers import ask, ask_raw, raw

from tiercache.inspect import InspectionService
from tiercache.inspect.limits import ServiceLimits
from tiercache.inspect.protocol import HEADER, MAX_REQUEST_BYTES, FrameBuffer, ProtocolError, pack_frame

GOOD = {"v": 1, "method": "stats", "params": {}}

BAD_REQUESTS = [
    ([1, 2, 3], "request must be a map"),
    (42, "request must be a map"),
    ("stats", "request must be a map"),
    (None, "request must be a map"),
    ({}, "unknown method None"),
    ({"method": 7}, "unknown method 7"),
    ({"method": "drop_everything"}, "valid methods: blocks, decisions, explain, explain_request, ping"),
    ({"method": "stats", "params": [1]}, "params must be a map"),
    ({"method": "decisions", "params": {"limit": "ten"}}, "limit: expected an integer"),
    ({"method": "decisions", "params": {"limit": -1}}, "limit: expected an integer"),
    ({"method": "decisions", "params": {"limit": True}}, "limit: expected an integer"),
    ({"method": "decisions", "params": {"limit": 10**12}}, "limit: expected an integer"),
    ({"method": "decisions", "params": {"kinds": ["bogus"]}}, "kinds: expected a list"),
    ({"method": "decisions", "params": {"kinds": "eviction"}}, "kinds: expected a list"),
    ({"method": "blocks", "params": {"tier": "gpu"}}, "tier: expected one of vram, dram"),
    ({"method": "explain", "params": {}}, "block_hash: expected bytes or a hex string"),
    ({"method": "explain", "params": {"block_hash": 123}}, "block_hash: expected bytes or a hex string"),
    ({"method": "explain", "params": {"block_hash": "not hex"}}, "block_hash: expected bytes or a hex"),
    ({"method": "explain", "params": {"block_hash": b""}}, "block_hash: expected bytes or a hex string"),
    ({"method": "explain", "params": {"block_hash": "abc"}}, "odd number of hex digits"),
    ({"v": 99, "method": "stats"}, "protocol version 99 is newer"),
    ({"v": "1", "method": "stats"}, "v: expected protocol version 1 (an integer)"),
]


@pytest.mark.parametrize(("request_obj", "message"), BAD_REQUESTS)
def test_wrong_types_get_error_replies_and_the_connection_stays_usable(served, request_obj, message):
    _, service = served
    with raw(service.path) as sock:
        reply = ask(sock, request_obj)
        assert reply["ok"] is False and message in reply["error"] and "internal" not in reply["error"]
        assert ask(sock, GOOD)["ok"] is True


@pytest.mark.parametrize(
    "body",
    [
        b"\xc1",  # never-used msgpack byte
        b"\x92\x01",  # array of 2 with one element: truncated inside the body
        b"\x81\xa6method\xa5stats\xff",  # trailing garbage (extra data)
        b"\x81\xa3\xff\xfe\xfd\x01",  # invalid UTF-8 in a string
        b"\x81\x01\x02",  # an integer map key
        b"\x91" * 2_000 + b"\xc0",  # nesting deeper than the unpacker allows
        b"",  # an empty body
    ],
)
def test_bodies_that_are_not_msgpack_requests(served, body):
    _, service = served
    with raw(service.path) as sock:
        reply = ask_raw(sock, body)
        assert reply["ok"] is False
        assert any(m in reply["error"] for m in ("not valid msgpack", "must be a map", "request too large"))
        assert "internal error" not in reply["error"]
        assert ask(sock, GOOD)["ok"] is True


def test_random_frames(served):
    _, service = served
    rng = random.Random(7)
    with raw(service.path) as sock:
        for _ in range(200):
            body = rng.randbytes(rng.randrange(0, 300))
            reply = ask_raw(sock, body)
            assert reply["ok"] is False and "internal error" not in reply["error"]
        assert ask(sock, GOOD)["ok"] is True


def test_random_byte_streams_then_a_good_client(served):
    _, service = served
    rng = random.Random(11)
    for _ in range(30):
        with raw(service.path) as sock:
            sock.sendall(rng.randbytes(rng.randrange(1, 2000)))
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(5)
            try:
                while sock.recv(1 << 16):
                    pass
            except ConnectionResetError:
                pass
    with raw(service.path) as sock:
        assert ask(sock, GOOD)["ok"] is True


@pytest.mark.parametrize("length", [MAX_REQUEST_BYTES + 1, 0xFFFFFFFF])
def test_huge_length_prefix_gets_an_error_and_a_closed_connection(served, length):
    _, service = served
    with raw(service.path) as sock:
        sock.sendall(HEADER.pack(length) + b"\x00" * 100)
        reply = msgpack.unpackb(_read_frame(sock))
        assert reply["ok"] is False and "limit" in reply["error"]
        assert sock.recv(16) == b""  # closed: the stream cannot be resynchronized
    with raw(service.path) as sock:
        assert ask(sock, GOOD)["ok"] is True


def test_truncated_frames(served):
    _, service = served
    with raw(service.path) as sock:  # the client goes away mid-frame
        sock.sendall(HEADER.pack(100) + b"\x81" * 10)
    with raw(service.path) as sock:  # stalls mid-frame: an error reply, then closed (request_timeout 0.5 s)
        sock.sendall(HEADER.pack(100) + b"\x81" * 10)
        start = time.monotonic()
        reply = msgpack.unpackb(_read_frame(sock))
        assert reply["ok"] is False and "request not whole after 0.5s (14 bytes" in reply["error"]
        assert sock.recv(16) == b""
        assert time.monotonic() - start < 4
    with raw(service.path) as sock:  # a header split over several sends is fine
        frame = pack_frame(GOOD, MAX_REQUEST_BYTES)
        for i in range(len(frame)):
            sock.sendall(frame[i : i + 1])
        assert msgpack.unpackb(_read_frame(sock))["ok"] is True


def test_pipelined_requests_are_answered_in_order(served):
    _, service = served
    with raw(service.path) as sock:
        sock.sendall(b"".join(pack_frame({"method": m}, 1 << 10) for m in ("ping", "nope", "tiers")))
        replies = [msgpack.unpackb(_read_frame(sock)) for _ in range(3)]
    assert [r["ok"] for r in replies] == [True, False, True]
    assert replies[2]["result"][0]["name"] == "vram"


def test_too_many_connections(lru_run, short_dir):
    limits = ServiceLimits(max_connections=2)
    with InspectionService(lru_run.state, short_dir / "m.sock", limits=limits) as service:
        a, b = raw(service.path), raw(service.path)
        assert ask(a, GOOD)["ok"] and ask(b, GOOD)["ok"]
        with raw(service.path) as c:
            reply = msgpack.unpackb(_read_frame(c))
            assert reply["ok"] is False and "too many inspection clients" in reply["error"]
        a.close()  # frees a place once the server sees it go
        deadline = time.monotonic() + 5
        while True:
            with raw(service.path) as d:
                reply = msgpack.unpackb(_read_frame(d)) if _refused(d) else ask(d, GOOD)
            if reply["ok"] or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert reply["ok"] is True
        b.close()


def test_the_longest_idle_connection_makes_room(lru_run, short_dir):
    limits = ServiceLimits(max_connections=2, evict_after=0.2)
    with InspectionService(lru_run.state, short_dir / "m.sock", limits=limits) as service:
        a, b = raw(service.path), raw(service.path)
        assert ask(a, GOOD)["ok"] and ask(b, GOOD)["ok"]
        time.sleep(0.3)
        assert ask(b, GOOD)["ok"]  # b is active again: a is the longest idle
        with raw(service.path) as c:
            assert ask(c, GOOD)["ok"] is True
        assert a.recv(16) == b""  # closed to make room; an InspectClient would reconnect on its next call
        a.close()
        b.close()


def test_one_client_process_holds_a_few_connections(lru_run, short_dir):
    limits = ServiceLimits(max_per_client=2)
    with InspectionService(lru_run.state, short_dir / "m.sock", limits=limits) as service:
        a, b = raw(service.path), raw(service.path)
        assert ask(a, GOOD)["ok"] and ask(b, GOOD)["ok"]
        with raw(service.path) as c:
            reply = msgpack.unpackb(_read_frame(c))
        assert reply["ok"] is False and "too many inspection connections from process" in reply["error"]
        assert "reuse one" in reply["error"]
        a.close()
        b.close()


def test_frame_buffer_and_limits():
    buf = FrameBuffer(16)
    buf.feed(HEADER.pack(3) + b"abc" + HEADER.pack(2))
    assert buf.next_frame() == b"abc" and buf.next_frame() is None and buf.pending == 4
    buf.feed(b"xy")
    assert buf.next_frame() == b"xy"
    buf.feed(HEADER.pack(17))
    with pytest.raises(ProtocolError, match="limit"):
        buf.next_frame()
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        pack_frame(b"x" * 100, 50)


def _refused(sock: socket.socket) -> bool:
    """Whether the server already sent something (a refusal) before any request."""
    import select

    return bool(select.select([sock], [], [], 0.05)[0])


def _read_frame(sock: socket.socket) -> bytes:
    header = _exact(sock, 4)
    return _exact(sock, HEADER.unpack(header)[0])


def _exact(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        assert chunk, "connection closed early"
        out += chunk
    return out
