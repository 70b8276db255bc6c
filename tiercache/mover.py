"""Spill and warm planning for the TierManager (scheduler side): who moves, where to, and completion.

Provides:
    Mover(manager)
        make_vram_room(need)          plan spills so free VRAM + VRAM being spilled ≥ need + watermark
        dram_room(n) -> int           drop DRAM victims until n slots are free; returns how many are
        drop_vram(n) -> int           drop cold VRAM blocks (last resort when no tier can take a spill)
        plan_spill(n) -> int          n cold VRAM blocks → DRAM (one job, DRAM slots as one run if possible)
        plan_warm(entries, reason, reserve)   DRAM-resident blocks → free VRAM (one job)
        take_jobs(), complete(job_id, ok)
        spilling, moving_blocks, retired_slots, jobs_in_flight   O(1) counters for the invariant checks

A move keeps its source slot owned until the worker reports completion (and no load still reads it); the
destination slot is owned from planning. On failure the block stays where it was.
"""

from __future__ import annotations

from tiercache.events import DRAM, VRAM, SpillEvent, WarmEvent
from tiercache.index import BlockEntry, PendingMove
from tiercache.jobs import SPILL, WARM, TransferJob

_EVENT = {SPILL: SpillEvent, WARM: WarmEvent}


class Mover:
    def __init__(self, manager) -> None:
        self.m = manager
        self._next_job_id = 1
        self._in_flight: dict[int, tuple[TransferJob, tuple[bytes, ...]]] = {}
        self._new: list[TransferJob] = []
        self.spilling = 0  # VRAM slots that free when in-flight spills complete
        self.moving_blocks = 0
        self.retired_slots = 0

    @property
    def jobs_in_flight(self) -> int:
        return len(self._in_flight)

    def make_vram_room(self, need: int) -> None:
        vram = self.m.alloc[VRAM]
        short = need + self.m.watermark - vram.num_free - self.spilling
        if short > 0 and self.m.alloc[DRAM].capacity:
            self.plan_spill(short)

    def dram_room(self, n: int) -> int:
        dram = self.m.alloc[DRAM]
        if dram.num_free < n:
            victims = self.m.choose_victims(DRAM, n - dram.num_free)
            for entry, decision in victims:
                self.m.evict(entry, decision, tier_to=None, free_slot=False)
            dram.free([entry.slot for entry, _ in victims])  # one coalescing pass
        return min(n, dram.num_free)

    def drop_vram(self, n: int) -> int:
        """Drop up to n cold VRAM blocks (no spill); returns how many slots were freed."""
        victims = self.m.choose_victims(VRAM, n)
        for entry, decision in victims:
            self.m.evict(entry, decision, tier_to=None, free_slot=False)
        self.m.alloc[VRAM].free([entry.slot for entry, _ in victims])
        return len(victims)

    def plan_spill(self, n: int) -> int:
        victims = self.m.choose_victims(VRAM, n)
        victims = victims[: self.dram_room(len(victims))]
        if not victims:
            return 0
        dst = self.m.alloc[DRAM].allocate(len(victims))
        job = self._start(SPILL, [e for e, _ in victims], dst)
        for (entry, decision), slot in zip(victims, dst, strict=True):
            self.m.evict(entry, decision, tier_to=DRAM)
            self._emit(job, entry, "planned", slot, decision.reason)
        self.spilling += len(victims)
        return len(victims)

    def plan_warm(self, entries: list[BlockEntry], reason: str, reserve: int = 0) -> int:
        """Warm into free VRAM, leaving `reserve` slots free (a load hit uses all; a prefetch keeps the
        watermark). The caller then restores the watermark with make_vram_room(0)."""
        unique: dict[bytes, BlockEntry] = {}
        for entry in entries:
            if entry.move is None:
                unique.setdefault(entry.block_hash, entry)
        entries = list(unique.values())
        vram = self.m.alloc[VRAM]
        k = min(len(entries), max(vram.num_free - reserve, 0))
        if k == 0:
            return 0
        dst = vram.allocate(k)
        job = self._start(WARM, entries[:k], dst)
        for entry, slot in zip(entries, dst, strict=False):
            self._emit(job, entry, "planned", slot, reason)
        return k

    def take_jobs(self) -> list[TransferJob]:
        jobs, self._new = self._new, []
        return jobs

    def complete(self, job_id: int, ok: bool) -> None:
        if job_id not in self._in_flight:
            raise ValueError(f"complete_transfer: job {job_id} is not in flight")
        job, hashes = self._in_flight.pop(job_id)
        released: list[int] = []  # source slots (all in job.src_tier), freed in one coalescing pass
        failed: list[int] = []
        for block_hash, dst in zip(hashes, job.dst_slots, strict=True):
            entry = self.m.index.entries[block_hash]
            assert entry.move is not None and entry.move.job_id == job_id
            entry.move = None
            self.moving_blocks -= 1
            self.spilling -= job.kind == SPILL
            if ok:
                old_tier, old_slot = entry.tier, entry.slot
                self.m.index.relocate(entry, job.dst_tier, dst)
                if entry.refs:
                    entry.retired.append((old_tier, old_slot))
                    self.retired_slots += 1
                else:
                    released.append(old_slot)
                self._emit(job, entry, "done", dst, "transfer complete", from_slot=old_slot)
            else:
                failed.append(dst)
                self._emit(job, entry, "failed", dst, f"transfer failed: block stays in {entry.tier}")
            if entry.bad and entry.idle:
                self.m.drop(entry, "load failed: block will be recomputed")
        self.m.alloc[job.src_tier].free(released)
        self.m.alloc[job.dst_tier].free(failed)

    def _start(self, kind: str, entries: list[BlockEntry], dst: list[int]) -> TransferJob:
        job = TransferJob(self._next_job_id, kind, tuple(e.slot for e in entries), tuple(dst))
        self._next_job_id += 1
        self._in_flight[job.job_id] = (job, tuple(e.block_hash for e in entries))
        self._new.append(job)
        for entry, slot in zip(entries, dst, strict=True):
            entry.move = PendingMove(job.job_id, job.dst_tier, slot)
        self.moving_blocks += len(entries)
        return job

    def _emit(self, job: TransferJob, entry: BlockEntry, stage: str, to_slot: int, reason: str, **kw) -> None:
        kw.setdefault("from_slot", entry.slot)
        self.m.emit(
            _EVENT[job.kind], entry.block_hash, reason, stage=stage, job_id=job.job_id, to_slot=to_slot, **kw
        )
