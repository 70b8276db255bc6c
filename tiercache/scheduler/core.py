"""The TierManager's state and the primitives every verb group changes it through (scheduler side). The verb
groups (loads.py, stores.py, transfers.py, remote_tier.py) subclass ManagerCore and TierManager (manager.py)
combines them: one object, so one owner of the index, the slots, the jobs and the events.

Provides:
    ManagerCore(vram_blocks, dram_blocks, codec_id, policy=None, spill_watermark=1/16, clock=monotonic,
                max_events=1_000_000, remote_write=None, disk_blocks=0, disk_write="evicted")
                                                                builds the state; TierManager's constructor
        codec_id, remote_write, policy, clock                   what the manager runs with
        _alloc {tier: SlotAllocator}, _index (BlockIndex), _jobs (JobBook), _retired (old slots of moved
        blocks that loads in flight still read), _mover (Mover), _log (EventLog) and _emit, _view,
        _uploads (blocks for the remote store's next plan: RemoteItem with the tier and slot they are in),
        _disk (DiskIndex | None: the disk tier's files, disk_index.py; None without a disk tier),
        _upload(entry, when)            queue entry's upload when the write policy is `when` (and it never
                                        came from the store)
        _apply(plan)                    carry out a Mover's RoomPlan: drops (uploads and disk writes queued),
                                        one spill job
        _start_move(src, dst, entries, slots) -> TransferJob   a job to fresh slots (freed if it fails)
        _emit_move(job, hash, stage, src, dst, reason) / _record_eviction(victim, tier_to)   their events
        _drop(entry, reason)            remove an idle block without a policy choice (failed load or transfer)
        _release_retired(entry)         free the old slots its loads were still reading
        _release_store(entry, reason)   free a store (or fetch) that will not complete, with its StoreEvent
    logger                              "tiercache.scheduler.manager": every line the manager writes
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from tiercache.scheduler.allocator import SlotAllocator
from tiercache.scheduler.blocks import BlockEntry, BlockIndex, PendingMove
from tiercache.scheduler.disk_index import DiskIndex
from tiercache.scheduler.event_log import EventLog
from tiercache.scheduler.events import DropEvent, EvictionEvent, MoveEvent, StoreEvent
from tiercache.scheduler.moves import JobBook, Mover, RoomPlan, Victim
from tiercache.scheduler.policies import EvictionPolicy, LRUPolicy
from tiercache.scheduler.views import ManagerView
from tiercache.wire import DRAM, VRAM, RemoteItem, TransferJob

logger = logging.getLogger("tiercache.scheduler.manager")  # the manager's lines, from whichever module
REMOTE_WRITES = (None, "through", "evicted", "reused")  # tiers.remote.write (None: no remote tier)


class ManagerCore:
    def __init__(
        self,
        vram_blocks: int,
        dram_blocks: int,
        codec_id: str,
        policy: EvictionPolicy | None = None,
        *,
        spill_watermark: float = 1 / 16,
        clock: Callable[[], float] = time.monotonic,
        max_events: int = 1_000_000,
        remote_write: str | None = None,
        disk_blocks: int = 0,
        disk_write: str = "evicted",
    ) -> None:
        if remote_write not in REMOTE_WRITES:
            raise ValueError(f"remote_write: got {remote_write!r}; expected one of {REMOTE_WRITES}")
        self.codec_id = codec_id
        self.remote_write = remote_write
        self._uploads: list[RemoteItem] = []  # blocks for the next plan's uploads
        self._disk = DiskIndex(disk_blocks, disk_write) if disk_blocks else None
        self.policy = policy or LRUPolicy(clock)
        self.clock = clock
        self._alloc = {VRAM: SlotAllocator(vram_blocks, VRAM), DRAM: SlotAllocator(dram_blocks, DRAM)}
        self._index = BlockIndex()
        self._jobs = JobBook()
        self._retired = 0  # old slots of moved blocks that loads in flight still read
        watermark = math.ceil(vram_blocks * spill_watermark) if dram_blocks else 0
        self._mover = Mover(self._index, self._alloc, self.policy, watermark)
        self._log = EventLog(codec_id, self.policy, clock, max_events)
        self._emit = self._log.emit
        self._view = ManagerView(self, self._index, self._alloc)

    def _upload(self, entry: BlockEntry, when: str) -> None:
        """Queue entry's upload from the slot it is in now, when the remote write policy is `when` ("through":
        stored, "reused": first hit, "evicted": dropped from DRAM). The worker copies the slot's bytes at the
        start of the next step, before that step's stores, fetches and jobs can write the slot."""
        if self.remote_write == when and not entry.from_remote:
            self._uploads.append(RemoteItem(entry.block_hash, entry.slot, entry.tier))

    def _apply(self, plan: RoomPlan) -> None:
        """Carry out a room plan: drops first (their slots freed in one pass per tier), then one spill job."""
        freed: dict[str, list[int]] = {}
        for victim in plan.drops:
            entry = victim.entry
            self._record_eviction(victim, tier_to=None)
            if entry.tier == DRAM:
                self._upload(entry, "evicted")
                if self._disk is not None:
                    self._disk.evicted(entry.block_hash, entry.slot, entry.hits)
            self._index.remove(entry)
            freed.setdefault(entry.tier, []).append(entry.slot)
        for tier, slots in freed.items():
            self._alloc[tier].free(slots)
        if plan.spills:
            entries = [v.entry for v in plan.spills]
            job = self._start_move(VRAM, DRAM, entries, self._alloc[DRAM].allocate(len(entries)))
            for victim, slot in zip(plan.spills, job.dst_slots, strict=True):
                self._record_eviction(victim, tier_to=DRAM)
                self._emit_move(job, victim.entry.block_hash, "planned", victim.entry.slot, slot,
                                victim.decision.reason)  # fmt: skip

    def _start_move(self, src: str, dst: str, entries: list[BlockEntry], slots: list[int]) -> TransferJob:
        """A job moving entries to freshly allocated `slots` of `dst` (freed if the job cannot start)."""
        try:
            job = self._jobs.start(src, dst, entries, slots)
        except Exception:
            self._alloc[dst].free(slots)
            raise
        for entry, slot in zip(entries, slots, strict=True):
            entry.move = PendingMove(job.job_id, dst, slot)
        return job

    def _emit_move(
        self, job: TransferJob, block_hash: bytes, stage: str, src: int, dst: int, reason: str
    ) -> None:
        self._emit(
            MoveEvent, block_hash, reason, tier_from=job.src_tier, tier_to=job.dst_tier, stage=stage,
            job_id=job.job_id, from_slot=src, to_slot=dst,
        )  # fmt: skip

    def _record_eviction(self, victim: Victim, tier_to: str | None) -> None:
        entry, decision = victim.entry, victim.decision
        self._emit(
            EvictionEvent, entry.block_hash, decision.reason, tier_from=entry.tier, tier_to=tier_to,
            slot=entry.slot, policy=decision.policy, score=decision.score,
            components=tuple(decision.components), snapshot_age=decision.snapshot_age,
        )  # fmt: skip

    def _drop(self, entry: BlockEntry, reason: str) -> None:
        """Remove an idle block without a policy choice (failed load or transfer)."""
        assert entry.idle
        self._index.remove(entry)
        self._alloc[entry.tier].free([entry.slot])
        self._release_retired(entry)
        self._emit(DropEvent, entry.block_hash, reason, tier=entry.tier, slot=entry.slot)

    def _release_retired(self, entry: BlockEntry) -> None:
        for tier, slot in entry.retired:
            self._alloc[tier].free([slot])
        self._retired -= len(entry.retired)
        entry.retired.clear()

    def _release_store(self, entry: BlockEntry, reason: str) -> None:
        self._index.remove(entry)
        self._alloc[entry.tier].free([entry.slot])
        self._emit(StoreEvent, entry.block_hash, reason, tier=entry.tier, slot=entry.slot, stored=False)
