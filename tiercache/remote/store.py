"""Synchronous, bounded-time calls to a remote store through one LMCache L2 adapter; failure is a value.

Provides:
    RemoteStore(config, namespace, reconnect_interval=1.0, max_call_bytes=MAX_CALL_BYTES, refuse_for=30.0)
        namespace                           the caller's, with config.secret as its MAC key (keys and values
                                            of signed and unsigned engines differ: format.py)
        exists(hashes) -> RemoteAnswer      which blocks the store holds (one batched call + the health key)
        get(hashes) -> list[torch.Tensor | None], list[RemoteMiss | None]   values ([value_bytes] uint8) or
                                            why not, per block; only for blocks exists() found; in calls of at
                                            most max_call_bytes of values each
        put(hashes, values) -> str | None   store values (encode_value's); None when stored, else why not
        new_value() -> [value_bytes] uint8  a buffer for one value (the writer encodes into it)
        release(values)                     values the writer is done with: dropped, never reused (a put that
                                            timed out may still be read by the adapter later)
        refuse(hash, miss), refused(hash)   a value its reader refused: not fetched again for refuse_for
                                            seconds; a writer rewrites it even though its key exists
        up, reason, stats() -> dict[str, int | str], tier_name "remote"
        close()
    open_store(config, namespace, **kw) -> RemoteStore   (TierCacheError naming the install command when
                                            LMCache is missing)
RemoteStore's parts: connection.py (the adapter, its replacement, reconnects, counters), loads.py (get), here
exists and put.

Why the L2 adapter: it is the interface every LMCache storage backend implements (Redis/Valkey through the
native RESP client, Mooncake, S3, file systems, NIXL) and the one third parties extend
(register_l2_adapter_factory). Calling adapters by their config (tiers.remote.url → LMCache's "resp" type,
tiers.remote.adapter → any registered type) keeps every one of them open to users; the RemoteConnector is
the legacy, asyncio-bound engine path, and LMCacheRedisClient alone would tie the tier to Redis.

Every call waits at most config.timeout; a get moves at most max_call_bytes of values per call (16 MiB: an
8K-token prefix of an 8B model is ~420 MB, more than any timeout of tens of milliseconds could cover in one
call, while 16 MiB needs only ~0.3 GB/s within the 50 ms default).

One bad value costs one block, never the store. A get submits one load per value, so a value that never
arrives holds up only itself: the others of the call are served. LMCache 0.5.6's RESP client waits forever on
a key that went away after the lookup or holds an empty value, and stops reading mid-reply on a value of
another size (the connection is then out of step with the server), so after any value fails to load the
adapter is replaced at once (fresh connections, the health key written; at most one more timeout), and a
lookup on the new one names the cause: VANISHED (the key is gone: deleted or evicted) or BAD_VALUE (empty, or
of another size). When several values of a call failed fast, some may have failed only for being read on a
connection a bad one left out of step: each (up to 8) is loaded again alone on fresh connections, and served
if it loads. A block whose value failed so is refused without a fetch for refuse_for seconds (each try would
cost a timeout and a replacement), unless this store writes it again. stats() counts get_failures,
replacements, retried and refused_again; what a value's header, MAC and checksum say is the reader's
(worker/remote_io.py).
The store is marked down only on transport failure: a lookup timing out, the health key missing from a lookup
(the store was restarted, flushed or is unreachable: LMCache's lookups answer "not found" then), a put
failing or timing out, or a replacement that cannot write the health key. While down, calls return at once
with the reason (a miss, or a failed write) and, once reconnect_interval has passed since the store went down
or the last attempt failed, one call builds a fresh adapter and writes the health key (on a silent store that
call waits the timeout: no two attempts follow each other without an interval between them); success brings
it back up. Going down is a warning naming the cause; a
retry failing the same way is counted (stats "failures") and logged at debug level, repeated as a warning at
most every 60 s.
Buffers of a timed-out call stay referenced until their adapter is closed (the native client may still
write them). Thread-safe; put is called from one thread at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tiercache.config_remote import RemoteConfig
from tiercache.remote.connection import MAX_CALL_BYTES
from tiercache.remote.format import RemoteNamespace
from tiercache.remote.loads import StoreLoads

__all__ = ["MAX_CALL_BYTES", "RemoteAnswer", "RemoteStore", "open_store"]


@dataclass(frozen=True)
class RemoteAnswer:
    found: tuple[bool, ...]  # per block asked
    reason: str | None = None  # why every block is a miss (store down, timed out); None: the store answered


class RemoteStore(StoreLoads):
    tier_name = "remote"  # the tier in the reasons and log lines of the code it shares with the disk tier

    # ------------------------------------------------------------------ calls
    def exists(self, hashes: Sequence[bytes]) -> RemoteAnswer:
        adapter = self._usable()
        if adapter is None:
            return RemoteAnswer((False,) * len(hashes), f"remote store down: {self._reason}")
        found = self._lookup(adapter, [self._key(h) for h in hashes])
        if isinstance(found, str):
            self._count(lookup_failures=len(hashes))
            self._mark_down(adapter, found)
            return RemoteAnswer((False,) * len(hashes), f"remote {found}")
        self._count(lookups=len(hashes), lookup_hits=sum(found))
        return RemoteAnswer(found)

    def new_value(self) -> torch.Tensor:
        return torch.empty(self.namespace.value_bytes, dtype=torch.uint8)

    def release(self, values: Sequence[torch.Tensor]) -> None:
        """Nothing is reused: an abandoned store task (connection.py) may still read its values."""

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
            with self._lock:
                for h in hashes:  # its value is ours again
                    self._refused.pop(h, None)
            return None


def open_store(config: RemoteConfig, namespace: RemoteNamespace, **kwargs: Any) -> RemoteStore:
    """A RemoteStore for tiers.remote; it starts down (and retries) when the store cannot be reached."""
    return RemoteStore(config, namespace, **kwargs)
