"""Decisions as data: what the advisor proposes and the manager records.

Provides `EvictionDecision` (frozen): one eviction (spill to `tier_to`, or drop when `tier_to` is None)
with the policy actually used, its score and score components, and how old the advisor's snapshot was;
`AdmissionDecision` (frozen): a block offered for storing that is declined, with the score it would have
had, the score of the block storing it would have evicted (`frontier`), and why.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Literal

from tiercache.graph.scoring import ScoreComponents

PolicyUsed = Literal["graph", "lru-fallback", "lru"]


@dataclass(frozen=True)
class EvictionDecision:
    """One eviction. `policy_used`: "graph" (from a fresh snapshot), "lru-fallback" (the snapshot was
    missing or older than `max_stale_s`), "lru" (a plain LRU manager). `score`/`components` describe the
    block when the decision was taken; `snapshot_age_s` is None when there was no snapshot."""

    block_hash: Hashable
    tier_from: str
    tier_to: str | None
    policy_used: PolicyUsed
    score: float
    components: ScoreComponents | None
    snapshot_age_s: float | None
    reason: str


@dataclass(frozen=True)
class AdmissionDecision:
    """A block not stored (admission control): `tier` is the tier where storing it would have evicted the
    block of priority `frontier` (None: no block was ranked there); `score`/`components` are the block's
    own as if stored (`BlockCounters.offer`)."""

    block_hash: Hashable
    tier: str
    score: float
    components: ScoreComponents
    frontier: float | None
    snapshot_age_s: float | None
    reason: str
