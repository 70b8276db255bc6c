"""explain_request(key): for each block of a recent request's prompt, where its KV came from, and for each
block vLLM had to recompute, why tiercache could not serve it.

Provides:
    explain_request(state, snap, key) -> dict      key: a request id (vLLM's or the caller's) or a prompt
                                                     digest (request_log.prompt_digest); RequestError when no
                                                     recent request matches
    OUTCOMES, MISS_CAUSES                            the values of a block's outcome and cause

A block's outcome is "vllm" (vLLM's own prefix cache had it), "hit" (tiercache loaded it, from `tier`) or
"miss"; a miss has a cause:
    never_stored     no record of it in the tiers before the request (or it left more than
                     inspect.remembered_departures departures ago: `note` says so)
    evicted          dropped by the eviction policy: `event` has when, the policy and its score parts
    declined         not stored: the policy's admission control predicted it would be evicted before its
                     next use (`event` has when, the policy, its reason and score parts)
    hash_mismatch, codec_mismatch, checksum_mismatch, load_failed, load_refused   a load of it failed:
                     dropped, recomputed (checksum_mismatch: its stored bytes had changed)
    store_failed, store_aborted, no_room, other               its store never completed (store unavailable)
    store_in_flight  stored, but its store had not completed when the request came
    after_miss       stored and readable, but an earlier block missed: a prefix loads only up to its first
                     miss
A hit whose load then failed (a drop after a failed load of the block, later than the admission) is "miss"
with the failure's cause and `loaded_then_failed` set.
Point reads of the request log and of each hit block's last departure (request_log.py; only a drop counts
here, so the service process's mirror keeps the other departures as their hashes: mirror.py).
"""

from __future__ import annotations

import time
from typing import Any

from tiercache.inspect.request_log import WHERE, RequestRecord
from tiercache.inspect.shapes import RequestError
from tiercache.inspect.snapshot import Snapshot
from tiercache.scheduler.events import (
    DeclineEvent,
    DropEvent,
    EvictionEvent,
    StoreEvent,
    TierEvent,
    cause_of,
)

SLICE = 256
OUTCOMES = ("vllm", "hit", "miss")
MISS_CAUSES = (
    "never_stored", "evicted", "declined", "hash_mismatch", "codec_mismatch", "checksum_mismatch",
    "load_failed", "load_refused", "store_failed", "store_aborted", "no_room", "other", "store_in_flight",
    "after_miss",
)  # fmt: skip


def explain_request(state, snap: Snapshot, key: str | bytes) -> dict[str, Any]:
    record = state.requests.find(key)
    if record is None:
        log = state.requests
        what = f"request id {key!r}" if isinstance(key, str) else "prompt"
        known = ", ".join(repr(i) for i in log.recent_ids) or "none yet"
        raise RequestError(
            f"no recent request matches {what}; the newest ids it knows: {known} (the id vLLM's OpenAI "
            "server returned, the id given to vLLM, or vLLM's internal id; only the last "
            f"{log.size} admitted requests are kept: inspect.recent_requests in the YAML); a request is "
            "recorded when vLLM schedules it"
        )
    departures = state.departures
    forgotten = departures.forgotten > 0
    blocks = []
    first_miss = None
    for i, block_hash in enumerate(record.block_hashes):
        if i % SLICE == SLICE - 1:
            time.sleep(0)  # let the scheduler thread run between slices of a long prompt
        row = _block(record, i, block_hash, departures.get(block_hash), forgotten, snap)
        if row["outcome"] == "miss" and first_miss is None:
            first_miss = i
        blocks.append(row)
    out = {
        "request_id": record.request_id,
        "external_id": record.external_id,
        "age_s": max(snap.age_of(record.clock), 0.0),
        "block_size": record.block_size,
        "prompt_tokens": record.prompt_tokens,
        "tokens_vllm": record.vllm_blocks * record.block_size,
        "tokens_loaded": record.tokens_loaded,
        "tokens_recomputed": record.tokens_recomputed,
        "first_miss": first_miss,
        "blocks": blocks,
    }
    out["summary"] = summary(out)
    return out


def _block(
    record: RequestRecord, i: int, block_hash: bytes, gone: TierEvent | None, forgotten: bool, snap: Snapshot
) -> dict[str, Any]:
    code = record.where[i]
    row: dict[str, Any] = {"index": i, "block_hash": block_hash, "outcome": "miss", "tier": WHERE.get(code)}
    if i < record.vllm_blocks:
        row["outcome"] = "vllm"
        return row
    if i < record.vllm_blocks + record.hit_blocks:
        if (
            isinstance(gone, DropEvent)
            and gone.time >= record.clock
            and cause_of(gone.reason).startswith(("load", "hash", "codec", "checksum"))
        ):
            row.update(cause=cause_of(gone.reason), loaded_then_failed=True, event=_event(gone, snap))
            return row
        row["outcome"] = "hit"
        return row
    if code == "x":
        reason = record.unreadable.get(i, "")
        row["cause"] = "store_in_flight" if "in flight" in reason else cause_of(reason)
        row["note"] = reason
    elif code != "-":
        row["cause"] = "after_miss"
    elif (left := record.departed.get(i)) is None:
        row["cause"] = "never_stored"
        if forgotten:
            row["note"] = "or it left the tiers before the oldest departure remembered"
    else:
        row["cause"] = _departure_cause(left)
        row["event"] = _event(left, snap)
    return row


def _departure_cause(e: TierEvent) -> str:
    if isinstance(e, EvictionEvent):
        return "evicted"
    if isinstance(e, DeclineEvent):
        return "declined"
    return cause_of(e.reason)


def _event(e: TierEvent, snap: Snapshot) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": e.kind, "age_s": max(snap.age_of(e.time), 0.0), "reason": e.reason}
    if isinstance(e, EvictionEvent):
        out.update(
            tier=e.tier_from, policy=e.policy, score=e.score, components=dict(e.components),
            snapshot_age_s=e.snapshot_age,
        )  # fmt: skip
    elif isinstance(e, DeclineEvent):
        out.update(
            tier=e.tier, policy=e.policy, score=e.score, components=dict(e.components),
            snapshot_age_s=e.snapshot_age,
        )  # fmt: skip
    elif isinstance(e, StoreEvent | DropEvent):
        out["tier"] = e.tier
    return out


def summary(x: dict[str, Any]) -> str:
    blocks = x["blocks"]
    n_vllm = sum(b["outcome"] == "vllm" for b in blocks)
    hits: dict[str, int] = {}
    for b in blocks:
        if b["outcome"] == "hit":
            hits[b["tier"]] = hits.get(b["tier"], 0) + 1
    head = (
        f"{x['prompt_tokens']} prompt tokens: {x['tokens_vllm']} in vLLM's prefix cache ({n_vllm} blocks), "
        f"{x['tokens_loaded']} loaded by tiercache"
    )
    if hits:
        head += " (" + ", ".join(f"{n} blocks from {tier}" for tier, n in sorted(hits.items())) + ")"
    head += f", {x['tokens_recomputed']} recomputed."
    first = x["first_miss"]
    if first is None:
        tail = "Every full block before the last token was served; the rest is always computed."
        return f"{head} {tail}"
    b = blocks[first]
    parts = [f"First miss at block {first}: {_cause_text(b)}."]
    causes: dict[str, int] = {}
    for b in blocks[first + 1 :]:
        if b["outcome"] == "miss":
            causes[b["cause"]] = causes.get(b["cause"], 0) + 1
    if causes:
        shown = ", ".join(
            f"{n} {cause.replace('_', ' ')}" for cause, n in sorted(causes.items(), key=lambda kv: -kv[1])
        )
        parts.append(f"After it: {shown}.")
    return " ".join([head, *parts])


def _cause_text(b: dict[str, Any]) -> str:
    cause, e = b.get("cause"), b.get("event")
    if b.get("loaded_then_failed"):
        return f"found in {b['tier']}, but its load failed ({e['reason']}) and vLLM recomputed it"
    if cause == "evicted":
        score = "" if e["score"] is None else f", score {e['score']:.3g}"
        return f"evicted from {e['tier']} {e['age_s']:.1f}s ago by {e['policy']}{score} ({e['reason']})"
    if cause == "declined":
        policy, age = e["policy"], e["age_s"]
        return f"declined by {policy}'s admission control {age:.1f}s ago ({e['reason']})"
    if cause == "never_stored":
        return "never stored before the request" + (f" ({b['note']})" if b.get("note") else "")
    if cause == "after_miss":
        return f"stored in {b['tier']}, but an earlier block missed"
    if e is not None:
        return f"{cause.replace('_', ' ')}: {e['reason']} ({e['age_s']:.1f}s ago)"
    return f"{cause.replace('_', ' ')}" + (f": {b['note']}" if b.get("note") else "")
