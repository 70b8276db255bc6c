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
    (how it reaches the service: transport.py)
Thread-safe (one request at a time per client). Over a socket, `timeout` bounds each whole request
(connect, send, every byte of the reply), and a connection the server closed while idle (it closes idle
ones after a few seconds) is reconnected once, within the same timeout; a connection the server refused
(too many clients) raises InspectError with the server's reason. Arguments are checked before anything is
sent (params.py, the service's own checks) and replies after (results.py): a bad argument, an error reply
or a malformed reply raises InspectError naming what to do, never a TypeError, UnicodeEncodeError or
OverflowError.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tiercache.errors import shown
from tiercache.inspect import params as check
from tiercache.inspect import paths
from tiercache.inspect.protocol import PROTOCOL_VERSION, InspectError
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
from tiercache.inspect.shapes import RequestError
from tiercache.inspect.state import InspectionState, live_states
from tiercache.inspect.transport import MAX_TIMEOUT, LocalTransport, SocketTransport


def _checked(method: str, checks: Callable[[], Any]) -> Any:
    """checks() (params.py), its RequestError raised as InspectError: nothing is sent."""
    try:
        return checks()
    except RequestError as exc:
        raise InspectError(f"{method}: {exc}") from None


def _clip(text: str, limit: int = 1000) -> str:
    """A server's error text as one line of at most `limit` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


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
        if kinds is not None and not isinstance(kinds, str | bytes) and hasattr(kinds, "__len__"):
            kinds = list(kinds)  # a tuple or a set is fine; a lone string is not a list of kinds
        _checked("decisions", lambda: (check.limit(limit, 50), check.kinds(kinds)))
        rows = lambda r: tuple(map(Decision.from_dict, expect_list(r, "decisions")))
        return self._parsed("decisions", rows, limit=limit, kinds=kinds)

    def explain(self, block_hash: bytes | str) -> Explanation:
        if isinstance(block_hash, bytearray | memoryview):
            block_hash = bytes(block_hash)
        _checked("explain", lambda: check.block_hash(block_hash))
        return self._parsed("explain", Explanation.from_dict, block_hash=block_hash)

    def explain_request(
        self, request_id: str | None = None, prompt_tokens: list[int] | None = None
    ) -> RequestExplanation:
        if prompt_tokens is not None and request_id is None:
            digest = _checked("explain_request", lambda: check.digest_of(prompt_tokens))
            return self._parsed("explain_request", RequestExplanation.from_dict, prompt_digest=digest)
        both = b"" if prompt_tokens is not None else None  # both given, or neither: request_key says so
        _checked("explain_request", lambda: check.request_key(request_id, both))
        return self._parsed("explain_request", RequestExplanation.from_dict, request_id=request_id)

    def blocks(self, tier: str | None = None, limit: int = 100) -> tuple[BlockRecord, ...]:
        _checked("blocks", lambda: (check.tier(tier), check.limit(limit, 100)))
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
    timeout = _timeout(timeout)
    if path is not None:
        return _socket_client(_path(path), timeout)
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


def _timeout(timeout: Any) -> float:
    number = isinstance(timeout, int | float) and not isinstance(timeout, bool)
    if not (number and 0 < timeout <= MAX_TIMEOUT):  # NaN compares false; a huge int compares fine
        raise InspectError(
            f"connect: timeout: expected seconds for each whole request, a number > 0 and ≤ {MAX_TIMEOUT:g} "
            f"(e.g. timeout=5), got {shown(timeout, 60)}"
        )
    return float(timeout)


def _path(path: Any) -> Path:
    try:
        path = Path(os.fsdecode(path)).expanduser()
        os.fsencode(path)  # a lone surrogate that the file system's encoding cannot hold
        if "\0" in str(path):
            raise ValueError("embedded null character")
        return path
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError is a ValueError
        raise InspectError(
            f"connect: path: expected the inspection socket's path (a str or os.PathLike; `tiercache inspect "
            f"--list` shows the live ones), got {shown(path, 80)} ({type(exc).__name__})"
        ) from None


def _socket_client(path: Path, timeout: float) -> InspectClient:
    if not path.exists():
        raise InspectError(
            f"inspection socket {path} does not exist; is the engine running with inspect.socket set to it?"
        )
    return InspectClient(SocketTransport(path, timeout))
