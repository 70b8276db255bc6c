"""Eviction policy seam: the manager asks a policy for victims, validates them and records why.

Provides:
    VictimDecision                  one proposed victim: block hash, reason, score, score components
    DeclineDecision                 one block proposed not to be stored (admission control): the same fields
    BlockInfo                       read-only facts of one stored block, for policies
    Candidates                      what a policy may choose from: evictable blocks of one tier
    EvictionPolicy                  base class: choose_victims(tier, n, candidates), decline(tier, hashes,
                                    room, candidates), observe(event), close()

The seam, for the graph advisor (tiercache.graph):
    class GraphPolicy(EvictionPolicy):
        name = "graph"
        def choose_victims(self, tier, n, candidates) -> list[VictimDecision]: ...   # hot path: read a
            # precomputed snapshot; only hashes `in candidates` are taken (others are ignored by the manager)
        def observe(self, event) -> None: ...   # every TierEvent the manager emits, in order (cheap!)
        def decline(self, tier, hashes, room, candidates) -> list[DeclineDecision]: ...  # admission control:
            # new blocks (prefix order within a request) not worth storing when all but `room` of them
            # mean evicting a candidate of `tier` (the tier blocks leave the cache from); default: none
    policies/graph.py is that adapter for tiercache.graph.GraphEvictionAdvisor.
The manager takes at most n valid decisions; if fewer than n come back it fills the rest LRU-first and says
so in each filled event's reason ("… fill after graph returned k of n"). A block with a load, store or move
in flight is never a candidate. A declined block is not stored: the manager records a DeclineEvent with the
decision's reason and score and returns it among PrepareStoreOutput.not_stored.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from tiercache.scheduler.events import TierEvent


@dataclass(frozen=True)
class VictimDecision:
    block_hash: bytes
    reason: str
    score: float | None = None
    components: tuple[tuple[str, float], ...] = ()
    policy: str = "lru"
    snapshot_age: float | None = None  # seconds; None when the policy keeps no snapshot


@dataclass(frozen=True)
class DeclineDecision:
    """A new block the policy proposes not to store (predicted to be evicted before its next use)."""

    block_hash: bytes
    reason: str
    score: float | None = None
    components: tuple[tuple[str, float], ...] = ()
    policy: str = "lru"
    snapshot_age: float | None = None


@dataclass(frozen=True)
class BlockInfo:
    """Read-only view of one stored block, for policies."""

    block_hash: bytes
    tier: str
    slot: int
    stored_at: float
    last_access: float
    hits: int


class Candidates(Protocol):
    """Evictable blocks of one tier. Iteration is least recently used first and lazy (stop early)."""

    tier: str

    def __iter__(self) -> Iterator[bytes]: ...

    def __contains__(self, block_hash: object) -> bool: ...

    def info(self, block_hash: bytes) -> BlockInfo: ...


class EvictionPolicy:
    name = "base"

    def choose_victims(self, tier: str, n: int, candidates: Candidates) -> list[VictimDecision]:
        raise NotImplementedError

    def decline(
        self, tier: str, hashes: Sequence[bytes], room: int, candidates: Candidates
    ) -> list[DeclineDecision]:
        """Admission control: of the new blocks `hashes` about to be stored, those not worth storing; only
        all but `room` of them would evict a block (from `tier`, among `candidates`). Default: store all."""
        return []

    def observe(self, event: TierEvent) -> None:
        """Called with every event the manager emits; the default ignores them."""

    def close(self) -> None:
        """Release what the policy holds (threads); the default holds nothing."""
