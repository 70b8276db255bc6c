"""The TierManager's write verbs (scheduler side): stores, with the policy's admission control. A mixin of
ManagerCore (core.py); TierManager (manager.py) combines it with the other verb groups.

Provides:
    StoreVerbs
        prepare_store(hashes) -> PrepareStoreOutput | None   (tier, slot) per new admitted block: VRAM
                                                             while it has free slots, else DRAM (room made
                                                             by DRAM drops, last resort VRAM drops); None:
                                                             no room at all (one log line with the numbers)
        complete_store(hashes, ok=True)                      ready (StoreEvent), or released
        abort_store(hashes, reason)                          prepared stores that will never be written, or
                                                             whose bytes are not to be trusted: all or nothing

Admission: the policy may decline new blocks (a DeclineEvent each, with reason and score); a policy that
fails to decide stores everything, and says so in the log.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from tiercache.scheduler.abstract import PrepareStoreOutput
from tiercache.scheduler.blocks import BlockEntry
from tiercache.scheduler.core import ManagerCore, logger
from tiercache.scheduler.events import DeclineEvent, StoreEvent
from tiercache.wire import DRAM, VRAM


class StoreVerbs(ManagerCore):
    def prepare_store(self, hashes: Sequence[bytes]) -> PrepareStoreOutput | None:
        new: list[bytes] = []
        skipped: list[bytes] = []
        for block_hash in hashes:
            (skipped if block_hash in self._index or block_hash in new else new).append(block_hash)
        new, declined = self._admitted(new)
        if not new:
            return PrepareStoreOutput((), (), (), tuple(skipped), declined)
        n_vram = min(len(new), self._alloc[VRAM].num_free)
        self._apply(self._mover.dram_room(len(new) - n_vram))
        n_dram = min(len(new) - n_vram, self._alloc[DRAM].num_free)
        if n_vram + n_dram < len(new):  # last resort (no DRAM tier, or DRAM all in flight): drop VRAM victims
            plan = self._mover.vram_drops(len(new) - n_vram - n_dram)
            self._apply(plan)
            n_vram += len(plan.drops)
        take = n_vram + n_dram
        if take < len(new):
            self._log_no_room(len(new), take)
            for block_hash in new[take:]:
                self._emit(
                    StoreEvent, block_hash, "no room: every slot pinned or in flight", slot=-1, stored=False
                )
            if take == 0:
                return None
        placed = [(VRAM, s) for s in self._alloc[VRAM].allocate(n_vram)]
        placed += [(DRAM, s) for s in self._alloc[DRAM].allocate(n_dram)]
        now = self.clock()
        for block_hash, (tier, slot) in zip(new, placed, strict=False):
            self._index.add(BlockEntry(block_hash, self.codec_id, tier, slot, now, now))
        try:
            self._apply(self._mover.vram_room(0, self._jobs.leaving(VRAM)))  # restore the free-VRAM watermark
        except Exception as exc:  # the caller never learns of these slots: release them
            self.abort_store(new[:take], f"prepare_store failed: {exc!r}"[:200])
            raise
        return PrepareStoreOutput(
            tuple(new[:take]), tuple(t for t, _ in placed), tuple(s for _, s in placed), tuple(skipped),
            tuple(new[take:]) + declined,
        )  # fmt: skip

    def _admitted(self, new: list[bytes]) -> tuple[list[bytes], tuple[bytes, ...]]:
        """Admission control: the policy may decline new blocks it predicts would be evicted before their
        next use, where storing them would evict others (all but `room` of them: the free slots, VRAM's
        watermark kept), or whose prefix it declined (policy.decline); each is recorded as a DeclineEvent
        with its reason and score, and not stored. Returns (the blocks to store, the declined ones)."""
        room = max(self._alloc[VRAM].num_free - self._mover.watermark, 0) + self._alloc[DRAM].num_free
        tier = DRAM if self._alloc[DRAM].capacity else VRAM  # where blocks leave the cache from
        try:
            decisions = self.policy.decline(tier, new, room, self._index.candidates(tier))
        except Exception:  # a policy bug must not stop the cache: store everything, and say so
            logger.exception("tiercache: eviction policy %s failed to decide admission", self.policy.name)
            return new, ()
        declined: dict[bytes, None] = {}
        offered = set(new)
        for d in decisions:
            if d.block_hash in offered and d.block_hash not in declined:
                declined[d.block_hash] = None
                self._emit(
                    DeclineEvent, d.block_hash, d.reason, tier=tier, policy=d.policy, score=d.score,
                    components=tuple(d.components), snapshot_age=d.snapshot_age,
                )  # fmt: skip
        return [h for h in new if h not in declined], tuple(declined)

    def complete_store(self, hashes: Sequence[bytes], ok: bool = True) -> None:
        for block_hash in hashes:
            entry = self._storing(block_hash, "complete_store")
            if ok:
                self._index.mark_ready(entry)
                self._emit(StoreEvent, block_hash, "stored", tier=entry.tier, slot=entry.slot)
                self._upload(entry, "through")
            else:
                self._release_store(entry, "store failed")
        self._apply(self._mover.vram_room(0, self._jobs.leaving(VRAM)))

    def abort_store(self, hashes: Sequence[bytes], reason: str) -> None:
        """Prepared stores that will never be written (the caller failed before a worker got them), or whose
        bytes are not to be trusted (computed over a block whose load failed): their slots are freed and a
        StoreEvent(stored=False) per block records the reason. All or nothing:
        ValueError, and nothing released, if a block has no store in flight."""
        entries = [self._storing(h, "abort_store") for h in dict.fromkeys(hashes)]
        for entry in entries:
            self._release_store(entry, reason)

    def _storing(self, block_hash: bytes, verb: str) -> BlockEntry:
        entry = self._index.get(block_hash)
        if entry is None or entry.ready:
            raise ValueError(f"{verb}: block {block_hash.hex()[:16]} has no store in flight")
        return entry

    def _log_no_room(self, need: int, got: int) -> None:
        if not logger.isEnabledFor(logging.WARNING):
            return
        vram = self._alloc[VRAM]
        pinned = sum(1 for e in self._index.entries.values() if e.tier == VRAM and not e.evictable)
        logger.warning(
            "tiercache: out of room: store of %d blocks got %d (VRAM %d/%d free, %d spilling, "
            "%d pinned by loads/stores/moves; DRAM %d/%d free)",
            need, got, vram.num_free, vram.capacity, self._jobs.leaving(VRAM), pinned,
            self._alloc[DRAM].num_free, self._alloc[DRAM].capacity,
        )  # fmt: skip
