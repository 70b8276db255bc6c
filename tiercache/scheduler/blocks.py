"""The tier index: block hash → entry (tier, slot, state), with each tier's recency order. It is the one
record of where blocks are: the manager owns it; the graph and the workers learn from its events and plans.

Provides:
    BlockEntry      one stored block: codec id, tier and slot, ready/bad flags, loads in flight (refs),
                    a pending move, retired slots still read by loads, times and hit count
    PendingMove     a spill or warm in flight: job id, destination tier and slot
    BlockIndex      get / add / remove / relocate / touch; candidates(tier) for eviction policies

A block is evictable only when it is ready, not bad, has no loads in flight, no move in flight and no retired
slot still being read. The per-tier order (a RecencyOrder) holds every ready block of the tier, least
recently used first; candidate iteration skips the ones that are not evictable.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from tiercache.scheduler.policies.base import BlockInfo
from tiercache.scheduler.recency import RecencyOrder
from tiercache.wire import TIERS


@dataclass(slots=True)
class PendingMove:
    job_id: int
    to_tier: str
    to_slot: int


@dataclass(slots=True)
class BlockEntry:
    block_hash: bytes
    codec_id: str
    tier: str
    slot: int
    stored_at: float
    last_access: float
    ready: bool = False  # False while its store is in flight
    bad: str = ""  # why a load of it failed (non-empty: never served again, dropped once idle)
    refs: int = 0  # loads in flight
    hits: int = 0
    move: PendingMove | None = None
    retired: list[tuple[str, int]] = field(default_factory=list)  # old slots that loads in flight still read
    from_remote: bool = False  # fetched from the remote store or read from the disk tier (which hold it:
    # never uploaded to the remote store again)

    @property
    def evictable(self) -> bool:
        return self.ready and not self.bad and self.refs == 0 and self.move is None and not self.retired

    @property
    def idle(self) -> bool:
        return self.refs == 0 and self.move is None

    def unreadable(self, codec_id: str) -> str | None:
        """Why a load of this block as `codec_id` cannot be served now (None: it can)."""
        if self.codec_id != codec_id:
            return f"codec mismatch: stored {self.codec_id}, asked {codec_id}"
        if not self.ready:
            return "store in flight"
        if self.bad:
            return "a load of it failed: recompute"
        return None

    def info(self) -> BlockInfo:
        return BlockInfo(self.block_hash, self.tier, self.slot, self.stored_at, self.last_access, self.hits)


class BlockIndex:
    def __init__(self) -> None:
        self.entries: dict[bytes, BlockEntry] = {}
        self.order: dict[str, RecencyOrder] = {tier: RecencyOrder() for tier in TIERS}

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self.entries

    def get(self, block_hash: bytes) -> BlockEntry | None:
        return self.entries.get(block_hash)

    def add(self, entry: BlockEntry) -> None:
        assert entry.block_hash not in self.entries, "block stored twice"
        self.entries[entry.block_hash] = entry
        if entry.ready:
            self.order[entry.tier].add(entry.block_hash)

    def mark_ready(self, entry: BlockEntry) -> None:
        entry.ready = True
        self.order[entry.tier].add(entry.block_hash)

    def remove(self, entry: BlockEntry) -> None:
        del self.entries[entry.block_hash]
        self.order[entry.tier].discard(entry.block_hash)

    def relocate(self, entry: BlockEntry, tier: str, slot: int) -> None:
        self.order[entry.tier].discard(entry.block_hash)
        entry.tier, entry.slot = tier, slot
        if entry.ready:
            self.order[tier].add(entry.block_hash)

    def touch(self, entry: BlockEntry, now: float) -> None:
        entry.last_access = now
        if entry.ready:
            self.order[entry.tier].touch(entry.block_hash)

    def candidates(self, tier: str) -> TierCandidates:
        return TierCandidates(self, tier)


class TierCandidates:
    """Evictable blocks of one tier, least recently used first (policies/base.py's Candidates protocol)."""

    def __init__(self, index: BlockIndex, tier: str) -> None:
        self._index = index
        self.tier = tier

    def __iter__(self) -> Iterator[bytes]:
        entries = self._index.entries
        for block_hash in self._index.order[self.tier]:
            if entries[block_hash].evictable:
                yield block_hash

    def __contains__(self, block_hash: object) -> bool:
        entry = self._index.entries.get(block_hash)  # type: ignore[arg-type]
        return entry is not None and entry.tier == self.tier and entry.evictable

    def info(self, block_hash: bytes) -> BlockInfo:
        return self._index.entries[block_hash].info()
