"""The inspection service: a daemon thread serving an InspectionState on a Unix-domain socket (mode 0600).

Provides:
    InspectionService.start(inspect_config, state, limits=None) -> InspectionService | None   None when the
        socket is "off"; "auto" → a per-process path (see paths.py) plus the directory's `latest` pointer
    InspectionService(state, path, *, pointer=False, limits=ServiceLimits())
        .path, .limits, .running, .close() (stops the thread, removes the socket and pointer; also run at
        exit, by atexit and by multiprocessing's exit hook, so a Ctrl-C'd or forked engine leaves no file)

It cannot starve the engine (limits.py): one thread, one selector, non-blocking sockets; each request is
bounded before any work (protocol.py, handlers.py); the thread's CPU time is capped at a share of wall time;
connections are served the cheapest first (fair queuing by the CPU time each has cost), one request each
per turn. Answers come from the published snapshot, so no request waits for the scheduler, and the
scheduler never waits for a request.

Every malformed request gets an error reply: a bad body (not msgpack, too large, too deep, wrong types,
unknown method) keeps the connection usable; a length prefix over MAX_REQUEST_BYTES, or a frame not whole
within `request_timeout`, gets the error and then the close (the stream cannot be resynchronized). A
connection is idle while nothing it sent waits unanswered (in the service's buffer or still in the kernel's)
and no reply is owed; idle for `idle_timeout`, it is closed silently (clients reconnect). Peers of another
user (SO_PEERCRED; root excepted) are refused; one client process may hold `max_per_client` connections;
when `max_connections` are open, one idle for `evict_after` s makes room, else one stalled mid-frame as long,
else the newcomer is refused (admission.py); connections whose client has closed never count.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import selectors
import socket
import threading
import time
from multiprocessing import util as mp_util
from pathlib import Path

from tiercache.inspect import listener
from tiercache.inspect.admission import admit
from tiercache.inspect.connection import Connection, encode_reply
from tiercache.inspect.handlers import handle
from tiercache.inspect.limits import CpuBudget, ServiceLimits
from tiercache.inspect.paths import auto_socket_path, clear_pointer, write_pointer
from tiercache.inspect.protocol import MAX_RESPONSE_BYTES, ProtocolError, pack_frame, unpack_request
from tiercache.inspect.state import InspectionState

logger = logging.getLogger(__name__)
ACCEPT_BATCH = 16  # connections accepted per turn; the rest wait in the listen backlog
_HINT = "send a msgpack map {'method': str, 'params': map}"


class InspectionService:
    def __init__(
        self,
        state: InspectionState,
        path: str | os.PathLike,
        *,
        pointer: bool = False,
        limits: ServiceLimits | None = None,
    ) -> None:
        self.state = state
        self.path = Path(path)
        self.limits = limits or ServiceLimits()
        self._pointer = pointer
        self._pid = os.getpid()
        self._stop = threading.Event()
        self._conns: dict[int, Connection] = {}
        self._ready: set[Connection] = set()  # a whole request buffered, nothing owed: no event needed
        self._budget = CpuBudget(self.limits.cpu_share, self.limits.cpu_burst, self.limits.idle_cpu_share)
        self._cpu_mark = 0.0
        self._accept_cpu = 0.0  # CPU time spent accepting (its place in the fair order, like a connection's)
        self._clock = 0.0  # fair clock: the least CPU time any ready client had cost (monotonic)
        self._logged = 0.0
        self._sel = selectors.DefaultSelector()
        self._listener = listener.listen(self.path)
        self._inode = os.stat(self.path).st_ino
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel.register(self._listener, selectors.EVENT_READ, "listen")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        if pointer:
            write_pointer(self.path)
        self._thread = threading.Thread(target=self._serve, name="tiercache-inspect", daemon=True)
        self._thread.start()
        atexit.register(self.close)  # a normal exit, Ctrl-C included
        self._finalizer = mp_util.Finalize(None, self.close, exitpriority=10)  # a multiprocessing child
        logger.info("tiercache: inspection service on %s (tiercache inspect --socket %s)", path, path)

    @classmethod
    def start(cls, config, state: InspectionState, **kwargs) -> InspectionService | None:
        """From an InspectConfig (or its socket string): None for "off"; raises InspectError with the fix
        when the socket cannot be created."""
        setting = getattr(config, "socket", config)
        if setting in ("off", None, False):
            return None
        if setting == "auto":
            return cls(state, auto_socket_path(), pointer=True, **kwargs)
        return cls(state, Path(os.path.expanduser(str(setting))), **kwargs)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def close(self, timeout: float = 2.0) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        atexit.unregister(self.close)
        self._finalizer.cancel()
        if os.getpid() != self._pid:  # a forked child: the socket and its thread belong to the parent
            return
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino == self._inode:  # still ours, not a newer server's
                self.path.unlink()
        if self._pointer:
            clear_pointer(self.path)

    def __enter__(self) -> InspectionService:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ----------------------------------------------------------------- server thread
    def _serve(self) -> None:
        self._cpu_mark = time.thread_time()
        try:
            while not self._stop.is_set():
                rest = self._budget.rest()
                if rest > 0:  # over the CPU share: read, accept and answer nothing until it refills
                    self._stop.wait(min(rest, 0.25))
                    self._reap(time.monotonic())
                    continue
                events = self._sel.select(timeout=0 if self._ready else 0.25)
                busy = self._turn(events)
                self._reap(time.monotonic())
                self._spend()
                if busy:
                    self._stop.wait(self.limits.tick)  # gather the next events: fewer, larger turns
        except Exception:  # pragma: no cover - the loop itself failing is a bug; say so, once
            logger.exception("tiercache: inspection service stopped")
        finally:
            for conn in list(self._conns.values()):
                self._drop(conn)
            for s in (self._listener, self._wake_r, self._wake_w):
                with contextlib.suppress(OSError):
                    s.close()
            self._sel.close()

    def _spend(self) -> float:
        """Charge the CPU time used since the last call to the budget; return it."""
        now = time.thread_time()
        spent, self._cpu_mark = now - self._cpu_mark, now
        self._budget.charge(spent)
        return spent

    def _turn(self, events) -> bool:
        """One request at most per connection, and one batch of accepts, the one that has cost the least CPU
        first (fair queuing: a client of cheap requests is not kept waiting by one of heavy requests, and new
        connections wait their turn like the requests of open ones), while the budget lasts."""
        ready = {conn: 0 for conn in self._ready}
        self._ready.clear()
        for key, mask in events:
            if key.data == "wake":
                self._wake_r.recv(64)
            else:
                ready[key.data] = ready.get(key.data, 0) | mask
        cost = lambda c: self._accept_cpu if c == "listen" else c.cpu
        order = sorted(ready, key=cost)
        if order:  # the fair clock: the least any ready client has cost (it never goes back)
            self._clock = max(self._clock, cost(order[0]))
        floor = self._clock - self.limits.cpu_burst  # back from idle: a burst's credit, no more
        for i, conn in enumerate(order):
            if self._budget.pause() > 0:
                self._ready.update(c for c in order[i:] if c != "listen" and c.sock.fileno() in self._conns)
                break
            if conn == "listen":
                self._accept_cpu = max(self._accept_cpu, floor) + self._accept()
            elif conn.sock.fileno() in self._conns:
                conn.cpu = max(conn.cpu, floor)
                self._service_safely(conn, ready[conn])
                conn.cpu += self._spend()
        return bool(ready)

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
            self._conns[sock.fileno()] = conn
            self._sel.register(sock, self._mask(conn), conn)
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
        if conn.done:
            return self._drop(conn)
        if conn.wants_answer:
            self._ready.add(conn)  # a pipelined request: next turn, without waiting for an event
        self._sel.modify(conn.sock, self._mask(conn), conn)

    def _answer(self, conn: Connection, now: float) -> None:
        try:
            body = conn.next_request(now)
        except ProtocolError as exc:  # a length prefix over the limit: the stream cannot be resynchronized
            return conn.queue({"ok": False, "error": str(exc)}, now, close=True)
        try:
            reply = handle(self.state, unpack_request(body))
        except ProtocolError as exc:
            reply = {"ok": False, "error": f"{exc}; {_HINT}"}
        conn.queue(encode_reply(reply, self._log), now)

    def _mask(self, conn: Connection) -> int:
        return selectors.EVENT_WRITE if conn.outbuf else selectors.EVENT_READ

    def _reap(self, now: float) -> None:
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
        with contextlib.suppress(OSError, ValueError):
            self._conns.pop(conn.sock.fileno(), None)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._sel.unregister(conn.sock)
        conn.sock.close()

    def _log(self, message: str) -> None:
        """At most one line per 10 s: a hostile client must not flood the engine's log either."""
        now = time.monotonic()
        if now - self._logged >= 10.0:
            self._logged = now
            logger.warning(message)
