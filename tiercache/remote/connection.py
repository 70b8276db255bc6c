"""The remote store's connection: one LMCache L2 adapter, its health key, its replacement and reconnects, and
the counters; what RemoteStore's verbs (store.py: exists, put; loads.py: get) run on.

Provides:
    StoreConnection(config, namespace, reconnect_interval=1.0, clock, max_call_bytes, refuse_for=30.0)
        namespace, per_call, up, reason, stats(), close()
        _usable() -> adapter | None           the adapter when up; when down, a reconnect when one is due
        _replace(adapter, why) -> str | None  fresh connections now (not counted as the store going down);
                                              None when up after it, else why it is down
        _mark_down(adapter, reason)           a transport failure of `adapter`: down, warned once per reason
        _lookup(adapter, keys), _put(adapter, keys, values), _wait(poll), _key(block_hash), _count(**counts)
    MAX_CALL_BYTES, POLL

The contract (bounded calls, when the store is marked down, reconnects, warnings) is store.py's docstring.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch

from tiercache.config_remote import RemoteConfig
from tiercache.remote.format import RemoteMiss, RemoteNamespace
from tiercache.remote.lmcache_api import close_aside, lmcache, memory_obj

logger = logging.getLogger("tiercache.remote.store")  # the store's lines, under the store's name
_HEALTH_HASH = b"tiercache-health"
POLL = 0.0002  # seconds between polls of pending LMCache tasks
_REWARN = 60.0  # seconds: the same down reason is warned about again at most this often
_REPLACING = "replacing its connections after "
MAX_CALL_BYTES = 16 * 2**20  # values per get call: config.timeout bounds one such call


class StoreConnection:
    def __init__(
        self,
        config: RemoteConfig,
        namespace: RemoteNamespace,
        *,
        reconnect_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        max_call_bytes: int = MAX_CALL_BYTES,
        refuse_for: float = 30.0,
    ) -> None:
        self.config = config
        self.namespace = replace(namespace, mac=config.secret)
        self.per_call = max(1, max_call_bytes // self.namespace.value_bytes)  # values per get call
        self.reconnect_interval = reconnect_interval
        self.refuse_for = refuse_for
        self.clock = clock
        self._lmc = lmcache()
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
        self._warned: tuple[str, float] | None = None  # the last down reason warned about, and when
        self._refused: dict[bytes, tuple[float, RemoteMiss]] = {}  # block hash → (until, why), oldest first
        self._health = self._key(_HEALTH_HASH)
        self._log_signing()
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

    # ------------------------------------------------------------------ internals
    @property
    def _ms(self) -> str:
        return f"{self.config.timeout * 1000:g} ms"

    def _key(self, block_hash: bytes) -> Any:
        ns = self.namespace
        return self._lmc.ObjectKey(
            chunk_hash=block_hash, model_name=ns.model_name, kv_rank=ns.rank, cache_salt=ns.salt
        )

    def _lookup(self, adapter: Any, keys: list[Any]) -> tuple[bool, ...] | str:
        """Which keys the store holds (the health key asked last: its absence is a failure), or why none."""
        task = adapter.submit_lookup_and_lock_task([*keys, self._health], {})
        bitmap = self._wait(lambda: adapter.query_lookup_and_lock_result(task))
        if bitmap is None:
            return f"lookup timed out after {self._ms}"
        found = tuple(bool(bitmap.test(i)) for i in range(len(keys)))
        adapter.submit_unlock([k for k, f in zip([*keys, self._health], [*found, True], strict=True) if f])
        if not bitmap.test(len(keys)):
            return "health key not found: store unreachable, restarted or flushed"
        return found

    def _put(self, adapter: Any, keys: list[Any], values: Sequence[torch.Tensor]) -> str | None:
        objs = [memory_obj(self._lmc, v) for v in values]
        task = adapter.submit_store_task(keys, objs)
        done: dict[int, Any] = {}

        def poll() -> Any:
            done.update(adapter.pop_completed_store_tasks())
            return done.get(task)

        result = self._wait(poll)
        if result is None:
            with self._lock:
                if adapter is self._adapter:
                    self._abandoned.append(objs)
            return f"store timed out after {self._ms}"
        return None if result.is_successful() else "store failed (server refused or unreachable)"

    def _wait(self, poll: Callable[[], Any]) -> Any:
        deadline = self.clock() + self.config.timeout
        while True:
            result = poll()
            if result is not None or self.clock() >= deadline:
                return result
            time.sleep(POLL)

    def _replace(self, adapter: Any, why: str) -> str | None:
        """A fresh adapter in place of `adapter` now (not counted as the store going down); None when the
        store is up after it, else why it is down."""
        with self._lock:
            if adapter is self._adapter and self._reason is None:
                self._reason = _REPLACING + why
                self._retry_at = 0.0
                self._stats["replacements"] += 1
        self._usable()
        return self._reason

    def _usable(self) -> Any:
        """The adapter when up; when down, one reconnect attempt per reconnect_interval, counted from the end
        of the last failed one (an attempt on a silent store waits the timeout: callers in between are told
        "down" at once, so requests admitted together pay one timeout, not one each). A caller that meets
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
                    if self._reason is not None:  # the interval counts from the failed attempt's end
                        self._retry_at = self.clock() + self.reconnect_interval
                attempt.set()
        else:
            attempt.wait(self.config.timeout)
        return self._adapter if self._reason is None else None

    def _connect(self) -> None:
        old, self._adapter = self._adapter, None
        if old is not None:  # its threads may still be blocked on a dead or wedged connection: close it aside
            abandoned, self._abandoned = self._abandoned, []
            close_aside(old, abandoned)
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
            self._abandoned.append(health)  # the native client may still read it
            self._set_down(f"writing its health key: {reason}")
            return
        with self._lock:
            was, self._reason, self._warned = self._reason, None, None
            self._stats["connects"] += 1
        if was is not None and was.startswith(_REPLACING):
            logger.debug("tiercache: remote store %s: connections replaced (%s)", self._where, was)
        else:
            logger.info(
                "tiercache: remote store %s up (%s)", self._where, f"was: {was}" if was else "connected"
            )

    @property
    def _where(self) -> str:
        s = self._settings
        return f"{self._type}://{s['host']}:{s['port']}" if "host" in s and "port" in s else self._type

    def _log_signing(self) -> None:
        secret = self.config.secret
        if secret is None:
            logger.warning(
                "tiercache: remote store %s: values carry no MAC (tiers.remote.secret is not set): anyone "
                "who can write the store can change what the engines serve", self._where,
            )  # fmt: skip
        else:
            where = "environment variable" if secret.source == "env" else "file"
            logger.info(
                "tiercache: remote store %s: values signed and checked with HMAC-SHA-256 (secret: %s %s)",
                self._where, where, secret.name,
            )  # fmt: skip

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
            now, failures = self.clock(), self._stats["failures"]
            repeat = (
                self._warned is not None and self._warned[0] == reason and now < self._warned[1] + _REWARN
            )
            if not repeat:
                self._warned = (reason, now)
        log = logger.debug if repeat else logger.warning
        log(
            "tiercache: remote store %s down: %s; blocks are recomputed, retrying every %gs (failures: %d)",
            self._where, reason, self.reconnect_interval, failures,
        )  # fmt: skip

    def _count(self, **counts: int) -> None:
        with self._lock:
            self._stats.update(counts)
