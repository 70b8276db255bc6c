"""The inspection service: a daemon thread serving an InspectionState on a Unix-domain socket (mode 0600).

Provides:
    InspectionService.start(inspect_config, state) -> InspectionService | None   None when socket is "off";
        "auto" → a per-process path (see paths.py) plus the directory's `latest` pointer for clients
    InspectionService(state, path)  .path, .close() (stops the thread, removes the socket and pointer)

One thread, one selector: non-blocking sockets, per-connection buffers, no request ever waits for another
connection or for the scheduler (answers come from the published snapshot; see handlers.py). Requests are
answered in order. Peers of another user (SO_PEERCRED; root excepted) are refused. A bad request (not
msgpack, wrong types, unknown method) gets an error reply and the connection stays usable; a length prefix
over MAX_REQUEST_BYTES gets an error reply and the connection is closed (the stream cannot be
resynchronized). A partial frame idle for `read_timeout` seconds, a connection
idle for `idle_timeout`, and connections beyond `max_connections` are closed.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import selectors
import socket
import stat
import struct
import tempfile
import threading
import time
from pathlib import Path

from tiercache.inspect.handlers import handle
from tiercache.inspect.paths import (
    auto_socket_path,
    check_socket_path,
    clear_pointer,
    listening,
    write_pointer,
)
from tiercache.inspect.protocol import (
    MAX_REQUEST_BYTES,
    MAX_RESPONSE_BYTES,
    FrameBuffer,
    InspectError,
    ProtocolError,
    pack_frame,
    unpack_body,
)
from tiercache.inspect.state import InspectionState

logger = logging.getLogger(__name__)


class _Conn:
    __slots__ = ("closing", "inbuf", "last", "outbuf", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.inbuf = FrameBuffer(MAX_REQUEST_BYTES)
        self.outbuf = bytearray()
        self.last = time.monotonic()
        self.closing = False  # close once outbuf is flushed


class InspectionService:
    def __init__(
        self,
        state: InspectionState,
        path: str | os.PathLike,
        *,
        pointer: bool = False,
        max_connections: int = 32,
        read_timeout: float = 10.0,
        idle_timeout: float = 600.0,
    ) -> None:
        self.state = state
        self.path = Path(path)
        self.max_connections = max_connections
        self.read_timeout = read_timeout
        self.idle_timeout = idle_timeout
        self._pointer = pointer
        self._pid = os.getpid()
        self._stop = threading.Event()
        self._conns: dict[int, _Conn] = {}
        self._sel = selectors.DefaultSelector()
        self._listener = _listen(self.path)
        self._inode = os.stat(self.path).st_ino
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel.register(self._listener, selectors.EVENT_READ, "listen")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        if pointer:
            write_pointer(self.path)
        self._thread = threading.Thread(target=self._serve, name="tiercache-inspect", daemon=True)
        self._thread.start()
        atexit.register(self.close)
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
        try:
            while not self._stop.is_set():
                for key, mask in self._sel.select(timeout=1.0):
                    if key.data == "listen":
                        self._accept()
                    elif key.data == "wake":
                        self._wake_r.recv(64)
                    else:
                        self._service_safely(key.data, mask)
                self._reap(time.monotonic())
        except Exception:  # pragma: no cover - the loop itself failing is a bug; say so, once
            logger.exception("tiercache: inspection service stopped")
        finally:
            for conn in list(self._conns.values()):
                self._drop(conn)
            for s in (self._listener, self._wake_r, self._wake_w):
                with contextlib.suppress(OSError):
                    s.close()
            self._sel.close()

    def _accept(self) -> None:
        try:
            sock, _ = self._listener.accept()
        except OSError:
            return
        if not _peer_allowed(sock):
            sock.close()
            return
        sock.setblocking(False)
        conn = _Conn(sock)
        if len(self._conns) >= self.max_connections:
            msg = f"too many inspection clients ({self.max_connections}); close some and retry"
            conn.outbuf += pack_frame({"ok": False, "error": msg}, MAX_RESPONSE_BYTES)
            conn.closing = True
        self._conns[sock.fileno()] = conn
        self._sel.register(sock, self._mask(conn), conn)

    def _service_safely(self, conn: _Conn, mask: int) -> None:
        try:
            self._service(conn, mask)
        except Exception:  # a bug with one connection must not stop the service
            logger.exception("tiercache inspect: connection failed; closing it")
            self._drop(conn)

    def _service(self, conn: _Conn, mask: int) -> None:
        try:
            if mask & selectors.EVENT_READ and not conn.outbuf and not conn.closing:
                data = conn.sock.recv(1 << 16)
                if not data:
                    return self._drop(conn)
                conn.last = time.monotonic()
                conn.inbuf.feed(data)
            if not conn.outbuf and not conn.closing:
                self._answer(conn)  # one buffered request, if whole (pipelined ones wait their turn)
            if conn.outbuf:
                sent = conn.sock.send(conn.outbuf)  # optimistic: most replies go out in one call
                del conn.outbuf[:sent]
                conn.last = time.monotonic()
                if not conn.outbuf and not conn.closing:
                    self._answer(conn)
            if conn.closing and not conn.outbuf:
                return self._drop(conn)
            self._sel.modify(conn.sock, self._mask(conn), conn)
        except (BlockingIOError, InterruptedError):
            self._sel.modify(conn.sock, self._mask(conn), conn)
        except OSError:
            self._drop(conn)

    def _answer(self, conn: _Conn) -> None:
        """Answer one whole request if there is one (the next waits until this reply is sent)."""
        try:
            body = conn.inbuf.next_frame()
        except ProtocolError as exc:
            reply, conn.closing = {"ok": False, "error": str(exc)}, True
        else:
            if body is None:
                return
            try:
                reply = handle(self.state, unpack_body(body))
            except ProtocolError as exc:
                reply = {"ok": False, "error": f"{exc}; send a msgpack map {{'method': str, 'params': map}}"}
        try:
            conn.outbuf += pack_frame(reply, MAX_RESPONSE_BYTES)
        except ProtocolError as exc:
            conn.outbuf += pack_frame({"ok": False, "error": f"{exc}; ask for fewer (limit=…)"}, 1 << 16)
        except Exception as exc:
            logger.exception("tiercache inspect: reply not encodable")
            error = f"internal error: reply not encodable ({exc}); please report it"
            conn.outbuf += pack_frame({"ok": False, "error": error}, 1 << 16)

    def _mask(self, conn: _Conn) -> int:
        return selectors.EVENT_WRITE if conn.outbuf else selectors.EVENT_READ

    def _reap(self, now: float) -> None:
        for conn in list(self._conns.values()):
            idle = now - conn.last
            if idle > self.idle_timeout or (conn.inbuf.pending and idle > self.read_timeout):
                self._drop(conn)

    def _drop(self, conn: _Conn) -> None:
        self._conns.pop(conn.sock.fileno(), None)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._sel.unregister(conn.sock)
        conn.sock.close()


def _peer_uid(sock: socket.socket) -> int | None:
    """The connecting process's uid (Linux SO_PEERCRED); None where the platform cannot tell."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    creds = sock.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def _peer_allowed(sock: socket.socket) -> bool:
    """Defense in depth behind mode 0600: only this user (or root) may ask."""
    try:
        uid = _peer_uid(sock)
    except OSError:
        return False
    if uid is None or uid in (os.getuid(), 0):
        return True
    logger.warning("tiercache: inspection connection from uid %d refused (serving uid %d)", uid, os.getuid())
    return False


def _listen(path: Path) -> socket.socket:
    """Bind in a fresh private directory next to `path`, chmod 0600, then rename into place: the socket is
    never reachable with looser permissions, and the process umask is left alone."""
    check_socket_path(path)
    _clear_stale(path)
    tmpdir = Path(tempfile.mkdtemp(prefix=".tc", dir=path.parent))
    tmp = tmpdir / "s"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(tmp))
        os.chmod(tmp, 0o600)
        sock.listen(16)
        sock.setblocking(False)
        os.rename(tmp, path)
    except OSError as exc:
        sock.close()
        raise InspectError(
            f"inspect.socket: cannot listen on {str(path)!r} ({exc.strerror or exc}); choose a writable "
            "path, auto, or off"
        ) from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
        with contextlib.suppress(OSError):
            tmpdir.rmdir()
    return sock


def _clear_stale(path: Path) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise InspectError(
            f"inspect.socket: {str(path)!r} exists and is not a socket; remove it or choose another path"
        )
    if not listening(path):
        path.unlink(missing_ok=True)  # nobody listening: a leftover from a process that died
        return
    raise InspectError(
        f"inspect.socket: {str(path)!r} is in use by a live process; choose another path, or auto"
    )
