"""The TierManager's remote-tier verbs (scheduler side): which blocks go up to the remote store, and DRAM
slots for blocks fetched from it. A mixin of ManagerCore (core.py); TierManager (manager.py) combines it with
the other verb groups. The store itself is the connector's (tiercache.remote).

Provides:
    RemoteVerbs (remote_write "through" | "evicted" | "reused" | None: tiers.remote.write)
        take_uploads() -> list[RemoteItem]  blocks that go up, each with the tier and slot it is in when
                                            queued (ManagerCore._upload): "through": every block when its
                                            store completes (complete_store); "reused": at its first hit
                                            (prepare_load); "evicted": when dropped from DRAM (_apply);
                                            never a block that came from the store
        prepare_fetch(hashes, source=REMOTE) -> PrepareLoadOutput | None   reserve DRAM slots for blocks
                                            the remote store (or the disk tier: source DISK) holds, pinned
                                            as loads (None: no room, or a block is known here)
        complete_fetch(hashes, ok, reason, source=REMOTE)  the fetch and its load are done: ready in DRAM,
                                            or released
A block fetched from either is marked from_remote: the remote store is never written it again.
"""

from __future__ import annotations

from collections.abc import Sequence

from tiercache.scheduler.abstract import PrepareLoadOutput
from tiercache.scheduler.blocks import BlockEntry
from tiercache.scheduler.core import ManagerCore
from tiercache.scheduler.events import MissEvent, StoreEvent
from tiercache.wire import DRAM, REMOTE, RemoteItem


class RemoteVerbs(ManagerCore):
    def take_uploads(self) -> list[RemoteItem]:
        uploads, self._uploads = self._uploads, []
        return uploads

    def prepare_fetch(self, hashes: Sequence[bytes], source: str = REMOTE) -> PrepareLoadOutput | None:
        """All or nothing: fresh DRAM slots (room made by DRAM drops) for blocks found in the remote store,
        each entry pinned by its load (refs 1) and not ready until complete_fetch. None (a MissEvent per
        block says why): no DRAM room, or a block already has an entry here (stored or in flight)."""
        known = next((h for h in hashes if h in self._index), None)
        if known is not None or len(set(hashes)) < len(hashes):
            return self._fetch_refused(hashes, "a block is already stored here or asked twice", source)
        self._apply(self._mover.dram_room(len(hashes)))
        if self._alloc[DRAM].num_free < len(hashes):
            return self._fetch_refused(hashes, f"no DRAM room for {len(hashes)} blocks", source)
        slots = self._alloc[DRAM].allocate(len(hashes))
        now = self.clock()
        for block_hash, slot in zip(hashes, slots, strict=True):
            entry = BlockEntry(
                block_hash, self.codec_id, DRAM, slot, now, now, refs=1, hits=1, from_remote=True
            )
            self._index.add(entry)
        return PrepareLoadOutput(tuple(hashes), (DRAM,) * len(hashes), tuple(slots))

    def _fetch_refused(self, hashes: Sequence[bytes], reason: str, source: str) -> None:
        for block_hash in hashes:
            self._emit(MissEvent, block_hash, f"{source} fetch refused: {reason}")

    def complete_fetch(
        self, hashes: Sequence[bytes], ok: bool = True, reason: str = "", source: str = REMOTE
    ) -> None:
        """ok: fetched and loaded on every rank → ready in DRAM; else released (slot freed, a StoreEvent
        with stored=False and the reason). ValueError if a block has no fetch in flight."""
        for block_hash in hashes:
            entry = self._index.get(block_hash)
            if entry is None or entry.ready or entry.refs != 1 or not entry.from_remote:
                raise ValueError(f"complete_fetch: block {block_hash.hex()[:16]} has no fetch in flight")
            entry.refs = 0
            if ok:
                self._index.mark_ready(entry)
                what = "fetched from the remote store" if source == REMOTE else f"read from the {source} tier"
                self._emit(StoreEvent, block_hash, what, tier=DRAM, slot=entry.slot)
            else:
                self._release_store(entry, f"{source} fetch failed: {reason or 'on a worker'}")
