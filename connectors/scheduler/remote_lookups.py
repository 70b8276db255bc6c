"""The remote store's existence calls off the scheduler's thread: vLLM asks get_num_new_matched_tokens again
every step while it answers None (the request waits, the others are scheduled), so a slow or silent store
delays only the requests that asked it, never the engine's steps.

Provides:
    RemoteLookups(store, first_wait=FIRST_WAIT_S)
        found(request_id, hashes) -> RemoteAnswer | None   the store's answer for these blocks of this
                                    request, or None while it is being asked (the first ask waits up to
                                    first_wait for it: a store on the loopback or the LAN answers within it,
                                    so a healthy store costs no step; later asks do not wait). Asking for
                                    other blocks than the call in flight asks again.
        forget(request_id)          the request ended: its call's answer is not wanted
        close()                     stop the lookup thread (calls in flight end within the store's timeout)

The store bounds each call by tiers.remote.timeout and answers "none" when it is down or slow; a call that
raises is raised to the caller once (the connector treats that lookup as a miss).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from tiercache.remote.store import RemoteAnswer, RemoteStore

FIRST_WAIT_S = 0.002


@dataclass(frozen=True)
class _Call:
    hashes: tuple[bytes, ...]
    future: Future


class RemoteLookups:
    def __init__(self, store: RemoteStore, first_wait: float = FIRST_WAIT_S) -> None:
        self.store = store
        self.first_wait = first_wait
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="tiercache-remote-lookup")
        self._calls: dict[str, _Call] = {}

    def found(self, request_id: str, hashes: Sequence[bytes]) -> RemoteAnswer | None:
        call = self._calls.get(request_id)
        wait = 0.0
        if call is None or call.hashes != tuple(hashes):
            future = self._thread.submit(self.store.exists, list(hashes))
            call = self._calls[request_id] = _Call(tuple(hashes), future)
            wait = self.first_wait
        try:
            return call.future.result(timeout=wait)
        except futures.TimeoutError:
            return None
        finally:
            if call.future.done():
                self._calls.pop(request_id, None)

    def forget(self, request_id: str) -> None:
        self._calls.pop(request_id, None)

    def close(self) -> None:
        self._calls.clear()
        self._thread.shutdown(wait=False, cancel_futures=True)
