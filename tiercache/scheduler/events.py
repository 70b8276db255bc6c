"""Decisions as data: every store, hit, miss, spill, warm and eviction is a frozen event with its reason.

Provides:
    TierEvent                       base: seq, time, block_hash, codec_id, reason; .kind; .to_dict()
    StoreEvent(tier, slot, stored)  a store completed (stored=True) or failed (stored=False)
    HitEvent(tier, slot)            lookup found the block ready
    MissEvent()                     lookup stopped here (reason: not stored, store in flight, load failed, …)
    MoveEvent                       a block moving tier_from → tier_to (kind "spill" towards the slower tier,
                                    "warm" towards the faster): stage planned | done | failed, job id, slots
    EvictionEvent                   a victim the manager took: tier_from, tier_to (DRAM = spilled, None =
                                    dropped), the policy actually used, score, score components, snapshot age
    DropEvent                       a block left the tiers without a policy choice (failed load/store, clear)
    DeclineEvent                    a new block not stored by the policy's admission control (predicted to be
                                    evicted before its next use): the tier judged, policy, score, components
    CAUSES, cause_of(reason) -> str one of CAUSES for the reason of a failure (a load, store or move that
                                    did not happen): a bounded label for counters and explanations

Drained by the caller with TierManager.take_events(); the eviction policy sees each one (policy.observe), and
the graph learns the blocks' tiers from them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from tiercache.wire import DRAM, VRAM, move_kind


@dataclass(frozen=True, slots=True)
class TierEvent:
    seq: int
    time: float
    block_hash: bytes
    codec_id: str
    reason: str
    kind: ClassVar[str] = "event"

    def to_dict(self) -> dict[str, Any]:
        """Plain data (msgpack-able), with the event kind."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["kind"] = self.kind
        if "components" in out:
            out["components"] = dict(out["components"])
        return out


@dataclass(frozen=True, slots=True)
class StoreEvent(TierEvent):
    tier: str = VRAM
    slot: int = -1
    stored: bool = True
    kind: ClassVar[str] = "store"


@dataclass(frozen=True, slots=True)
class HitEvent(TierEvent):
    tier: str = VRAM
    slot: int = -1
    kind: ClassVar[str] = "hit"


@dataclass(frozen=True, slots=True)
class MissEvent(TierEvent):
    kind: ClassVar[str] = "miss"


@dataclass(frozen=True, slots=True)
class MoveEvent(TierEvent):
    tier_from: str = VRAM
    tier_to: str = DRAM
    stage: str = "planned"  # planned | done | failed
    job_id: int = -1
    from_slot: int = -1  # in tier_from
    to_slot: int = -1  # in tier_to

    @property
    def kind(self) -> str:  # type: ignore[override]
        return move_kind(self.tier_from, self.tier_to)


@dataclass(frozen=True, slots=True)
class EvictionEvent(TierEvent):
    tier_from: str = VRAM
    tier_to: str | None = None  # DRAM: spilled; None: dropped
    slot: int = -1
    policy: str = "lru"  # the policy actually used (a fallback is recorded here and in reason)
    score: float | None = None
    components: tuple[tuple[str, float], ...] = ()
    snapshot_age: float | None = None
    kind: ClassVar[str] = "eviction"


@dataclass(frozen=True, slots=True)
class DropEvent(TierEvent):
    tier: str = VRAM
    slot: int = -1
    kind: ClassVar[str] = "drop"


@dataclass(frozen=True, slots=True)
class DeclineEvent(TierEvent):
    tier: str = DRAM  # where storing it would have evicted a block
    policy: str = "graph"
    score: float | None = None
    components: tuple[tuple[str, float], ...] = ()
    snapshot_age: float | None = None
    kind: ClassVar[str] = "decline"


CAUSES = (
    "hash_mismatch", "codec_mismatch", "checksum_mismatch", "no_room", "store_aborted", "store_failed",
    "load_refused", "load_failed", "transfer_failed", "other",
)  # fmt: skip
_CAUSE_WORDS = (  # first match wins: the reasons the manager, the connector and the workers write
    ("checksum mismatch", "checksum_mismatch"),
    ("hash mismatch", "hash_mismatch"),
    ("codec mismatch", "codec_mismatch"),
    ("no room", "no_room"),
    ("aborted", "store_aborted"),
    ("prepare_store failed", "store_aborted"),
    ("store failed", "store_failed"),
    ("storing failed", "store_failed"),
    ("refused", "load_refused"),
    ("load", "load_failed"),
    ("transfer", "transfer_failed"),
)


def cause_of(reason: str) -> str:
    text = reason.lower()
    return next((cause for words, cause in _CAUSE_WORDS if words in text), "other")
