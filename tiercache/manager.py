"""Scheduler-side tier manager: decides where blocks live; the worker side (pools, transfer) executes.

Provides:
    TierManager(vram_blocks, dram_blocks, codec_id, policy=None, spill_watermark=1/16, clock=monotonic)
    TierManager.from_config(config, layout, codec_id, policy=None)
    tier_capacities(config, layout) -> (vram_blocks, dram_blocks)   shared with TierWorker.from_config

Verbs (mirroring vLLM's v1/kv_offload protocol; block hashes are bytes, stored with the codec id):
    lookup(hashes, codec_id=None, record=True) -> int   leading blocks ready in either tier (hit/miss events)
    info(hash) -> BlockInfo | None               tier, slot, stored/last-access times, hits
    prepare_load(hashes) -> PrepareLoadOutput | None   pins the blocks; plans warms of DRAM-resident ones
    complete_load(hashes, ok=True)                unpins; ok=False drops the blocks (never served again)
    touch(hashes)                                 marks recently used
    prepare_store(hashes) -> PrepareStoreOutput | None   (tier, slot) per new block: VRAM while free, else
                                                  straight to DRAM; None = no room in either (logged)
    complete_store(hashes, ok=True)               the blocks become readable (or are released)
    abort_store(hashes, reason)                   prepared stores that will never be written: released
    prefetch(hashes) -> int                       plan warms DRAM → VRAM (e.g. from the advisor)
    take_jobs() -> list[TransferJob]              spills and warms planned since the last call
    complete_transfer(job_id, ok=True)            the worker finished a job: blocks move (or stay, on failure)
    take_events() -> list[TierEvent]              everything that happened, with reasons (tiercache.event_log)
    stats() -> dict, quick_check(), check(), close(), events_dropped

Room: new blocks go to VRAM while it has free slots, else straight to DRAM. Whenever free VRAM drops below the
watermark (spill_watermark × VRAM blocks), cold VRAM blocks are spilled to DRAM (not dropped), so VRAM keeps
room for the next stores and warms; a DRAM-resident block that gets a load hit is warmed back. When DRAM is
full, its victims are dropped. Only when neither tier can make room (no DRAM tier, or DRAM all in flight) are
cold VRAM blocks dropped for a store. A source slot is released only when the worker reports the move
complete and no load still reads it, so jobs never race each other. Blocks with loads, stores or moves in
flight are never victims. prepare_load and prepare_store either return what they reserved or raise having
reserved nothing. Not thread-safe: one scheduler thread calls it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence

from tiercache import invariants
from tiercache.allocator import SlotAllocator
from tiercache.event_log import EventLog
from tiercache.events import DRAM, VRAM, DropEvent, EvictionEvent, HitEvent, MissEvent, StoreEvent, TierEvent
from tiercache.index import BlockEntry, BlockIndex
from tiercache.jobs import SPILL, WARM, PrepareLoadOutput, PrepareStoreOutput, TransferJob
from tiercache.mover import Mover
from tiercache.policy import BlockInfo, EvictionPolicy, LRUPolicy, VictimDecision

logger = logging.getLogger(__name__)


class TierManager:
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
    ) -> None:
        self.codec_id = codec_id
        self.policy = policy or LRUPolicy(clock)
        self.clock = clock
        self.alloc = {VRAM: SlotAllocator(vram_blocks, VRAM), DRAM: SlotAllocator(dram_blocks, DRAM)}
        self.index = BlockIndex()
        self.watermark = math.ceil(vram_blocks * spill_watermark) if dram_blocks else 0
        self.mover = Mover(self)
        self.log = EventLog(codec_id, self.policy, clock, max_events)

    @classmethod
    def from_config(cls, config, layout, codec_id: str, policy: EvictionPolicy | None = None) -> TierManager:
        """Scheduler side: capacities from the config's tier sizes and the per-rank block layout (the same
        numbers TierWorker.from_config allocates); the policy from config.eviction unless given."""
        from tiercache.policy import make_policy

        config.check_memory(layout.bytes_per_token, check_device=False)
        vram_blocks, dram_blocks = tier_capacities(config, layout)
        return cls(vram_blocks, dram_blocks, codec_id, policy or make_policy(config.eviction))

    # ----------------------------------------------------------------- lookups and loads
    def lookup(self, hashes: Sequence[bytes], codec_id: str | None = None, record: bool = True) -> int:
        """Number of leading blocks stored, ready and of this codec. record=False: no hit/miss events
        (for callers that ask again about the same request every step)."""
        codec_id = codec_id or self.codec_id
        for n, block_hash in enumerate(hashes):
            entry = self.index.get(block_hash)
            reason = _unreadable(entry, codec_id)
            if reason:
                if record:
                    self.emit(MissEvent, block_hash, reason)
                return n
            if record:
                self.emit(HitEvent, block_hash, "lookup", tier=entry.tier, slot=entry.slot)
        return len(hashes)

    def info(self, block_hash: bytes) -> BlockInfo | None:
        """Where a block is and how it has been used (None if not stored)."""
        entry = self.index.get(block_hash)
        return None if entry is None else entry.info()

    def prepare_load(self, hashes: Sequence[bytes]) -> PrepareLoadOutput | None:
        entries = [self.index.get(h) for h in hashes]
        for block_hash, entry in zip(hashes, entries, strict=True):
            reason = _unreadable(entry, self.codec_id)
            if reason:
                logger.info("tiercache: load refused: block %s %s", block_hash.hex()[:16], reason)
                self.emit(MissEvent, block_hash, f"load refused: {reason}")
                return None
        now = self.clock()
        for entry in entries:
            entry.refs += 1
            entry.hits += 1
            self.index.touch(entry, now)
        out = PrepareLoadOutput(tuple(hashes), tuple(e.tier for e in entries), tuple(e.slot for e in entries))
        warm = [e for e in entries if e.tier == DRAM and e.move is None]
        try:
            self.mover.plan_warm(warm, "load hit in dram")
            self.mover.make_vram_room(0)
        except Exception:  # the caller never learns of these pins: release them
            self.complete_load(hashes)
            raise
        return out

    def complete_load(self, hashes: Sequence[bytes], ok: bool = True) -> None:
        for block_hash in hashes:
            entry = self.index.get(block_hash)
            if entry is None or entry.refs <= 0:
                raise ValueError(f"complete_load: block {block_hash.hex()[:16]} has no load in flight")
            entry.refs -= 1
            if not ok:
                entry.bad = True
            if entry.refs == 0:
                self.release_retired(entry)
            if entry.bad and entry.idle:
                self.drop(entry, "load failed: block will be recomputed")

    def touch(self, hashes: Sequence[bytes]) -> None:
        now = self.clock()
        for block_hash in hashes:
            entry = self.index.get(block_hash)
            if entry is not None:
                self.index.touch(entry, now)

    def prefetch(self, hashes: Sequence[bytes]) -> int:
        """Plan warms for the given blocks that sit idle in DRAM; returns how many were planned."""
        entries = [self.index.get(h) for h in hashes]
        todo = [e for e in entries if e and e.tier == DRAM and e.ready and not e.bad and e.move is None]
        return self.mover.plan_warm(todo, "prefetch", reserve=self.watermark)

    # ----------------------------------------------------------------- stores
    def prepare_store(self, hashes: Sequence[bytes]) -> PrepareStoreOutput | None:
        new: list[bytes] = []
        skipped: list[bytes] = []
        seen: set[bytes] = set()
        for block_hash in hashes:
            (skipped if block_hash in self.index or block_hash in seen else new).append(block_hash)
            seen.add(block_hash)
        if not new:
            return PrepareStoreOutput((), (), (), tuple(skipped))
        n_vram = min(len(new), self.alloc[VRAM].num_free)
        n_dram = self.mover.dram_room(len(new) - n_vram)
        if n_vram + n_dram < len(new):  # last resort (no DRAM tier, or DRAM all in flight): drop VRAM victims
            n_vram += self.mover.drop_vram(len(new) - n_vram - n_dram)
        take = n_vram + n_dram
        if take < len(new):
            self._log_no_room(len(new), take)
            if take == 0:
                return None
        placed = [(VRAM, s) for s in self.alloc[VRAM].allocate(n_vram)]
        placed += [(DRAM, s) for s in self.alloc[DRAM].allocate(n_dram)]
        now = self.clock()
        for block_hash, (tier, slot) in zip(new, placed, strict=False):
            self.index.add(BlockEntry(block_hash, self.codec_id, tier, slot, now, now))
        try:
            self.mover.make_vram_room(0)  # restore the free-VRAM watermark by spilling cold blocks
        except Exception as exc:  # the caller never learns of these slots: release them
            self.abort_store(new[:take], f"prepare_store failed: {exc!r}"[:200])
            raise
        return PrepareStoreOutput(
            tuple(new[:take]),
            tuple(t for t, _ in placed),
            tuple(s for _, s in placed),
            tuple(skipped),
            tuple(new[take:]),
        )

    def complete_store(self, hashes: Sequence[bytes], ok: bool = True) -> None:
        for block_hash in hashes:
            entry = self._storing(block_hash, "complete_store")
            if ok:
                self.index.mark_ready(entry)
                self.emit(StoreEvent, block_hash, "stored", tier=entry.tier, slot=entry.slot)
            else:
                self._release_store(entry, "store failed")
        self.mover.make_vram_room(0)

    def abort_store(self, hashes: Sequence[bytes], reason: str) -> None:
        """Prepared stores that will never be written (the caller failed before a worker got them): their
        slots are freed and a StoreEvent(stored=False) per block records the reason. All or nothing:
        ValueError, and nothing released, if a block has no store in flight."""
        entries = [self._storing(h, "abort_store") for h in dict.fromkeys(hashes)]
        for entry in entries:
            self._release_store(entry, reason)

    def _storing(self, block_hash: bytes, verb: str) -> BlockEntry:
        entry = self.index.get(block_hash)
        if entry is None or entry.ready:
            raise ValueError(f"{verb}: block {block_hash.hex()[:16]} has no store in flight")
        return entry

    def _release_store(self, entry: BlockEntry, reason: str) -> None:
        self.index.remove(entry)
        self.alloc[entry.tier].free([entry.slot])
        self.emit(StoreEvent, entry.block_hash, reason, tier=entry.tier, slot=entry.slot, stored=False)

    # ----------------------------------------------------------------- transfers and events
    def take_jobs(self) -> list[TransferJob]:
        return self.mover.take_jobs()

    def complete_transfer(self, job_id: int, ok: bool = True) -> None:
        self.mover.complete(job_id, ok)

    def take_events(self) -> list[TierEvent]:
        return self.log.take()

    def emit(self, event_type: type[TierEvent], block_hash: bytes, reason: str, **fields) -> None:
        self.log.emit(event_type, block_hash, reason, **fields)

    @property
    def events_dropped(self) -> int:
        return self.log.dropped

    # ----------------------------------------------------------------- eviction
    def choose_victims(self, tier: str, n: int) -> list[tuple[BlockEntry, VictimDecision]]:
        """Ask the policy for n victims, keep the valid ones, fill a shortfall least-recently-used first."""
        candidates = self.index.candidates(tier)
        try:
            proposed = self.policy.choose_victims(tier, n, candidates) if n > 0 else []
        except Exception:
            logger.exception("tiercache: eviction policy %s failed; using LRU", self.policy.name)
            proposed = []
        chosen: dict[bytes, VictimDecision] = {}
        for decision in proposed:
            if len(chosen) < n and decision.block_hash not in chosen and decision.block_hash in candidates:
                chosen[decision.block_hash] = decision
        if len(chosen) < n:
            note = f"lru fill after {self.policy.name} returned {len(chosen)} of {n}"
            for block_hash in candidates:
                if len(chosen) == n:
                    break
                if block_hash not in chosen:
                    chosen[block_hash] = VictimDecision(block_hash, note, policy="lru")
        return [(self.index.entries[h], d) for h, d in chosen.items()]

    def evict(
        self, entry: BlockEntry, decision: VictimDecision, tier_to: str | None, free_slot: bool = True
    ) -> None:
        """Record a victim. Dropped (tier_to None): removed, and its slot freed unless the caller batches."""
        self.emit(
            EvictionEvent, entry.block_hash, decision.reason, tier_from=entry.tier, tier_to=tier_to,
            slot=entry.slot, policy=decision.policy, score=decision.score,
            components=tuple(decision.components), snapshot_age=decision.snapshot_age,
        )  # fmt: skip
        if tier_to is None:
            self.index.remove(entry)
            if free_slot:
                self.alloc[entry.tier].free([entry.slot])

    def drop(self, entry: BlockEntry, reason: str) -> None:
        """Remove an idle block without a policy choice (failed load or transfer)."""
        assert entry.idle
        self.index.remove(entry)
        self.alloc[entry.tier].free([entry.slot])
        self.release_retired(entry)
        self.emit(DropEvent, entry.block_hash, reason, tier=entry.tier, slot=entry.slot)

    def release_retired(self, entry: BlockEntry) -> None:
        for tier, slot in entry.retired:
            self.alloc[tier].free([slot])
        self.mover.retired_slots -= len(entry.retired)
        entry.retired.clear()

    def close(self) -> None:
        """Stop what the policy runs (the graph advisor's thread)."""
        self.policy.close()

    # ----------------------------------------------------------------- introspection
    def stats(self) -> dict[str, int]:
        vram, dram = self.alloc[VRAM], self.alloc[DRAM]
        return {
            "blocks": len(self.index),
            "vram_capacity": vram.capacity, "vram_free": vram.num_free,
            "dram_capacity": dram.capacity, "dram_free": dram.num_free,
            "jobs_in_flight": self.mover.jobs_in_flight, "spilling": self.mover.spilling,
        }  # fmt: skip

    def quick_check(self) -> None:
        """O(1) invariant: slots in use = stored blocks + move destinations + retired slots."""
        invariants.quick_check(self)

    def check(self) -> None:
        """Full invariant check, O(capacity + blocks): every used slot is owned by exactly one thing."""
        invariants.full_check(self)

    def _log_no_room(self, need: int, got: int) -> None:
        if not logger.isEnabledFor(logging.WARNING):
            return
        vram = self.alloc[VRAM]
        pinned = sum(1 for e in self.index.entries.values() if e.tier == VRAM and not e.evictable)
        logger.warning(
            "tiercache: out of room: store of %d blocks got %d (VRAM %d/%d free, %d spilling, "
            "%d pinned by loads/stores/moves; DRAM %d/%d free)",
            need, got, vram.num_free, vram.capacity, self.mover.spilling, pinned,
            self.alloc[DRAM].num_free, self.alloc[DRAM].capacity,
        )  # fmt: skip


def tier_capacities(config, layout) -> tuple[int, int]:
    """(VRAM blocks, DRAM blocks) per rank for a config and a per-rank BlockLayout. Sizes in tokens are
    whole blocks of block_size tokens; sizes in bytes hold floor(bytes / bytes per block) blocks."""

    def blocks(size, tier: str) -> int:
        if size.tokens is not None:
            return size.tokens // layout.block_size
        return layout.blocks_in(size.bytes, tier)

    return blocks(config.tiers.vram, VRAM), blocks(config.tiers.dram, DRAM)


def _unreadable(entry: BlockEntry | None, codec_id: str) -> str | None:
    if entry is None:
        return "not stored"
    if entry.codec_id != codec_id:
        return f"codec mismatch: stored {entry.codec_id}, asked {codec_id}"
    if not entry.ready:
        return "store in flight"
    if entry.bad:
        return "a load of it failed: recompute"
    return None


__all__ = ["SPILL", "WARM", "TierManager", "tier_capacities"]
