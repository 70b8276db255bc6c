"""Plain-data shapes of the service's replies, shared by the request handlers and explain.

Provides:
    RequestError                    a request the service cannot answer; the message goes back to the client
    decision_dict(event, snapshot)  one kept TierEvent in the uniform decision shape (ages via the snapshot)
    block_dict(block, snapshot)     one BlockView (or BlockRow) with its times as ages (stored_age_s, idle_s)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tiercache.inspect.snapshot import BLOCK_FIELDS, BlockRow, Snapshot

if TYPE_CHECKING:
    from tiercache.scheduler.views import BlockView


class RequestError(ValueError):
    """A request the service cannot answer; the message goes back to the client."""


def decision_dict(e, snap: Snapshot) -> dict[str, Any]:
    kind = e.kind
    out: dict[str, Any] = {
        "seq": e.seq,
        "kind": kind,
        "block_hash": e.block_hash,
        "codec_id": e.codec_id,
        "reason": e.reason,
        "time": e.time,
        "age_s": snap.age_of(e.time),
        "policy": None,
        "score": None,
        "components": {},
        "snapshot_age_s": None,
        "stage": None,
        "job_id": None,
    }
    if kind == "eviction":
        out.update(
            tier_from=e.tier_from, tier_to=e.tier_to, slot=e.slot, policy=e.policy, score=e.score,
            components=dict(e.components), snapshot_age_s=e.snapshot_age,
        )  # fmt: skip
    elif kind == "drop":
        out.update(tier_from=e.tier, tier_to=None, slot=e.slot)
    elif kind == "decline":  # never stored: tier_from is the tier its store would have evicted from
        out.update(
            tier_from=e.tier, tier_to=None, slot=-1, policy=e.policy, score=e.score,
            components=dict(e.components), snapshot_age_s=e.snapshot_age,
        )  # fmt: skip
    else:  # a move: spill / warm
        out.update(tier_from=e.tier_from, tier_to=e.tier_to, slot=e.from_slot, stage=e.stage, job_id=e.job_id)
    return out


def block_dict(block: BlockView | BlockRow, snap: Snapshot) -> dict[str, Any]:
    """Ages via the snapshot's clocks: the service never calls the manager's clock."""
    out = {name: getattr(block, name) for name in BLOCK_FIELDS}  # flat: no deep copy (asdict) needed
    out["stored_age_s"] = snap.age_of(out.pop("stored_at"))
    out["idle_s"] = snap.age_of(out.pop("last_access"))
    return out
