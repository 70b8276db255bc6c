"""Synchronous, bounded-time calls to a remote store through one LMCache L2 adapter; failure is a value.

Provides:
    RemoteStore(config, namespace, reconnect_interval=1.0, max_call_bytes=MAX_CALL_BYTES)
        exists(hashes) -> RemoteAnswer      which blocks the store holds (one batched call + the health key)
        get(hashes) -> list[torch.Tensor | None], list[str | None]   values ([value_bytes] uint8) or why not;
                                            only for blocks exists() found (LMCache's RESP client never
                                            completes a GET of a missing key: it times out here); in calls of
                                            at most max_call_bytes of values each
        put(hashes, values) -> str | None   store values (encode_value's); None when stored, else why not
        up, reason, stats() -> dict[str, int | str]
        close()
    open_store(config, namespace, **kw) -> RemoteStore   (TierCacheError naming the install command when
                                            LMCache is missing)

Why the L2 adapter: it is the interface every LMCache storage backend implements (Redis/Valkey through the
native RESP client, Mooncake, S3, file systems, NIXL) and the one third parties extend
(register_l2_adapter_factory). Calling adapters by their config (tiers.remote.url → LMCache's "resp" type,
tiers.remote.adapter → any registered type) keeps every one of them open to users; the RemoteConnector is
the legacy, asyncio-bound engine path, and LMCacheRedisClient alone would tie the tier to Redis.

Every call waits at most config.timeout; a get moves at most max_call_bytes of values per call (16 MiB: an
8K-token prefix of an 8B model is ~420 MB, more than any timeout of tens of milliseconds could cover in one
call, while 16 MiB needs only ~0.3 GB/s within the 50 ms default). A timeout, a failed batch, or the health
key missing from a lookup (the store was restarted, flushed or is unreachable: LMCache's lookups answer "not
found" then) marks the store down: calls return at once with the reason (a miss, or a failed write) and, at
most every reconnect_interval, one call builds a fresh adapter and writes the health key; success brings it
back up.
Buffers of a timed-out call stay referenced until their adapter is closed (the native client may still
write them). Thread-safe; put is called from one thread at a time.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tiercache.config_remote import INSTALL_HINT, RemoteConfig
from tiercache.errors import TierCacheError
from tiercache.remote.format import RemoteNamespace

logger = logging.getLogger(__name__)
_HEALTH_HASH = b"tiercache-health"
_POLL = 0.0002  # seconds between polls of a pending LMCache task
MAX_CALL_BYTES = 16 * 2**20  # values per get call: config.timeout bounds one such call


@dataclass(frozen=True)
class RemoteAnswer:
    found: tuple[bool, ...]  # per block asked
    reason: str | None = None  # why every block is a miss (store down, timed out); None: the store answered


class RemoteStore:
    def __init__(
        self,
        config: RemoteConfig,
        namespace: RemoteNamespace,
        *,
        reconnect_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        max_call_bytes: int = MAX_CALL_BYTES,
    ) -> None:
        self.config = config
        self.per_call = max(1, max_call_bytes // namespace.value_bytes)  # values per get call
        self.namespace = namespace
        self.reconnect_interval = reconnect_interval
        self.clock = clock
        self._lmc = _lmcache()
        self._type, self._settings = config.adapter_settings()
        self._adapter: Any = None
        self._abandoned: list[Any] = []  # buffers of timed-out calls on the current adapter
        self._reason: str | None = "not connected yet"
        self._retry_at = 0.0
        self._attempt: threading.Event | None = None  # the reconnect in flight (set when it is done)
        self._lock = threading.Lock()  # the adapter, its state and the counters
        self._put_lock = threading.Lock()  # store completions are popped all at once: one putter
        self._stats: Counter[str] = Counter()
        self._last_error = ""
        self._health = self._key(_HEALTH_HASH)
        self._connect()

    # ------------------------------------------------------------------ state
    @property
    def up(self) -> bool:
        return self._reason is None

    @property
    def reason(self) -> str | None:
        return self._reason

    def stats(self) -> dict[str, int | str]:
        with self._lock:
            return {**self._stats, "up": int(self.up), "last_error": self._last_error}

    def close(self) -> None:
        with self._lock:
            adapter, self._adapter = self._adapter, None
            self._reason = "closed"
        if adapter is not None:
            adapter.close()
        self._abandoned.clear()

    # ------------------------------------------------------------------ calls
    def exists(self, hashes: Sequence[bytes]) -> RemoteAnswer:
        adapter = self._usable()
        if adapter is None:
            return RemoteAnswer((False,) * len(hashes), f"remote store down: {self._reason}")
        keys = [self._key(h) for h in hashes]
        task = adapter.submit_lookup_and_lock_task([*keys, self._health], {})
        bitmap = self._wait(lambda: adapter.query_lookup_and_lock_result(task))
        if bitmap is None:
            return self._miss(adapter, hashes, f"lookup timed out after {self._ms}")
        found = tuple(bool(bitmap.test(i)) for i in range(len(keys)))
        adapter.submit_unlock([k for k, f in zip([*keys, self._health], [*found, True], strict=True) if f])
        if not bitmap.test(len(keys)):
            return self._miss(
                adapter, hashes, "health key not found: store unreachable, restarted or flushed"
            )
        self._count(lookups=len(keys), lookup_hits=sum(found))
        return RemoteAnswer(found)

    def get(self, hashes: Sequence[bytes]) -> tuple[list[torch.Tensor | None], list[str | None]]:
        values: list[torch.Tensor | None] = []
        reasons: list[str | None] = []
        for start in range(0, len(hashes), self.per_call):
            got, why = self._get(hashes[start : start + self.per_call])
            values += got
            reasons += why
        return values, reasons

    def put(self, hashes: Sequence[bytes], values: Sequence[torch.Tensor]) -> str | None:
        with self._put_lock:
            adapter = self._usable()
            if adapter is None:
                self._count(put_failures=len(hashes))
                return f"remote store down: {self._reason}"
            reason = self._put(adapter, [self._key(h) for h in hashes], values)
            if reason is not None:
                self._count(put_failures=len(hashes))
                self._mark_down(adapter, reason)
                return reason
            self._count(puts=len(hashes))
            return None

    # ------------------------------------------------------------------ internals
    def _get(self, hashes: Sequence[bytes]) -> tuple[list[torch.Tensor | None], list[str | None]]:
        """One call of get (at most per_call values); after a timeout the store is down and the rest of a
        get returns at once."""
        n = len(hashes)
        adapter = self._usable()
        if adapter is None:
            return [None] * n, [f"remote store down: {self._reason}"] * n
        values = list(torch.empty(n, self.namespace.value_bytes, dtype=torch.uint8))  # rows of one buffer
        objs = [_memory_obj(self._lmc, v) for v in values]
        task = adapter.submit_load_task([self._key(h) for h in hashes], objs)
        bitmap = self._wait(lambda: adapter.query_load_result(task))
        if bitmap is None:
            self._abandon(adapter, objs, f"load timed out after {self._ms}")
            self._count(get_failures=n)
            return [None] * n, [f"remote load timed out after {self._ms}"] * n
        ok = [bool(bitmap.test(i)) for i in range(n)]
        self._count(gets=sum(ok), get_failures=n - sum(ok))
        return (
            [v if o else None for v, o in zip(values, ok, strict=True)],
            [None if o else "not loaded (missing, or a value of another size)" for o in ok],
        )

    @property
    def _ms(self) -> str:
        return f"{self.config.timeout * 1000:g} ms"

    def _key(self, block_hash: bytes) -> Any:
        ns = self.namespace
        return self._lmc.ObjectKey(
            chunk_hash=block_hash, model_name=ns.model_name, kv_rank=ns.rank, cache_salt=ns.salt
        )

    def _put(self, adapter: Any, keys: list[Any], values: Sequence[torch.Tensor]) -> str | None:
        objs = [_memory_obj(self._lmc, v) for v in values]
        task = adapter.submit_store_task(keys, objs)
        done: dict[int, Any] = {}

        def poll() -> Any:
            done.update(adapter.pop_completed_store_tasks())
            return done.get(task)

        result = self._wait(poll)
        if result is None:
            self._abandon(adapter, objs, f"store timed out after {self._ms}")
            return f"store timed out after {self._ms}"
        return None if result.is_successful() else "store failed (server refused or unreachable)"

    def _wait(self, poll: Callable[[], Any]) -> Any:
        deadline = self.clock() + self.config.timeout
        while True:
            result = poll()
            if result is not None or self.clock() >= deadline:
                return result
            time.sleep(_POLL)

    def _usable(self) -> Any:
        """The adapter when up; when down, one reconnect attempt per reconnect_interval. A caller that meets
        another thread's reconnect in flight waits for it (at most the timeout) and takes its outcome: the
        first call after the store is back is served, not told "down"."""
        if self._reason is None:
            return self._adapter
        with self._lock:
            attempt, mine = self._attempt, False
            if self._reason is None or self._reason == "closed":
                return self._adapter if self._reason is None else None
            if attempt is None:
                if self.clock() < self._retry_at:
                    return None
                self._retry_at = self.clock() + self.reconnect_interval
                attempt = self._attempt = threading.Event()
                mine = True
        if mine:
            try:
                self._connect()
            finally:
                with self._lock:
                    self._attempt = None
                attempt.set()
        else:
            attempt.wait(self.config.timeout)
        return self._adapter if self._reason is None else None

    def _connect(self) -> None:
        old, self._adapter = self._adapter, None
        if old is not None:  # its threads may still be blocked on a dead connection: close it aside
            abandoned, self._abandoned = self._abandoned, []
            threading.Thread(target=_close, args=(old, abandoned), daemon=True).start()
        try:
            adapter = self._lmc.create_l2_adapter(
                self._lmc.config_class(self._type).from_dict(self._settings)
            )
        except Exception as exc:
            self._set_down(f"cannot create LMCache {self._type!r} adapter: {exc}")
            return
        health = torch.zeros(16, dtype=torch.uint8)
        reason = self._put(adapter, [self._health], [health])
        self._adapter = adapter
        if reason is not None:
            self._set_down(f"{reason} ({self._where})")
            return
        with self._lock:
            was, self._reason = self._reason, None
            self._stats["connects"] += 1
        logger.info("tiercache: remote store %s up (%s)", self._where, f"was: {was}" if was else "connected")

    @property
    def _where(self) -> str:
        s = self._settings
        return f"{self._type}://{s['host']}:{s['port']}" if "host" in s and "port" in s else self._type

    def _miss(self, adapter: Any, hashes: Sequence[bytes], reason: str) -> RemoteAnswer:
        self._count(lookup_failures=len(hashes))
        self._mark_down(adapter, reason)
        return RemoteAnswer((False,) * len(hashes), f"remote {reason}")

    def _abandon(self, adapter: Any, objs: list[Any], reason: str) -> None:
        with self._lock:
            if adapter is self._adapter:
                self._abandoned.append(objs)
        self._mark_down(adapter, reason)

    def _mark_down(self, adapter: Any, reason: str) -> None:
        with self._lock:
            if adapter is not self._adapter or self._reason is not None:
                return  # an older adapter's failure, or already down
            self._retry_at = self.clock() + self.reconnect_interval
        self._set_down(reason)

    def _set_down(self, reason: str) -> None:
        with self._lock:
            self._reason = reason
            self._stats["failures"] += 1
            self._last_error = reason
        logger.warning(
            "tiercache: remote store %s down: %s; blocks are recomputed, retrying every %gs",
            self._where, reason, self.reconnect_interval,
        )  # fmt: skip

    def _count(self, **counts: int) -> None:
        with self._lock:
            self._stats.update(counts)


def _close(adapter: Any, abandoned: list[Any]) -> None:
    try:
        adapter.close()
    except Exception:
        logger.exception("tiercache: closing a failed remote adapter")
    abandoned.clear()


def _memory_obj(lmc: Any, tensor: torch.Tensor) -> Any:
    """An LMCache memory object over a contiguous CPU uint8 tensor (no copy)."""
    assert tensor.is_contiguous() and tensor.device.type == "cpu" and tensor.dtype == torch.uint8
    meta = lmc.MemoryObjMetadata(
        shape=tensor.shape, dtype=tensor.dtype, address=0, phy_size=tensor.numel(), ref_count=1
    )
    return lmc.TensorMemoryObj(tensor, meta, None)


class _LMCache:
    """The LMCache names this module uses, imported once."""

    def __init__(self) -> None:
        api = importlib.import_module("lmcache.v1.distributed.api")
        mm = importlib.import_module("lmcache.v1.memory_management")
        adapters = importlib.import_module("lmcache.v1.distributed.l2_adapters")
        config = importlib.import_module("lmcache.v1.distributed.l2_adapters.config")
        self.ObjectKey = api.ObjectKey
        self.MemoryObjMetadata = mm.MemoryObjMetadata
        self.TensorMemoryObj = mm.TensorMemoryObj
        self.create_l2_adapter = adapters.create_l2_adapter
        self.config_class = config.get_l2_adapter_config_class


_LMC: _LMCache | None = None


def _lmcache() -> _LMCache:
    global _LMC
    if _LMC is None:
        try:
            _LMC = _LMCache()
        except ImportError as exc:
            raise TierCacheError(
                f"the remote tier needs LMCache ({exc}); install it with {INSTALL_HINT}"
            ) from None
    return _LMC


def open_store(config: RemoteConfig, namespace: RemoteNamespace, **kwargs: Any) -> RemoteStore:
    """A RemoteStore for tiers.remote; it starts down (and retries) when the store cannot be reached."""
    return RemoteStore(config, namespace, **kwargs)
