"""The service process: `python -m tiercache.inspect.process`, started by the engine's InspectionService
(server.py), serves the engine's inspection socket from a mirror of its state.

Provides:
    main(argv=None)          --engine-pid PID --limits JSON --fds LISTEN,FEED,POINTS (inherited descriptors:
                             the listening socket, the engine's Updates, explain's point reads)
    FeedChannel(sock, mirror)     the engine's Updates into the mirror (outside the CPU budget: their cost
                             follows the engine's activity, not the clients')
    PointsChannel(sock, timeout)  explain's point reads: .forward(conn, deferred, now) sends a PointQuery;
                             each PointReply is delivered to its connection; a query unanswered within
                             `timeout` (request_timeout) is an error reply ("ask again")

The process takes `limits.nice` below the engine's priority and keeps its serving thread within its CPU
budget (limits.py: `cpu_share` while the engine's process uses CPU, `idle_cpu_share` while it does not). It
exits when the engine closes the feed (InspectionService.close) or dies (EOF, or its parent is no longer
the engine), and on SIGTERM; SIGINT (a Ctrl-C in the engine's terminal reaches its whole process group) is
left to the engine, whose close() ends this process.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import json
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence

from tiercache.inspect.handlers import Deferred
from tiercache.inspect.limits import CpuBudget, ServiceLimits, process_cpu
from tiercache.inspect.loop import ServiceLoop
from tiercache.inspect.messages import PointQuery, PointReply, Update
from tiercache.inspect.mirror import Mirror
from tiercache.inspect.protocol import HEADER, FrameBuffer

logger = logging.getLogger("tiercache.inspect.process")
MAX_UPDATE_BYTES = 1 << 30  # a full Update of the largest rings is tens of MB
READ_BYTES = 1 << 20
PARENT_CHECK = 0.25  # s


class FeedChannel:
    charged = False

    def __init__(self, sock: socket.socket, mirror: Mirror) -> None:
        self.sock, self.mirror = sock, mirror
        sock.setblocking(False)
        self._inbuf = FrameBuffer(MAX_UPDATE_BYTES)

    def readable(self, now: float) -> bool:
        """Everything the engine has sent, applied in order; False once it has closed its end."""
        while True:
            try:
                data = self.sock.recv(READ_BYTES)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                return False
            if not data:
                return False
            self._inbuf.feed(data)
        applied = False
        while (body := self._inbuf.next_frame()) is not None:
            self.mirror.apply(Update.decode(body))
            applied = True
        if applied:
            gc.freeze()  # what the mirror holds: no collection scans it again (it has no cycles)
        return True

    def reap(self, now: float) -> None:
        pass


class PointsChannel:
    charged = True

    def __init__(self, sock: socket.socket, timeout: float) -> None:
        self.sock, self.timeout = sock, timeout
        sock.setblocking(False)
        self.loop: ServiceLoop | None = None
        self._inbuf = FrameBuffer(MAX_UPDATE_BYTES)
        self._out = bytearray()
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple] = {}  # id → (connection, deferred, deadline)

    def forward(self, conn, deferred: Deferred, now: float) -> None:
        query = PointQuery(next(self._ids), deferred.hashes)
        self._pending[query.id] = (conn, deferred, now + self.timeout)
        body = query.encode()
        self._out += HEADER.pack(len(body)) + body
        self._flush()

    def readable(self, now: float) -> bool:
        try:
            data = self.sock.recv(READ_BYTES)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        if not data:
            return False
        self._inbuf.feed(data)
        while (body := self._inbuf.next_frame()) is not None:
            reply = PointReply.decode(body)
            found = self._pending.pop(reply.id, None)
            if found is None:  # answered after its deadline: the client has had its error reply
                continue
            conn, deferred, _ = found
            if reply.error is None and len(reply.reads) != len(deferred.hashes):
                reply = PointReply(
                    reply.id, error=f"{len(reply.reads)} reads for {len(deferred.hashes)} blocks"
                )
            if reply.error is not None:
                self.loop.fail(conn, f"internal error: explain's point read failed ({reply.error})", now)
            else:
                reads = dict(zip(deferred.hashes, reply.reads, strict=True))
                self.loop.deliver(conn, deferred.finish, reads, now)
        return True

    def reap(self, now: float) -> None:
        self._flush()
        late = [i for i, (_, _, deadline) in self._pending.items() if deadline <= now]
        for i in late:
            conn, _, _ = self._pending.pop(i)
            wait = f"{self.timeout:g}s"
            self.loop.fail(
                conn,
                f"explain: the engine did not answer its point read within {wait} (busy); ask again",
                now,
            )

    def _flush(self) -> None:
        if self._out:
            with contextlib.suppress(BlockingIOError, InterruptedError):
                del self._out[: self.sock.send(self._out)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tiercache.inspect.process", description=__doc__)
    parser.add_argument("--engine-pid", type=int, required=True)
    parser.add_argument("--limits", required=True, help="ServiceLimits as a JSON map")
    parser.add_argument("--fds", required=True, help="LISTEN,FEED,POINTS: inherited file descriptors")
    args = parser.parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr, level=logging.WARNING,
        format="%(asctime)s tiercache inspect[%(process)d] %(levelname)s %(message)s",
    )  # fmt: skip
    limits = ServiceLimits(**json.loads(args.limits))
    listen_fd, feed_fd, points_fd = (int(fd) for fd in args.fds.split(","))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        os.nice(limits.nice)
    mirror = Mirror(args.engine_pid)
    feed = FeedChannel(socket.socket(fileno=feed_fd), mirror)
    points = PointsChannel(socket.socket(fileno=points_fd), limits.request_timeout)
    budget = CpuBudget(
        limits.cpu_share, limits.cpu_burst, limits.idle_cpu_share, others=process_cpu(args.engine_pid)
    )
    listen_sock = socket.socket(fileno=listen_fd)
    listen_sock.setblocking(False)
    loop = ServiceLoop(mirror, listen_sock, limits, budget, channels=(feed, points), defer=points.forward)
    points.loop = loop
    stop = threading.Event()

    def halt(*_) -> None:
        stop.set()
        loop.wake()

    signal.signal(signal.SIGTERM, halt)
    threading.Thread(target=_watch_parent, args=(args.engine_pid, stop, halt), daemon=True).start()
    loop.run(stop)
    return 0


def _watch_parent(engine_pid: int, stop: threading.Event, halt) -> None:
    """The engine gone (this process reparented) ends the service, whoever else holds the feed's other end
    (a process the engine forked after starting it)."""
    while not stop.wait(PARENT_CHECK):
        if os.getppid() != engine_pid:
            halt()


if __name__ == "__main__":
    sys.exit(main())
