"""The TierManager's read verbs (scheduler side): lookups, loads and warms. A mixin of ManagerCore (core.py);
TierManager (manager.py) combines it with the other verb groups.

Provides:
    LoadVerbs
        lookup(hashes, codec_id=None, record=True) -> int    leading blocks ready and of this codec (hit/miss
                                                             events unless record=False)
        where(hashes) -> [(tier, why not readable)]          per block; no events, no state change
        info(hash) -> BlockInfo | None                       where a block is and how it has been used
        prepare_load(hashes) -> PrepareLoadOutput | None     pins the blocks, warms those in DRAM; None (one
                                                             MissEvent says why): a block is not readable
        complete_load(hashes, ok=True, reason="")            unpins; ok=False: bad, dropped once idle
        touch(hashes)                                        marks recently used
        prefetch(hashes) -> int                              warms planned for blocks idle in DRAM

A warm of a load hit may take every free VRAM slot (the watermark is restored by spills right after); a
prefetch keeps the watermark free.
"""

from __future__ import annotations

from collections.abc import Sequence

from tiercache.scheduler.abstract import PrepareLoadOutput
from tiercache.scheduler.blocks import BlockEntry
from tiercache.scheduler.core import ManagerCore, logger
from tiercache.scheduler.events import HitEvent, MissEvent
from tiercache.scheduler.policies import BlockInfo
from tiercache.wire import DRAM, VRAM


class LoadVerbs(ManagerCore):
    def lookup(self, hashes: Sequence[bytes], codec_id: str | None = None, record: bool = True) -> int:
        """Number of leading blocks stored, ready and of this codec. record=False: no hit/miss events
        (for callers that ask again about the same request every step)."""
        codec_id = codec_id or self.codec_id
        for n, block_hash in enumerate(hashes):
            entry = self._index.get(block_hash)
            reason = entry.unreadable(codec_id) if entry is not None else "not stored"
            if reason:
                if record:
                    self._emit(MissEvent, block_hash, reason)
                return n
            if record:
                self._emit(HitEvent, block_hash, "lookup", tier=entry.tier, slot=entry.slot)
        return len(hashes)

    def where(self, hashes: Sequence[bytes]) -> list[tuple[str | None, str | None]]:
        """(tier, why a load cannot be served now) per block: (None, "not stored"), (tier, None) when
        readable. No events, no state change (for the per-request record of inspection)."""
        out = []
        for block_hash in hashes:
            entry = self._index.get(block_hash)
            out.append(
                (None, "not stored") if entry is None else (entry.tier, entry.unreadable(self.codec_id))
            )
        return out

    def info(self, block_hash: bytes) -> BlockInfo | None:
        """Where a block is and how it has been used (None if not stored)."""
        entry = self._index.get(block_hash)
        return None if entry is None else entry.info()

    def prepare_load(self, hashes: Sequence[bytes]) -> PrepareLoadOutput | None:
        entries = [self._index.get(h) for h in hashes]
        for block_hash, entry in zip(hashes, entries, strict=True):
            reason = entry.unreadable(self.codec_id) if entry is not None else "not stored"
            if reason:
                logger.info("tiercache: load refused: block %s %s", block_hash.hex()[:16], reason)
                self._emit(MissEvent, block_hash, f"load refused: {reason}")
                return None
        now = self.clock()
        for entry in entries:
            entry.refs += 1
            entry.hits += 1
            self._index.touch(entry, now)
            if entry.hits == 1:  # its first reuse; pinned by this load until the upload has read it
                self._upload(entry, "reused")
        out = PrepareLoadOutput(tuple(hashes), tuple(e.tier for e in entries), tuple(e.slot for e in entries))
        try:
            self._warm([e for e in entries if e.tier == DRAM], "load hit in dram", reserve=0)
            self._apply(self._mover.vram_room(0, self._jobs.leaving(VRAM)))
        except Exception:  # the caller never learns of these pins: release them
            self.complete_load(hashes)
            raise
        return out

    def complete_load(self, hashes: Sequence[bytes], ok: bool = True, reason: str = "") -> None:
        """reason: why the load failed (recorded on the block's DropEvent)."""
        for block_hash in hashes:
            entry = self._index.get(block_hash)
            if entry is None or entry.refs <= 0:
                raise ValueError(f"complete_load: block {block_hash.hex()[:16]} has no load in flight")
            entry.refs -= 1
            if not ok:
                entry.bad = f"load failed ({reason})" if reason else "load failed"
            if entry.refs == 0:
                self._release_retired(entry)
            if entry.bad and entry.idle:
                self._drop(entry, f"{entry.bad}: block will be recomputed")

    def touch(self, hashes: Sequence[bytes]) -> None:
        now = self.clock()
        for block_hash in hashes:
            entry = self._index.get(block_hash)
            if entry is not None:
                self._index.touch(entry, now)

    def prefetch(self, hashes: Sequence[bytes]) -> int:
        """Plan warms for the given blocks that sit idle in DRAM; returns how many were planned."""
        entries = [self._index.get(h) for h in hashes]
        todo = [e for e in entries if e and e.tier == DRAM and e.ready and not e.bad]
        return self._warm(todo, "prefetch", reserve=self._mover.watermark)

    def _warm(self, entries: list[BlockEntry], reason: str, reserve: int) -> int:
        """Warm idle DRAM blocks into free VRAM, leaving `reserve` slots free (a load hit uses all; a
        prefetch keeps the watermark). The caller then restores the watermark."""
        unique = list({e.block_hash: e for e in entries if e.move is None}.values())
        k = min(len(unique), max(self._alloc[VRAM].num_free - reserve, 0))
        if k:
            job = self._start_move(DRAM, VRAM, unique[:k], self._alloc[VRAM].allocate(k))
            for entry, slot in zip(unique, job.dst_slots, strict=False):
                self._emit_move(job, entry.block_hash, "planned", entry.slot, slot, reason)
        return k
