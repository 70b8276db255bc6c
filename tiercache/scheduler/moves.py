"""Room planning and the jobs in flight (scheduler side). The Mover reads the index and the allocators and
returns plans; the TierManager applies them (events, slots, jobs), so every state change happens in one place.

Provides:
    Victim                          a block the policy chose (entry) and why (decision)
    RoomPlan(drops, spills)         victims to drop (removed, slots freed), VRAM victims to spill to DRAM
    Mover(index, alloc, policy, watermark)
        victims(tier, n) -> list[Victim]        the policy's valid choices, a shortfall filled LRU first
        vram_room(need, leaving) -> RoomPlan    spills so free VRAM + VRAM being spilled ≥ need + watermark
        spills(n) -> RoomPlan                   n cold VRAM blocks to DRAM, with the DRAM drops that make room
        dram_room(n) -> RoomPlan                DRAM drops until n slots are free
        vram_drops(n) -> RoomPlan               cold VRAM blocks to drop (when no tier can take a spill)
    JobBook                         transfer jobs in flight: start, finish, take_new, counts per tier

A plan holds only evictable blocks: nothing with a load, store or move in flight is ever a victim.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tiercache.scheduler.allocator import SlotAllocator
from tiercache.scheduler.blocks import BlockEntry, BlockIndex
from tiercache.scheduler.policies.base import EvictionPolicy, VictimDecision
from tiercache.wire import DRAM, VRAM, TransferJob

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Victim:
    entry: BlockEntry
    decision: VictimDecision


@dataclass(frozen=True)
class RoomPlan:
    drops: tuple[Victim, ...] = ()  # removed from their tier (DRAM, or VRAM as a last resort)
    spills: tuple[Victim, ...] = ()  # VRAM → DRAM, one job


class Mover:
    def __init__(
        self,
        index: BlockIndex,
        alloc: Mapping[str, SlotAllocator],
        policy: EvictionPolicy,
        watermark: int,
    ) -> None:
        self._index = index
        self._alloc = alloc
        self._policy = policy
        self.watermark = watermark

    def victims(self, tier: str, n: int) -> list[Victim]:
        """Ask the policy for n victims, keep the valid ones, fill a shortfall least-recently-used first."""
        candidates = self._index.candidates(tier)
        try:
            proposed = self._policy.choose_victims(tier, n, candidates) if n > 0 else []
        except Exception:  # a policy bug must not stop the cache: LRU takes over, and says so
            logger.exception("tiercache: eviction policy %s failed; using LRU", self._policy.name)
            proposed = []
        chosen: dict[bytes, VictimDecision] = {}
        for decision in proposed:
            if len(chosen) < n and decision.block_hash not in chosen and decision.block_hash in candidates:
                chosen[decision.block_hash] = decision
        if len(chosen) < n:
            note = f"lru fill after {self._policy.name} returned {len(chosen)} of {n}"
            for block_hash in candidates:
                if len(chosen) == n:
                    break
                if block_hash not in chosen:
                    chosen[block_hash] = VictimDecision(block_hash, note, policy="lru")
        return [Victim(self._index.entries[h], d) for h, d in chosen.items()]

    def vram_room(self, need: int, leaving: int) -> RoomPlan:
        """Spills restoring free VRAM + `leaving` (VRAM slots freed when in-flight spills complete) to
        need + watermark; empty without a DRAM tier."""
        short = need + self.watermark - self._alloc[VRAM].num_free - leaving
        if short <= 0 or not self._alloc[DRAM].capacity:
            return RoomPlan()
        return self.spills(short)

    def spills(self, n: int) -> RoomPlan:
        spills = self.victims(VRAM, n)
        drops = self.dram_room(len(spills)).drops
        room = self._alloc[DRAM].num_free + len(drops)
        return RoomPlan(drops, tuple(spills[:room]))

    def dram_room(self, n: int) -> RoomPlan:
        short = n - self._alloc[DRAM].num_free
        return RoomPlan(drops=tuple(self.victims(DRAM, short))) if short > 0 else RoomPlan()

    def vram_drops(self, n: int) -> RoomPlan:
        return RoomPlan(drops=tuple(self.victims(VRAM, n)))


class JobBook:
    """Transfer jobs from planning until the workers report them: ids, the new ones not yet handed out, and
    how many blocks are leaving each tier."""

    def __init__(self) -> None:
        self._next_id = 1
        self._in_flight: dict[int, TransferJob] = {}
        self._new: list[TransferJob] = []
        self._leaving = dict.fromkeys((VRAM, DRAM), 0)

    def start(
        self, src_tier: str, dst_tier: str, entries: Sequence[BlockEntry], dst: Sequence[int]
    ) -> TransferJob:
        job = TransferJob(
            self._next_id, src_tier, dst_tier, tuple(e.slot for e in entries), tuple(dst),
            tuple(e.block_hash for e in entries),
        )  # fmt: skip
        self._next_id += 1
        self._in_flight[job.job_id] = job
        self._new.append(job)
        self._leaving[src_tier] += len(job)
        return job

    def finish(self, job_id: int) -> TransferJob:
        if job_id not in self._in_flight:
            raise ValueError(f"complete_transfer: job {job_id} is not in flight")
        job = self._in_flight.pop(job_id)
        self._leaving[job.src_tier] -= len(job)
        return job

    def take_new(self) -> list[TransferJob]:
        jobs, self._new = self._new, []
        return jobs

    def leaving(self, tier: str) -> int:
        """Blocks of `tier` whose move out of it is in flight (their slots free when the moves complete)."""
        return self._leaving[tier]

    @property
    def moving_blocks(self) -> int:
        return sum(self._leaving.values())

    @property
    def jobs_in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def next_id(self) -> int:
        return self._next_id
