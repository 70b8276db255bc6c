"""explain's point reads, the engine's side: what the service process asks of the engine's own state.

Provides:
    PointReads(state, limits)   run by InspectionService's thread in the engine (server.py)
        .serve(sock, wake, feed, stop) -> bool   waits up to 0.25 s for the service process's PointQuerys
                          (and for the feed's socket to take what a publish left); answers every query that
                          has arrived (explain.read_points on the state's view) in one write, then lets
                          READ_GAP pass; False when the service process has closed its end
        .reset()          a new channel (a new service process): what was half read of the old one is dropped

It shares the scheduler's GIL, so it keeps to `limits.engine_cpu_share` of wall time while the engine's
other threads run (`idle_cpu_share`, or that if more, while they are idle), and while queries keep coming
the scheduler gives the GIL up to it at most 1 / READ_GAP times a second. A read that fails (a bug) is a
PointReply with the error, logged: the thread goes on.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import threading
import time
from typing import TYPE_CHECKING

from tiercache.inspect.explain import read_points
from tiercache.inspect.limits import CpuBudget, ServiceLimits
from tiercache.inspect.messages import PointQuery, PointReply
from tiercache.inspect.protocol import HEADER, FrameBuffer

if TYPE_CHECKING:
    from tiercache.inspect.feed import Feed
    from tiercache.inspect.state import InspectionState

logger = logging.getLogger(__name__)
MAX_QUERY_BYTES = 1 << 20
REPLY_TIMEOUT = 1.0  # s to wait for the service process to take a reply
READ_GAP = 0.02  # s between two batches: each costs the scheduler a GIL hand-over or two
WAIT = 0.25  # s: the longest wait for a query (the caller looks at its process meanwhile)


class PointReads:
    def __init__(self, state: InspectionState, limits: ServiceLimits) -> None:
        self._state = state
        idle = max(limits.engine_cpu_share, limits.idle_cpu_share)
        self._budget = CpuBudget(limits.engine_cpu_share, limits.cpu_burst, idle)
        self._inbuf = FrameBuffer(MAX_QUERY_BYTES)

    def reset(self) -> None:
        self._inbuf = FrameBuffer(MAX_QUERY_BYTES)

    def serve(
        self, sock: socket.socket, wake: socket.socket, feed: Feed, stop: threading.Event, wait: float = WAIT
    ) -> bool:
        """One wait (at most `wait` seconds) for the service process's reads, then one batch of answers;
        False: the service process's end is closed."""
        rest = self._budget.rest()
        if rest > 0:  # over its share of the engine: the service process's reads wait
            stop.wait(min(rest, wait))
            return True
        writing = [feed.socket] if feed.pending and feed.socket is not None else []
        try:
            readable, _, _ = select.select([sock, wake], writing, [], wait)
        except (OSError, ValueError):  # closed meanwhile
            return False
        if wake in readable:
            with contextlib.suppress(OSError):
                wake.recv(64)
        if writing:
            feed.flush()
        if sock not in readable:
            return True
        start = time.thread_time()
        alive = self._answer(sock)
        self._budget.charge(time.thread_time() - start)
        if alive:
            stop.wait(READ_GAP)  # the queries of the next READ_GAP are answered together
        return alive

    def _answer(self, sock: socket.socket) -> bool:
        try:
            data = sock.recv(1 << 16)
        except OSError:
            data = b""
        if not data:
            return False
        self._inbuf.feed(data)
        out = bytearray()
        while (body := self._inbuf.next_frame()) is not None:
            reply = self._read(PointQuery.decode(body)).encode()
            out += HEADER.pack(len(reply)) + reply
        if out:
            sock.settimeout(REPLY_TIMEOUT)
            with contextlib.suppress(OSError):
                sock.sendall(out)
        return True

    def _read(self, query: PointQuery) -> PointReply:
        view = self._state.view
        if view is None:
            return PointReply(query.id, error="nothing published yet")
        try:
            reads = read_points(view, query.hashes)
        except Exception as exc:  # a bug in a read must not stop the thread
            logger.exception("tiercache inspect: point read failed")
            return PointReply(query.id, error=f"{type(exc).__name__}: {exc}"[:200])
        return PointReply(query.id, tuple(reads[h] for h in query.hashes))
