"""The tier manager (scheduler side): the one owner of where blocks live. Workers execute its plans.

Provides:
    TierManager(vram_blocks, dram_blocks, codec_id, policy=None, spill_watermark=1/16, clock=monotonic)
    TierManager.from_config(config, layout, codec_id, policy=None)
        the verbs of TierManagerBase (abstract.py), plus
        info(hash) -> BlockInfo | None      spill(n) -> int (the n coldest VRAM blocks to DRAM, now)
        remote tier (remote_write "all" | "reused" | None):
        take_uploads() -> list[RemoteItem]  DRAM blocks dropped since the last call that go to the remote
                                            store ("all": every one; "reused": those loaded at least once;
                                            never a block that came from the store)
        prepare_fetch(hashes) -> PrepareLoadOutput | None   reserve DRAM slots for blocks the remote store
                                            holds, pinned as loads (None: no room, or a block is known here)
        complete_fetch(hashes, ok, reason)  the fetch and its load are done: ready in DRAM, or released
        stats() -> dict, quick_check(), check(), events_dropped

Room: new blocks go to VRAM while it has free slots, else straight to DRAM. Whenever free VRAM drops below the
watermark (spill_watermark × VRAM blocks), cold VRAM blocks are spilled to DRAM (not dropped), so VRAM keeps
room for the next stores and warms; a DRAM-resident block that gets a load hit is warmed back. When DRAM is
full, its victims are dropped. Only when neither tier can make room (no DRAM tier, or DRAM all in flight) are
cold VRAM blocks dropped for a store. The Mover (moves.py) plans each of these; the manager applies the plan
(slots, index, jobs, events). A source slot is released only when the workers report the move complete and no
load still reads it, so jobs never race each other. Not thread-safe: one scheduler thread calls it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence

from tiercache.layout import tier_capacities
from tiercache.scheduler import invariants
from tiercache.scheduler.abstract import PrepareLoadOutput, PrepareStoreOutput, TierManagerBase
from tiercache.scheduler.allocator import SlotAllocator
from tiercache.scheduler.blocks import BlockEntry, BlockIndex, PendingMove
from tiercache.scheduler.event_log import EventLog
from tiercache.scheduler.events import (
    DeclineEvent,
    DropEvent,
    EvictionEvent,
    HitEvent,
    MissEvent,
    MoveEvent,
    StoreEvent,
)
from tiercache.scheduler.moves import JobBook, Mover, RoomPlan, Victim
from tiercache.scheduler.policies import BlockInfo, EvictionPolicy, LRUPolicy, make_policy
from tiercache.scheduler.views import ManagerView
from tiercache.wire import DRAM, VRAM, RemoteItem, TransferJob

logger = logging.getLogger(__name__)


class TierManager(TierManagerBase):
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
    ) -> None:
        self.codec_id = codec_id
        self.remote_write = remote_write
        self._uploads: list[RemoteItem] = []  # dropped DRAM blocks for the next plan
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

    @classmethod
    def from_config(cls, config, layout, codec_id: str, policy: EvictionPolicy | None = None) -> TierManager:
        """Capacities from the config's tier sizes and the per-rank block layout (the numbers the workers
        allocate, tiercache.layout.tier_capacities); the policy from config.eviction unless given."""
        config.check_memory(layout.bytes_per_token, check_device=False)
        capacity = tier_capacities(config, layout)
        remote = config.tiers.remote.write if config.tiers.remote is not None else None
        policy = policy or make_policy(config.eviction)
        return cls(capacity[VRAM], capacity[DRAM], codec_id, policy, remote_write=remote)

    # ----------------------------------------------------------------- lookups and loads
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

    def spill(self, n: int) -> int:
        """Spill up to n of the coldest VRAM blocks to DRAM now; returns how many were planned."""
        plan = self._mover.spills(n)
        self._apply(plan)
        return len(plan.spills)

    # ----------------------------------------------------------------- stores
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

    def _release_store(self, entry: BlockEntry, reason: str) -> None:
        self._index.remove(entry)
        self._alloc[entry.tier].free([entry.slot])
        self._emit(StoreEvent, entry.block_hash, reason, tier=entry.tier, slot=entry.slot, stored=False)

    # ----------------------------------------------------------------- the remote tier
    def _goes_up(self, entry: BlockEntry) -> bool:
        if self.remote_write is None or entry.from_remote:
            return False
        return self.remote_write == "all" or entry.hits > 0

    def take_uploads(self) -> list[RemoteItem]:
        uploads, self._uploads = self._uploads, []
        return uploads

    def prepare_fetch(self, hashes: Sequence[bytes]) -> PrepareLoadOutput | None:
        """All or nothing: fresh DRAM slots (room made by DRAM drops) for blocks found in the remote store,
        each entry pinned by its load (refs 1) and not ready until complete_fetch. None (a MissEvent per
        block says why): no DRAM room, or a block already has an entry here (stored or in flight)."""
        known = next((h for h in hashes if h in self._index), None)
        if known is not None or len(set(hashes)) < len(hashes):
            return self._fetch_refused(hashes, "a block is already stored here or asked twice")
        self._apply(self._mover.dram_room(len(hashes)))
        if self._alloc[DRAM].num_free < len(hashes):
            return self._fetch_refused(hashes, f"no DRAM room for {len(hashes)} blocks")
        slots = self._alloc[DRAM].allocate(len(hashes))
        now = self.clock()
        for block_hash, slot in zip(hashes, slots, strict=True):
            entry = BlockEntry(
                block_hash, self.codec_id, DRAM, slot, now, now, refs=1, hits=1, from_remote=True
            )
            self._index.add(entry)
        return PrepareLoadOutput(tuple(hashes), (DRAM,) * len(hashes), tuple(slots))

    def _fetch_refused(self, hashes: Sequence[bytes], reason: str) -> None:
        for block_hash in hashes:
            self._emit(MissEvent, block_hash, f"remote fetch refused: {reason}")

    def complete_fetch(self, hashes: Sequence[bytes], ok: bool = True, reason: str = "") -> None:
        """ok: fetched and loaded on every rank → ready in DRAM; else released (slot freed, a StoreEvent
        with stored=False and the reason). ValueError if a block has no fetch in flight."""
        for block_hash in hashes:
            entry = self._index.get(block_hash)
            if entry is None or entry.ready or entry.refs != 1 or not entry.from_remote:
                raise ValueError(f"complete_fetch: block {block_hash.hex()[:16]} has no fetch in flight")
            entry.refs = 0
            if ok:
                self._index.mark_ready(entry)
                self._emit(
                    StoreEvent, block_hash, "fetched from the remote store", tier=DRAM, slot=entry.slot
                )
            else:
                self._release_store(entry, f"remote fetch failed: {reason or 'on a worker'}")

    # ----------------------------------------------------------------- transfers
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

    def _apply(self, plan: RoomPlan) -> None:
        """Carry out a room plan: drops first (their slots freed in one pass per tier), then one spill job."""
        freed: dict[str, list[int]] = {}
        for victim in plan.drops:
            entry = victim.entry
            self._record_eviction(victim, tier_to=None)
            if entry.tier == DRAM and self._goes_up(entry):
                self._uploads.append(RemoteItem(entry.block_hash, entry.slot))
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

    # ----------------------------------------------------------------- hints, events, views
    def observe_request(self, request_id: str, hashes: Sequence[bytes]) -> None:
        observe = getattr(self.policy, "observe_request", None)
        if observe is not None:
            observe(request_id, hashes)

    def observe_step(self, hashes: Sequence[bytes]) -> None:
        observe = getattr(self.policy, "observe_step", None)
        if observe is not None:
            observe(hashes)

    def take_events(self):
        return self._log.take()

    @property
    def events_dropped(self) -> int:
        return self._log.dropped

    def view(self) -> ManagerView:
        return self._view

    def close(self) -> None:
        """Stop what the policy runs (the graph advisor's thread)."""
        self.policy.close()

    def stats(self) -> dict[str, int]:
        vram, dram = self._alloc[VRAM], self._alloc[DRAM]
        return {
            "blocks": len(self._index),
            "vram_capacity": vram.capacity, "vram_free": vram.num_free,
            "dram_capacity": dram.capacity, "dram_free": dram.num_free,
            "jobs_in_flight": self._jobs.jobs_in_flight, "spilling": self._jobs.leaving(VRAM),
        }  # fmt: skip

    def quick_check(self) -> None:
        """O(1) invariant: slots in use = stored blocks + move destinations + retired slots."""
        invariants.quick_check(self._alloc, len(self._index), self._jobs.moving_blocks, self._retired)

    def check(self) -> None:
        """Full invariant check, O(capacity + blocks): every used slot is owned by exactly one thing."""
        invariants.full_check(self._index, self._alloc, self._jobs.moving_blocks, self._retired)

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
