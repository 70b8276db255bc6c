"""How an InspectClient reaches a service: over its Unix socket, or by calling its handlers in this process.

Provides:
    SocketTransport(path, timeout)   .call(request) -> reply; .where (the path); .close()
        `timeout` bounds each whole call (connect, send, every byte of the reply): InspectError when it
        passes. A connection the server closed while idle is reconnected once, within the same timeout.
        A connection the server refused (too many clients) returns the server's refusal as the reply: the
        service says why at once and closes, so a send that fails (the close came first) is followed by a
        read of its last words: the refusal, or nothing (an idle connection closed: reconnected once).
    LocalTransport(state)            .call(request) -> reply; .where ("in-process"); .close()
    MAX_TIMEOUT                      the longest timeout (s) a socket option can hold
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any

from tiercache.errors import shown
from tiercache.inspect.handlers import handle
from tiercache.inspect.protocol import (
    MAX_REQUEST_BYTES,
    MAX_RESPONSE_BYTES,
    InspectError,
    ProtocolError,
    pack_frame,
    recv_frame,
    send_frame,
    unpack_body,
    unpack_request,
)
from tiercache.inspect.state import InspectionState

MAX_TIMEOUT = 86_400.0  # s: SO_SNDTIMEO holds less than the largest float


class SocketTransport:
    def __init__(self, path: Path, timeout: float) -> None:
        self.path, self.timeout = path, timeout
        self._sock: socket.socket | None = None

    @property
    def where(self) -> str:
        return str(self.path)

    def call(self, request: dict[str, Any]) -> Any:
        deadline = time.monotonic() + self.timeout
        for attempt in (0, 1):
            reused = self._sock is not None
            try:
                sock = self._connect(deadline)
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # closed: read its last
                    send_frame(sock, request, MAX_REQUEST_BYTES, deadline)  # words (a refusal), if any
                return recv_frame(sock, MAX_RESPONSE_BYTES, deadline)
            except TimeoutError:
                self.close()
                raise InspectError(
                    f"inspection request to {self.path} got no whole reply within {self.timeout:g}s; the "
                    "engine may be busy: retry, or raise the timeout (connect(timeout=…), inspect --timeout)"
                ) from None
            except (OSError, ProtocolError) as exc:
                self.close()
                if attempt or not (reused and _closed_by_peer(exc)):
                    raise InspectError(
                        f"inspection request to {self.path} failed ({shown(str(exc), 200)}); is the engine "
                        "still running? Check the socket path (tiercache inspect --socket PATH)"
                    ) from None
        raise AssertionError("unreachable")

    def _connect(self, deadline: float) -> socket.socket:
        """A blocking connect bounded by SO_SNDTIMEO: while the service's listen backlog is full (it is busy),
        the kernel queues this connect until there is room or the deadline passes (a connect with a Python
        timeout would fail at once with EAGAIN)."""
        if self._sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                left = min(max(deadline - time.monotonic(), 1e-3), MAX_TIMEOUT)
                sock.setsockopt(
                    socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", int(left), int(left % 1 * 1e6))
                )
                sock.connect(str(self.path))
            except BlockingIOError:
                sock.close()
                raise TimeoutError("connect timed out: the service's backlog stayed full") from None
            except OSError:
                sock.close()
                raise
            self._sock = sock
        return self._sock

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None


def _closed_by_peer(exc: BaseException) -> bool:
    """The server closed the connection before any byte of the reply (an idle one): worth one reconnect."""
    if isinstance(exc, BrokenPipeError | ConnectionResetError):
        return True
    return isinstance(exc, ProtocolError) and "closed after 0 of 4 bytes" in str(exc)


class LocalTransport:
    """Calls the service's handlers directly, through a msgpack round trip so that answers are the same
    plain data as over the socket. On the thread that records (the scheduler's), it publishes a fresh
    snapshot first, so a single-process script sees everything up to its last step."""

    where = "in-process"

    def __init__(self, state: InspectionState) -> None:
        self.state = state

    def call(self, request: dict[str, Any]) -> Any:
        state = self.state
        if state.view is not None and state.owner_thread == threading.get_ident():
            state.publish(state.view, force=True)
        body = pack_frame(request, MAX_REQUEST_BYTES)[4:]
        reply = handle(state, unpack_request(body))  # the socket's bounds, so both answer alike
        return unpack_body(pack_frame(reply, MAX_RESPONSE_BYTES)[4:])

    def close(self) -> None:
        pass
