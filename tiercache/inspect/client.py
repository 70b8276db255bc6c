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
        explain_request(request_id=None, prompt_tokens=None) -> RequestExplanation   why a recent request
                                    missed, block by block: by vLLM's request id or the caller's, or by the
                                    prompt's token ids (matched by digest against the recent requests)
        blocks(tier=None, limit=100) -> tuple[BlockRecord, ...]          most recently used first
        ping() -> dict, where (socket path or "in-process"), close(); a context manager
Thread-safe (one request at a time per client). Over a socket, `timeout` bounds each whole request
(connect, send, every byte of the reply), and a connection the server closed while idle (it closes idle
ones after a few seconds) is reconnected once, within the same timeout. Replies are checked: anything
malformed raises InspectError (results.py), never a TypeError or AttributeError.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any

from tiercache.errors import shown
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
    unpack_request,
)
from tiercache.inspect.request_log import prompt_digest
from tiercache.inspect.results import (
    BlockRecord,
    Decision,
    Explanation,
    RequestExplanation,
    Stats,
    TierStats,
    expect_list,
    expect_map,
)
from tiercache.inspect.state import InspectionState, live_states


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
                send_frame(sock, request, MAX_REQUEST_BYTES, deadline)
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
                left = max(deadline - time.monotonic(), 1e-3)
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


def _clip(text: str, limit: int = 1000) -> str:
    """A server's error text as one line of at most `limit` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


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
        ok = reply.get("ok") if isinstance(reply, dict) else None
        if ok is True and "result" in reply:
            return reply["result"]
        if ok is False and isinstance(reply.get("error"), str):
            raise InspectError(f"{self.where}: {method}: {_clip(reply['error'])}")
        raise InspectError(
            f"{self.where}: malformed reply to {method} ({shown(reply, 120)}); is this a tiercache socket of "
            "the same version?"
        )

    def _parsed(self, method: str, parse, **params: Any):
        """parse(result); a reply of the wrong shape → InspectError (results.py checks every field)."""
        result = self._call(method, **params)
        try:
            return parse(result)
        except InspectError as exc:
            raise InspectError(f"{self.where}: {method}: {exc}") from None
        except (TypeError, ValueError, AttributeError, KeyError) as exc:  # a safety net behind the checks
            raise InspectError(
                f"{self.where}: {method}: malformed reply ({type(exc).__name__}: {shown(str(exc), 120)}); is "
                "this a tiercache socket of the same version?"
            ) from None

    def ping(self) -> dict[str, Any]:
        return self._parsed("ping", lambda r: dict(expect_map(r, "ping")))

    def stats(self) -> Stats:
        return self._parsed("stats", Stats.from_dict)

    def tiers(self) -> tuple[TierStats, ...]:
        return self._parsed("tiers", lambda r: tuple(map(TierStats.from_dict, expect_list(r, "tiers"))))

    def decisions(self, limit: int = 50, kinds: list[str] | None = None) -> tuple[Decision, ...]:
        kinds = list(kinds) if kinds is not None else None
        rows = lambda r: tuple(map(Decision.from_dict, expect_list(r, "decisions")))
        return self._parsed("decisions", rows, limit=limit, kinds=kinds)

    def explain(self, block_hash: bytes | str) -> Explanation:
        return self._parsed("explain", Explanation.from_dict, block_hash=block_hash)

    def explain_request(
        self, request_id: str | None = None, prompt_tokens: list[int] | None = None
    ) -> RequestExplanation:
        if (request_id is None) == (prompt_tokens is None):
            raise InspectError(
                "explain_request: pass request_id or prompt_tokens (the prompt's token ids), one"
            )
        if request_id is not None:
            return self._parsed("explain_request", RequestExplanation.from_dict, request_id=str(request_id))
        digest = prompt_digest(list(prompt_tokens))
        return self._parsed("explain_request", RequestExplanation.from_dict, prompt_digest=digest)

    def blocks(self, tier: str | None = None, limit: int = 100) -> tuple[BlockRecord, ...]:
        rows = lambda r: tuple(map(BlockRecord.from_dict, expect_list(r, "blocks")))
        return self._parsed("blocks", rows, tier=tier, limit=limit)

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
