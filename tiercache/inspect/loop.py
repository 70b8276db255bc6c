"""The inspection service's serving loop: one thread, one selector, non-blocking sockets. The service process
runs it (process.py); a test may run it on a thread of its own with a live state as its source.

Provides:
    ServiceLoop(source, listener, limits, budget, *, channels=(), defer=None)
        source      what handlers.handle answers from: the service process's Mirror (a source with a
                    `connections` attribute is told how many are open), or a live InspectionState
        listener    the listening socket (listener.listen)
        budget      the CpuBudget of the thread that runs it
        channels    the service process's links to the engine (process.py): objects with .sock, .charged,
                    .readable(now) -> bool (False: the engine is gone; the loop ends) and .reap(now); served
                    before any client, also while the budget rests (the uncharged ones: outside it)
        defer(conn, deferred, now)   forwards a Deferred answer (explain's point reads); its reply comes back
                    by deliver()
        .run(stop)              serves until `stop` (a threading.Event) is set or a channel closes
        .wake()                 from another thread: the loop looks at `stop` now
        .deliver(conn, finish, reads, now)   finish(reads) is the reply a deferred answer owed (nothing when
                    the connection has gone meanwhile)
        .fail(conn, error, now) an error reply in place of what was owed
        .connections            open connections

Every request is bounded before any work (protocol.py, handlers.py); the thread's CPU time is capped by its
budget (limits.py); connections are served the cheapest first (fair queuing by the CPU time each has cost),
one request each per turn. Every malformed request gets an error reply: a bad body (not msgpack, too large,
too deep, wrong types, unknown method) keeps the connection usable; a length prefix over MAX_REQUEST_BYTES,
or a frame not whole within `request_timeout`, gets the error and then the close (the stream cannot be
resynchronized). A connection is idle while nothing it sent waits unanswered (in the service's buffer or
still in the kernel's) and no reply is owed; idle for `idle_timeout`, it is closed silently (clients
reconnect). Peers of another user (SO_PEERCRED; root excepted) are refused; one client process may hold
`max_per_client` connections; when `max_connections` are open, one idle for `evict_after` s makes room, else
one stalled mid-frame as long, else the newcomer is refused (admission.py); connections whose client has
closed never count.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tiercache.inspect import listener
from tiercache.inspect.admission import admit
from tiercache.inspect.connection import Connection, encode_reply
from tiercache.inspect.handlers import Deferred, handle
from tiercache.inspect.limits import Bucket, CpuBudget, ServiceLimits
from tiercache.inspect.protocol import MAX_RESPONSE_BYTES, ProtocolError, pack_frame, unpack_request

logger = logging.getLogger(__name__)
ACCEPT_BATCH = 16  # connections accepted per turn; the rest wait in the listen backlog
_HINT = "send a msgpack map {'method': str, 'params': map}"


class ServiceLoop:
    def __init__(
        self,
        source,
        listen_sock: socket.socket,
        limits: ServiceLimits,
        budget: CpuBudget,
        *,
        channels: Sequence[Any] = (),
        defer: Callable[[Connection, Deferred, float], None] | None = None,
    ) -> None:
        self.source, self.limits, self._budget = source, limits, budget
        self._listener, self._channels, self._defer = listen_sock, tuple(channels), defer
        self._conns: dict[int, Connection] = {}
        self._ready: set[Connection] = set()  # a whole request buffered, nothing owed: no event needed
        self._cpu_mark = 0.0
        self._accept_cpu = 0.0  # CPU time spent accepting (its place in the fair order, like a connection's)
        self._accepts = Bucket(limits.client_cpu_share, limits.cpu_burst, time.monotonic())  # its allowance
        self._later: dict = {}  # over its allowance: connection (or "listen") → (when it may go on, events)
        self._clock = 0.0  # fair clock: the least CPU time any ready client had cost (monotonic)
        self._logged = 0.0
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel = selectors.DefaultSelector()  # everything
        self._quiet = selectors.DefaultSelector()  # what is served while the budget rests
        self._sel.register(listen_sock, selectors.EVENT_READ, "listen")
        for sel in (self._sel, self._quiet):
            sel.register(self._wake_r, selectors.EVENT_READ, "wake")
            for channel in self._channels:
                sel.register(channel.sock, selectors.EVENT_READ, channel)

    @property
    def connections(self) -> int:
        return len(self._conns)

    def wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def run(self, stop: threading.Event) -> None:
        self._cpu_mark = time.thread_time()
        try:
            while not stop.is_set():
                rest = self._budget.rest()
                if rest > 0:  # over the CPU share: read, accept and answer nothing until it refills
                    if not self._channel_turn(self._quiet.select(timeout=min(rest, 0.25))):
                        return
                    self._reap(time.monotonic())
                    continue
                events = self._sel.select(timeout=self._next_wait())
                if not self._channel_turn(events):
                    return
                busy = self._turn(events)
                self._reap(time.monotonic())
                self._spend()
                if busy:
                    stop.wait(self.limits.tick)  # gather the next events: fewer, larger turns
        except Exception:  # the loop itself failing is a bug: said here, raised to the process (restarted)
            logger.exception("tiercache: inspection service loop failed")
            raise
        finally:
            for conn in list(self._conns.values()):
                self._drop(conn)
            for s in (self._wake_r, self._wake_w):
                with contextlib.suppress(OSError):
                    s.close()
            self._sel.close()
            self._quiet.close()

    def _channel_turn(self, events) -> bool:
        """The engine's channels first; False when one has closed (the engine is gone)."""
        now = time.monotonic()
        for key, _ in events:
            if key.data == "wake":
                with contextlib.suppress(OSError):
                    self._wake_r.recv(64)
            elif key.data in self._channels:
                self._spend()
                alive = key.data.readable(now)
                if key.data.charged:
                    self._spend()
                else:
                    self._cpu_mark = time.thread_time()
                if not alive:
                    return False
        return True

    def _spend(self) -> float:
        """Charge the CPU time used since the last call to the budget; return it."""
        now = time.thread_time()
        spent, self._cpu_mark = now - self._cpu_mark, now
        self._budget.charge(spent)
        return spent

    def _turn(self, events) -> bool:
        """One request at most per connection, and one batch of accepts, the one that has cost the least CPU
        first (fair queuing: a client of cheap requests is not kept waiting by one of heavy requests, and new
        connections wait their turn like the requests of open ones), while the budget lasts; one over its own
        allowance waits out of the selector until it has it again."""
        now = time.monotonic()
        ready = {conn: 0 for conn in self._ready}
        self._ready.clear()
        for key, mask in events:
            if key.data == "listen" or isinstance(key.data, Connection):
                ready[key.data] = ready.get(key.data, 0) | mask
        for client, (at, mask) in list(self._later.items()):
            if at <= now:  # its allowance is back: watched again, and served with what it had
                del self._later[client]
                self._watch(client)
                ready[client] = ready.get(client, 0) | mask
        cost = lambda c: self._accept_cpu if c == "listen" else c.cpu
        order = sorted(ready, key=cost)
        if order:  # the fair clock: the least any ready client has cost (it never goes back)
            self._clock = max(self._clock, cost(order[0]))
        floor = self._clock - self.limits.cpu_burst  # back from idle: a burst's credit, no more
        for i, conn in enumerate(order):
            if self._budget.pause() > 0:
                self._ready.update(c for c in order[i:] if c != "listen" and c.sock.fileno() in self._conns)
                break
            if conn != "listen" and conn.sock.fileno() not in self._conns:
                continue
            wait = (self._accepts if conn == "listen" else conn.bucket).wait(now)
            if wait > 0:
                self._hold(conn, now + wait, ready[conn])
            elif conn == "listen":
                spent = self._accept()
                self._accepts.charge(spent)
                self._accept_cpu = max(self._accept_cpu, floor) + spent
            else:
                conn.cpu = max(conn.cpu, floor)
                self._service_safely(conn, ready[conn])
                spent = self._spend()
                conn.cpu += spent
                conn.bucket.charge(spent)
        return bool(ready)

    def _hold(self, client, until: float, mask: int) -> None:
        """Out of the selector (its events would wake every turn) until `until`, with the events it had."""
        self._later[client] = (until, mask)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._sel.unregister(self._listener if client == "listen" else client.sock)

    def _watch(self, client) -> None:
        if client == "listen":
            sock, mask = self._listener, selectors.EVENT_READ
        elif client.sock.fileno() in self._conns and not client.owed:
            sock, mask = client.sock, self._mask(client)
        else:
            return
        try:
            self._sel.register(sock, mask, client)
        except KeyError:  # watched again meanwhile (a deadline's error reply to send)
            self._sel.modify(sock, mask, client)

    def _next_wait(self) -> float:
        """How long the next select may wait: not at all with requests ready, else until the first client
        held over its allowance may go on (0.25 s at most)."""
        if self._ready:
            return 0.0
        if not self._later:
            return 0.25
        first = min(at for at, _ in self._later.values())
        return min(max(first - time.monotonic(), 0.0), 0.25)

    def _accept(self) -> float:
        """Accept a batch; returns the CPU time it took. New connections start at the fair clock."""
        for _ in range(ACCEPT_BATCH):
            try:
                sock, _ = self._listener.accept()
            except OSError:  # BlockingIOError: none left
                break
            try:
                sock.setblocking(False)
                pid, uid = listener.peer_creds(sock) or (None, None)
                refusal = self._admit(pid, time.monotonic()) if listener.peer_allowed(uid) else ""
                if refusal is not None:  # said at once, then closed: a refused client costs no more than this
                    if refusal:
                        sock.send(pack_frame({"ok": False, "error": refusal}, MAX_RESPONSE_BYTES))
                    sock.close()
                    continue
            except OSError:
                sock.close()
                continue
            conn = Connection(sock, pid, time.monotonic())
            conn.cpu = self._clock
            conn.bucket = Bucket(self.limits.client_cpu_share, self.limits.cpu_burst, conn.last)
            self._conns[sock.fileno()] = conn
            self._sel.register(sock, self._mask(conn), conn)
        self._counted()
        return self._spend()

    def _admit(self, pid: int | None, now: float) -> str | None:
        """None to serve a new connection of process `pid`, else why not (sent to it before the close); the
        connections admission.admit says leave (closed by their peer, or idle to make room) are closed."""
        refusal, leaving = admit(list(self._conns.values()), pid, now, self.limits)
        for conn in leaving:
            self._drop(conn)
        return refusal

    def _service_safely(self, conn: Connection, mask: int) -> None:
        try:
            self._service(conn, mask)
        except Exception as exc:  # a bug with one connection must not stop the service
            self._log(f"tiercache inspect: connection failed ({type(exc).__name__}: {exc}); closing it")
            with contextlib.suppress(OSError):
                error = {"ok": False, "error": f"internal error ({type(exc).__name__}); please report it"}
                conn.sock.send(pack_frame(error, MAX_RESPONSE_BYTES))
            self._drop(conn)

    def _service(self, conn: Connection, mask: int) -> None:
        """One turn: send what is owed, read, answer at most one request."""
        now = time.monotonic()
        try:
            if mask & selectors.EVENT_WRITE:
                conn.flush(now)
            if mask & selectors.EVENT_READ and not conn.read(now):
                return self._drop(conn)
            if conn.wants_answer:
                self._answer(conn, now)
                conn.flush(now)  # optimistic: most replies go out in one call
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            return self._drop(conn)
        self._settle(conn)

    def _settle(self, conn: Connection) -> None:
        """After a turn of the connection: closed, waiting (owed: out of the selector until its reply), or
        watched for what it needs next."""
        if conn.done:
            return self._drop(conn)
        if conn.owed:
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(conn.sock)
            return
        if conn.wants_answer:
            self._ready.add(conn)  # a pipelined request: next turn, without waiting for an event
        try:
            self._sel.modify(conn.sock, self._mask(conn), conn)
        except KeyError:  # back from owing a reply
            self._sel.register(conn.sock, self._mask(conn), conn)

    def _answer(self, conn: Connection, now: float) -> None:
        try:
            body = conn.next_request(now)
        except ProtocolError as exc:  # a length prefix over the limit: the stream cannot be resynchronized
            return conn.queue({"ok": False, "error": str(exc)}, now, close=True)
        try:
            reply = handle(self.source, unpack_request(body))
        except ProtocolError as exc:
            reply = {"ok": False, "error": f"{exc}; {_HINT}"}
        if isinstance(reply, Deferred):
            if self._defer is None:  # a live source never defers: a bug
                reply = {"ok": False, "error": "internal error (no engine to read from); please report it"}
            else:
                conn.owed = True
                return self._defer(conn, reply, now)
        conn.queue(encode_reply(reply, self._log), now)

    def deliver(self, conn: Connection, finish, reads: Mapping[bytes, dict], now: float) -> None:
        if not self._owes(conn):
            return
        start = time.thread_time()
        self._queue_owed(conn, finish(reads), now)
        spent = time.thread_time() - start
        conn.cpu += spent
        conn.bucket.charge(spent)

    def fail(self, conn: Connection, error: str, now: float) -> None:
        if self._owes(conn):
            self._queue_owed(conn, {"ok": False, "error": error}, now)

    def _owes(self, conn: Connection) -> bool:
        return conn.owed and self._conns.get(conn.sock.fileno()) is conn

    def _queue_owed(self, conn: Connection, reply: dict, now: float) -> None:
        try:
            conn.queue(encode_reply(reply, self._log), now)
            conn.flush(now)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            return self._drop(conn)
        self._settle(conn)

    def _mask(self, conn: Connection) -> int:
        return selectors.EVENT_WRITE if conn.outbuf else selectors.EVENT_READ

    def _reap(self, now: float) -> None:
        for channel in self._channels:
            channel.reap(now)
        timeout = self.limits.request_timeout
        for conn in list(self._conns.values()):
            verdict = conn.overdue(now, self.limits)
            if verdict == "drop":
                self._drop(conn)
            elif verdict == "incomplete":
                error = (
                    f"request not whole after {timeout:g}s ({conn.inbuf.pending} bytes of a frame received); "
                    "send each request at once: a 4-byte big-endian length, then the msgpack body"
                )
                conn.frame_since = None
                conn.queue({"ok": False, "error": error}, now, close=True)
                self._service_safely(conn, selectors.EVENT_WRITE)

    def _drop(self, conn: Connection) -> None:
        self._ready.discard(conn)
        self._later.pop(conn, None)
        with contextlib.suppress(OSError, ValueError):
            if self._conns.get(conn.sock.fileno()) is conn:
                del self._conns[conn.sock.fileno()]
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._sel.unregister(conn.sock)
        conn.sock.close()
        self._counted()

    def _counted(self) -> None:
        if hasattr(self.source, "connections"):
            self.source.connections = len(self._conns)

    def _log(self, message: str) -> None:
        """At most one line per 10 s: a hostile client must not flood the engine's log either."""
        now = time.monotonic()
        if now - self._logged >= 10.0:
            self._logged = now
            logger.warning(message)
