"""RemoteStore.get: one load task per value, so that one bad value costs its own block, and what a value that
failed to load means (the contract: store.py's docstring).

Provides:
    StoreLoads(StoreConnection)
        get(hashes) -> list[torch.Tensor | None], list[RemoteMiss | None]
        refuse(block_hash, miss)     a value the reader refused (header, MAC, checksum): not fetched again
                                     for refuse_for seconds, and rewritten by the next put of the block
        refused(block_hash) -> bool  its value is refused now (a writer puts it even though the key exists)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from tiercache.remote.connection import POLL, StoreConnection
from tiercache.remote.format import BAD_VALUE, DOWN, VANISHED, RemoteMiss
from tiercache.remote.lmcache_api import memory_obj

_MAX_REFUSED = 4096  # blocks remembered as refused
_MAX_RETRIES = 8  # values of one get call tried again alone after several failed together


class StoreLoads(StoreConnection):
    def get(self, hashes: Sequence[bytes]) -> tuple[list[torch.Tensor | None], list[RemoteMiss | None]]:
        values: list[torch.Tensor | None] = []
        misses: list[RemoteMiss | None] = []
        for start in range(0, len(hashes), self.per_call):
            got, why = self._get(hashes[start : start + self.per_call])
            values += got
            misses += why
        return values, misses

    def _get(self, hashes: Sequence[bytes]) -> tuple[list[torch.Tensor | None], list[RemoteMiss | None]]:
        """One call of get (at most per_call values): one load task per value, all waited for together."""
        values: list[torch.Tensor | None] = [None] * len(hashes)
        misses: list[RemoteMiss | None] = [self._still_refused(h) for h in hashes]
        todo = [i for i, miss in enumerate(misses) if miss is None]
        if not todo:
            return values, misses
        adapter = self._usable()
        if adapter is None:
            down = RemoteMiss(DOWN, f"remote store down: {self._reason}")
            return values, [miss or down for miss in misses]
        rows = list(torch.empty(len(todo), self.namespace.value_bytes, dtype=torch.uint8))  # one buffer's
        objs = [memory_obj(self._lmc, row) for row in rows]
        tasks = [
            adapter.submit_load_task([self._key(hashes[i])], [o]) for i, o in zip(todo, objs, strict=True)
        ]
        loaded = self._wait_loads(adapter, tasks)
        failed = [j for j, ok in enumerate(loaded) if not ok]
        self._count(get_failures=len(failed))
        if failed:
            late = [objs[j] for j in failed if loaded[j] is None]  # the native client may still write them
            with self._lock:
                if adapter is self._adapter:
                    self._abandoned.append(late)
            outcome = self._after_failed_loads(
                adapter,
                [hashes[todo[j]] for j in failed],
                [loaded[j] for j in failed],
                [rows[j] for j in failed],
            )
            for j, got in zip(failed, outcome, strict=True):
                loaded[j] = got is None
                misses[todo[j]] = got
        for j, ok in enumerate(loaded):
            if ok:
                values[todo[j]] = rows[j]
        self._count(gets=sum(map(bool, loaded)))
        return values, misses

    def _wait_loads(self, adapter: Any, tasks: list[Any]) -> list[bool | None]:
        """Per task: loaded (True), failed (False), or not done by the deadline (None)."""
        done: list[bool | None] = [None] * len(tasks)
        pending = dict(enumerate(tasks))
        deadline = self.clock() + self.config.timeout
        while pending:
            for j, task in list(pending.items()):
                bitmap = adapter.query_load_result(task)
                if bitmap is not None:
                    done[j] = bool(bitmap.test(0))
                    del pending[j]
            if not pending or self.clock() >= deadline:
                break
            time.sleep(POLL)
        return done

    def _after_failed_loads(
        self, adapter: Any, hashes: list[bytes], loaded: list[bool | None], rows: list[torch.Tensor]
    ) -> list[RemoteMiss | None]:
        """Per failed value: None when a retry loaded it into its row, else why it is a miss. The adapter is
        replaced first (its connections may be wedged or out of step); a lookup on the new one tells a key
        that went away (VANISHED) from a bad value. A value that never arrived is bad (the server always
        answers a GET: only a missing or empty value leaves LMCache's client waiting). A value that failed
        fast is bad when it is the call's only one; with several, the others may have failed only for being
        read on a connection a bad one left out of step, so each is tried again alone on fresh connections
        (at most _MAX_RETRIES of them). Bad values are refused for refuse_for seconds."""
        reason = self._replace(adapter, f"{len(hashes)} value(s) failed to load")
        if reason is not None:
            return [RemoteMiss(DOWN, f"remote store down: {reason}")] * len(hashes)
        present = self._lookup(self._adapter, [self._key(h) for h in hashes])
        if isinstance(present, str):
            self._mark_down(self._adapter, present)
            return [RemoteMiss(DOWN, f"remote {present}")] * len(hashes)
        fast = [i for i, ok in enumerate(loaded) if ok is False and present[i]]
        retry = set(fast[:_MAX_RETRIES]) if len(fast) > 1 else set()
        out: list[RemoteMiss | None] = []
        for i, (block_hash, ok) in enumerate(zip(hashes, loaded, strict=True)):
            if not present[i]:
                miss = RemoteMiss(VANISHED, "value vanished after the lookup (deleted or evicted)")
            elif i in retry:
                miss = self._load_alone(block_hash, rows[i])  # None: it loaded
            elif ok is False and len(fast) > 1:  # perhaps only out of step: not remembered
                out.append(RemoteMiss(BAD_VALUE, "value failed to load along with other bad values"))
                continue
            else:
                miss = self._bad(ok)
            if miss is not None and miss.kind == BAD_VALUE:
                self._refuse(block_hash, miss)
            out.append(miss)
        return out

    def _load_alone(self, block_hash: bytes, row: torch.Tensor) -> RemoteMiss | None:
        """One value loaded on its own into `row`; None when it loaded. A failure replaces the adapter."""
        adapter = self._usable()
        if adapter is None:
            return RemoteMiss(DOWN, f"remote store down: {self._reason}")
        obj = memory_obj(self._lmc, row)
        (ok,) = self._wait_loads(adapter, [adapter.submit_load_task([self._key(block_hash)], [obj])])
        self._count(retried=1)
        if ok:
            return None
        if ok is None:
            with self._lock:
                if adapter is self._adapter:
                    self._abandoned.append([obj])
        self._replace(adapter, "a value failed to load")
        return self._bad(ok)

    def _bad(self, loaded: bool | None) -> RemoteMiss:
        """Why a value that is there failed to load: it never arrived (None) or came of another size."""
        if loaded is None:
            return RemoteMiss(BAD_VALUE, f"value never arrived within {self._ms}: empty or not a value")
        size = self.namespace.value_bytes
        return RemoteMiss(BAD_VALUE, f"value is not {size} bytes (empty, truncated or too long)")

    def refuse(self, block_hash: bytes, miss: RemoteMiss) -> None:
        self._refuse(block_hash, miss)

    def refused(self, block_hash: bytes) -> bool:
        if not self._refused:
            return False
        with self._lock:
            until, _ = self._refused.get(block_hash, (0.0, None))
        return self.clock() < until

    def _refuse(self, block_hash: bytes, miss: RemoteMiss) -> None:
        with self._lock:
            self._refused.pop(block_hash, None)
            self._refused[block_hash] = (self.clock() + self.refuse_for, miss)
            while len(self._refused) > _MAX_REFUSED:
                del self._refused[next(iter(self._refused))]

    def _still_refused(self, block_hash: bytes) -> RemoteMiss | None:
        if not self._refused:
            return None
        with self._lock:
            until, miss = self._refused.get(block_hash, (0.0, None))
            if miss is None or self.clock() >= until:
                self._refused.pop(block_hash, None)
                return None
        self._count(refused_again=1)
        return RemoteMiss(
            miss.kind, f"{miss.reason} (refused again, without a fetch, for {self.refuse_for:g}s)"
        )
