"""One client connection of the inspection service: buffers, deadlines, and non-blocking I/O (server thread).

Provides:
    Connection(sock, pid, now)
        .read(now) -> bool         one recv (False: the peer closed); only when nothing is owed to it and no
                                   whole request is buffered, so a pipelining client cannot grow the buffer
        .next_request(now) -> bytes | None   one whole frame body (ProtocolError: a length over the limit)
        .queue(reply, now, close=False)   a reply frame to send (close: then the connection ends)
        .owed                      a reply being made elsewhere (explain's point reads in the engine): like a
                                   queued reply, nothing more is read or answered until it is queued
        .flush(now)                one send of what is queued
        .unread() -> int           bytes the peer sent that the service has not read yet (kernel buffer)
        .idle(now, after) -> bool  nothing in progress for `after` s: no byte received and unanswered (in
                                   the service's buffer or the kernel's), no reply owed
        .stalled(now, after) -> bool   a frame begun `after` s ago whose rest has not arrived (a slow or
                                   dripping sender; not one whose rest waits unread in the kernel's buffer)
        .overdue(now, limits) -> "drop" | "incomplete" | None   what its deadlines say (ServiceLimits):
                                   a reply not taken, a frame not whole (stalled), or idle for too long
        .quiet / .has_request / .wants_answer / .done   nothing buffered or owed / a whole request buffered /
                                   one to answer now / to close (everything sent)
    encode_reply(reply, log) -> bytes   the reply's frame; one too large → "ask for fewer", one that cannot
                                   be encoded (a bug, logged) → "internal error"

Idle is judged from the kernel's side too: a request that has arrived but waits its turn (the service serves
one request per connection per turn, and pauses when over its CPU share) is a request in progress.
"""

from __future__ import annotations

import fcntl
import socket
import struct
import termios
from collections.abc import Callable
from typing import Any

from tiercache.inspect.limits import Bucket, ServiceLimits
from tiercache.inspect.protocol import (
    MAX_REQUEST_BYTES,
    MAX_RESPONSE_BYTES,
    FrameBuffer,
    ProtocolError,
    pack_frame,
)

_INT = struct.Struct("i")


class Connection:
    __slots__ = (
        "bucket", "closing", "cpu", "frame_since", "inbuf", "last", "outbuf", "owed", "pid", "send_since",
        "sock",
    )  # fmt: skip

    def __init__(self, sock: socket.socket, pid: int | None, now: float) -> None:
        self.sock, self.pid = sock, pid
        self.inbuf = FrameBuffer(MAX_REQUEST_BYTES)
        self.outbuf = bytearray()
        self.last = now  # last bytes in or out
        self.cpu = 0.0  # service CPU time it has cost (its place in the server's fair order)
        self.frame_since: float | None = None  # when the partial frame at the end of inbuf started
        self.send_since: float | None = None  # when the reply in outbuf was queued
        self.closing = False  # close once outbuf is flushed
        self.owed = False  # a reply being made elsewhere (queue() clears it)
        self.bucket: Bucket | None = None  # its CPU allowance (limits.Bucket; the loop sets it)

    @property
    def quiet(self) -> bool:
        """Nothing buffered either way (the kernel's buffer aside: see idle())."""
        return not self.outbuf and not self.inbuf.pending and not self.closing and not self.owed

    @property
    def has_request(self) -> bool:
        return bool(self.inbuf.pending) and not self.inbuf.partial

    @property
    def done(self) -> bool:
        return self.closing and not self.outbuf

    @property
    def wants_answer(self) -> bool:
        return not self.outbuf and not self.closing and not self.owed and self.has_request

    def read(self, now: float) -> bool:
        if self.outbuf or self.closing or self.owed or self.has_request:
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
        self.owed = False

    def flush(self, now: float) -> None:
        if self.outbuf:
            sent = self.sock.send(self.outbuf)
            del self.outbuf[:sent]
            self.last = now
            if not self.outbuf:
                self.send_since = None

    def unread(self) -> int:
        try:
            return _INT.unpack(fcntl.ioctl(self.sock.fileno(), termios.FIONREAD, bytes(_INT.size)))[0]
        except (OSError, ValueError):  # closed meanwhile
            return 0

    def idle(self, now: float, after: float) -> bool:
        return self.quiet and now - self.last >= after and not self.unread()  # the syscall last

    def stalled(self, now: float, after: float) -> bool:
        begun = self.frame_since is not None and now - self.frame_since >= after
        return begun and self.unread() < self.inbuf.missing

    def overdue(self, now: float, limits: ServiceLimits) -> str | None:
        if self.owed:  # the one who owes it keeps its own deadline (process.py: request_timeout)
            return None
        if self.outbuf:
            late = now - (self.send_since or now) > limits.request_timeout
            return "drop" if late else None  # the peer does not take its reply
        if self.stalled(now, limits.request_timeout):
            return "incomplete"
        return "drop" if self.idle(now, limits.idle_timeout) else None


def encode_reply(reply: Any, log: Callable[[str], None]) -> bytes:
    try:
        return pack_frame(reply, MAX_RESPONSE_BYTES)
    except ProtocolError as exc:
        return pack_frame({"ok": False, "error": f"{exc}; ask for fewer (limit=…)"}, 1 << 16)
    except Exception as exc:
        log(f"tiercache inspect: reply not encodable ({type(exc).__name__}: {exc})")
        error = f"internal error: reply not encodable ({type(exc).__name__}); please report it"
        return pack_frame({"ok": False, "error": error}, 1 << 16)
