"""One client connection of the inspection service: buffers, deadlines, and non-blocking I/O (server thread).

Provides:
    Connection(sock, pid, now)
        .read(now) -> bool         one recv (False: the peer closed); only when nothing is owed to it and no
                                   whole request is buffered, so a pipelining client cannot grow the buffer
        .next_request(now) -> bytes | None   one whole frame body (ProtocolError: a length over the limit)
        .queue(reply, now, close=False)   a reply frame to send (close: then the connection ends)
        .flush(now)                one send of what is queued
        .overdue(now, limits) -> "drop" | "incomplete" | None   what its deadlines say (ServiceLimits):
                                   a reply not taken, a frame not whole, or idle for too long
        .quiet / .has_request / .wants_answer / .done   no request in progress / a whole request buffered /
                                   one to answer now / to close (everything sent)
    make_room(conns, now, limits) -> Connection | None   the one to close for a newcomer when all places are
                                   taken: the longest idle, else the longest sending one frame (evict_after)
    encode_reply(reply, log) -> bytes   the reply's frame; one too large → "ask for fewer", one that cannot
                                   be encoded (a bug, logged) → "internal error"
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable
from typing import Any

from tiercache.inspect.limits import ServiceLimits
from tiercache.inspect.protocol import (
    MAX_REQUEST_BYTES,
    MAX_RESPONSE_BYTES,
    FrameBuffer,
    ProtocolError,
    pack_frame,
)


class Connection:
    __slots__ = ("closing", "cpu", "frame_since", "inbuf", "last", "outbuf", "pid", "send_since", "sock")

    def __init__(self, sock: socket.socket, pid: int | None, now: float) -> None:
        self.sock, self.pid = sock, pid
        self.inbuf = FrameBuffer(MAX_REQUEST_BYTES)
        self.outbuf = bytearray()
        self.last = now  # last bytes in or out
        self.cpu = 0.0  # service CPU time it has cost (its place in the server's fair order)
        self.frame_since: float | None = None  # when the partial frame at the end of inbuf started
        self.send_since: float | None = None  # when the reply in outbuf was queued
        self.closing = False  # close once outbuf is flushed

    @property
    def quiet(self) -> bool:
        """No request in progress either way."""
        return not self.outbuf and not self.inbuf.pending and not self.closing

    @property
    def has_request(self) -> bool:
        return bool(self.inbuf.pending) and not self.inbuf.partial

    @property
    def done(self) -> bool:
        return self.closing and not self.outbuf

    @property
    def wants_answer(self) -> bool:
        return not self.outbuf and not self.closing and self.has_request

    def read(self, now: float) -> bool:
        if self.outbuf or self.closing or self.has_request:
            return True
        data = self.sock.recv(1 << 16)
        if not data:
            return False
        self.inbuf.feed(data)
        self.last = now
        self.frame_since = (self.frame_since or now) if self.inbuf.partial else None
        return True

    def next_request(self, now: float) -> bytes | None:
        body = self.inbuf.next_frame()
        self.frame_since = (self.frame_since or now) if self.inbuf.partial else None
        return body

    def queue(self, reply: Any, now: float, close: bool = False) -> None:
        self.outbuf += reply if isinstance(reply, bytes) else pack_frame(reply, MAX_RESPONSE_BYTES)
        self.send_since = now
        self.closing = self.closing or close

    def flush(self, now: float) -> None:
        if self.outbuf:
            sent = self.sock.send(self.outbuf)
            del self.outbuf[:sent]
            self.last = now
            if not self.outbuf:
                self.send_since = None

    def overdue(self, now: float, limits: ServiceLimits) -> str | None:
        if self.outbuf:
            late = now - (self.send_since or now) > limits.request_timeout
            return "drop" if late else None  # the peer does not take its reply
        if self.frame_since is not None and now - self.frame_since > limits.request_timeout:
            return "incomplete"
        if not self.inbuf.pending and now - self.last > limits.idle_timeout:
            return "drop"
        return None


def make_room(conns: Iterable[Connection], now: float, limits: ServiceLimits) -> Connection | None:
    conns = list(conns)
    idle = [c for c in conns if c.quiet and now - c.last >= limits.evict_after]
    if idle:
        return min(idle, key=lambda c: c.last)
    slow = [c for c in conns if c.frame_since is not None and now - c.frame_since >= limits.evict_after]
    return min(slow, key=lambda c: c.frame_since or now) if slow else None


def encode_reply(reply: Any, log: Callable[[str], None]) -> bytes:
    try:
        return pack_frame(reply, MAX_RESPONSE_BYTES)
    except ProtocolError as exc:
        return pack_frame({"ok": False, "error": f"{exc}; ask for fewer (limit=…)"}, 1 << 16)
    except Exception as exc:
        log(f"tiercache inspect: reply not encodable ({type(exc).__name__}: {exc})")
        error = f"internal error: reply not encodable ({type(exc).__name__}); please report it"
        return pack_frame({"ok": False, "error": error}, 1 << 16)
