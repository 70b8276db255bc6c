"""The TierManager's transfer verbs (scheduler side): spill and warm jobs out to the workers, completions in.
A mixin of ManagerCore (core.py); TierManager (manager.py) combines it with the other verb groups.

Provides:
    TransferVerbs
        take_jobs() -> list[TransferJob]        jobs planned since the last call
        complete_transfer(job_id, ok=True)      a job finished on every rank: blocks relocated (an old slot
                                                that loads still read is retired until they finish), or
                                                left where they were (destination slots freed)
        spill(n) -> int                         the n coldest VRAM blocks to DRAM, now; how many were planned

A block marked bad while it moved is dropped once idle. Source slots are freed in one coalescing pass.
"""

from __future__ import annotations

from tiercache.scheduler.core import ManagerCore
from tiercache.wire import TransferJob


class TransferVerbs(ManagerCore):
    def take_jobs(self) -> list[TransferJob]:
        return self._jobs.take_new()

    def complete_transfer(self, job_id: int, ok: bool = True) -> None:
        job = self._jobs.finish(job_id)
        released: list[int] = []  # source slots, freed in one coalescing pass
        failed: list[int] = []
        for block_hash, dst in zip(job.block_hashes, job.dst_slots, strict=True):
            entry = self._index.entries[block_hash]
            assert entry.move is not None and entry.move.job_id == job_id
            entry.move = None
            if ok:
                old_slot = entry.slot
                self._index.relocate(entry, job.dst_tier, dst)
                if entry.refs:
                    entry.retired.append((job.src_tier, old_slot))
                    self._retired += 1
                else:
                    released.append(old_slot)
                self._emit_move(job, block_hash, "done", old_slot, dst, "transfer complete")
            else:
                failed.append(dst)
                reason = f"transfer failed: block stays in {entry.tier}"
                self._emit_move(job, block_hash, "failed", entry.slot, dst, reason)
            if entry.bad and entry.idle:
                self._drop(entry, f"{entry.bad}: block will be recomputed")
        self._alloc[job.src_tier].free(released)
        self._alloc[job.dst_tier].free(failed)

    def spill(self, n: int) -> int:
        """Spill up to n of the coldest VRAM blocks to DRAM now; returns how many were planned."""
        plan = self._mover.spills(n)
        self._apply(plan)
        return len(plan.spills)
