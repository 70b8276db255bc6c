"""The inspection client: the same typed API over a Unix socket or on this process's live state.

Provides:
    connect(path=None, *, in_process=None, state=None, timeout=5.0) -> InspectClient
        state given: bound to that InspectionState (in-process).
        path given: that socket. in_process=True: this process's newest live InspectionState (single-process
        vLLM, tests, notebooks). Neither: $TIERCACHE_INSPECT_SOCKET, else a live in-process state, else the
        socket discovery of paths.py (`latest` pointer, newest live socket); InspectError says where
        it looked.
    InspectClient
        stats() -> Stats            tiers() -> tuple[TierStats, ...]
        decisions(limit=50, kinds=None) -> tuple[Decision, ...]          newest first
        explain(block_hash) -> Explanation      bytes, or hex (a unique prefix of a recent hash is enough)
        blocks(tier=None, limit=100) -> tuple[BlockRecord, ...]          most recently used first
        ping() -> dict, where (socket path or "in-process"), close(); a context manager
Thread-safe (one request at a time per client). Over a socket, a dropped connection is retried once.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from pathlib import Path
from typing import Any

from tiercache.inspect import paths
from tiercache.inspect.handlers import handle
from tiercache.inspect.protocol import (
    MAX_REQUEST_BYTES,
    MAX_RESPONSE_BYTES,
    PROTOCOL_VERSION,
    InspectError,
    ProtocolError,
    pack_frame,
    recv_frame,
    send_frame,
    unpack_body,
)
from tiercache.inspect.results import BlockRecord, Decision, Explanation, Stats, TierStats
from tiercache.inspect.state import InspectionState, live_states


class SocketTransport:
    def __init__(self, path: Path, timeout: float) -> None:
        self.path, self.timeout = path, timeout
        self._sock: socket.socket | None = None

    @property
    def where(self) -> str:
        return str(self.path)

    def call(self, request: dict[str, Any]) -> Any:
        for attempt in (0, 1):
            try:
                sock = self._connect()
                send_frame(sock, request, MAX_REQUEST_BYTES)
                return recv_frame(sock, MAX_RESPONSE_BYTES)
            except (OSError, ProtocolError) as exc:
                self.close()
                if attempt or isinstance(exc, socket.timeout | ProtocolError):
                    raise InspectError(
                        f"inspection request to {self.path} failed ({exc}); is the engine still running? "
                        "Check the socket path (tiercache inspect --socket PATH)"
                    ) from None
        raise AssertionError("unreachable")

    def _connect(self) -> socket.socket:
        if self._sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout)
            try:
                sock.connect(str(self.path))
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
        reply = handle(state, unpack_body(body))
        return unpack_body(pack_frame(reply, MAX_RESPONSE_BYTES)[4:])

    def close(self) -> None:
        pass


class InspectClient:
    def __init__(self, transport: SocketTransport | LocalTransport) -> None:
        self._transport = transport
        self._lock = threading.Lock()

    @property
    def where(self) -> str:
        return self._transport.where

    def _call(self, method: str, **params: Any) -> Any:
        request = {"v": PROTOCOL_VERSION, "method": method, "params": params}
        with self._lock:
            reply = self._transport.call(request)
        if not isinstance(reply, dict) or "ok" not in reply:
            raise InspectError(f"{self.where}: malformed reply {reply!r}; is this a tiercache socket?")
        if not reply["ok"]:
            raise InspectError(f"{self.where}: {method}: {reply.get('error')}")
        return reply["result"]

    def ping(self) -> dict[str, Any]:
        return self._call("ping")

    def stats(self) -> Stats:
        return Stats.from_dict(self._call("stats"))

    def tiers(self) -> tuple[TierStats, ...]:
        return tuple(TierStats.from_dict(t) for t in self._call("tiers"))

    def decisions(self, limit: int = 50, kinds: list[str] | None = None) -> tuple[Decision, ...]:
        rows = self._call("decisions", limit=limit, kinds=list(kinds) if kinds is not None else None)
        return tuple(Decision.from_dict(d) for d in rows)

    def explain(self, block_hash: bytes | str) -> Explanation:
        return Explanation.from_dict(self._call("explain", block_hash=block_hash))

    def blocks(self, tier: str | None = None, limit: int = 100) -> tuple[BlockRecord, ...]:
        return tuple(BlockRecord.from_dict(b) for b in self._call("blocks", tier=tier, limit=limit))

    def close(self) -> None:
        self._transport.close()

    def __enter__(self) -> InspectClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"InspectClient({self.where})"


def connect(
    path: str | Path | None = None,
    *,
    in_process: bool | None = None,
    state: InspectionState | None = None,
    timeout: float = 5.0,
) -> InspectClient:
    if state is not None:
        return InspectClient(LocalTransport(state))
    if path is not None:
        return _socket_client(Path(path).expanduser(), timeout)
    if in_process is not False:
        states = live_states()
        if in_process and not states:
            raise InspectError(
                "connect(in_process=True): no live InspectionState in this process; is the tiercache "
                "connector running here (VLLM_ENABLE_V1_MULTIPROCESSING=0)? Otherwise connect() to its socket"
            )
        if states and (in_process or not os.environ.get(paths.SOCKET_ENV)):
            published = [s for s in states if s.snapshot is not None]
            return InspectClient(LocalTransport((published or states)[0]))
    found = paths.discover()
    if found is None:
        looked = ", ".join(str(d) for d in paths.socket_dirs())
        raise InspectError(
            f"no tiercache inspection socket found (looked in {looked} and ${paths.SOCKET_ENV}); start vLLM "
            "with the tiercache connector (inspect.socket: auto), or pass the path: connect('/path/to.sock') "
            "or tiercache inspect --socket PATH"
        )
    return _socket_client(found, timeout)


def _socket_client(path: Path, timeout: float) -> InspectClient:
    if not path.exists():
        raise InspectError(
            f"inspection socket {path} does not exist; is the engine running with inspect.socket set to it?"
        )
    return InspectClient(SocketTransport(path, timeout))
