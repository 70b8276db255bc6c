"""Request → response for the inspection service (shared by the socket server and the in-process client).

Provides:
    METHODS                              name → handler(state, params) -> result (plain, msgpack-able data)
    handle(state, request) -> dict       {"ok": True, "result": …} or {"ok": False, "error": "…"}; no raise

Every answer except `explain` comes from the state's published Snapshot (immutable). `explain` also does
point reads of live state (see explain.py): one block of the manager's view (read without a lock: a block
moving at that instant may show fields from adjacent steps) and one block's graph counters under the
graph's own lock.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from tiercache.inspect.explain import explain
from tiercache.inspect.protocol import PROTOCOL_VERSION
from tiercache.inspect.shapes import RequestError, block_dict, decision_dict
from tiercache.inspect.state import DECISION_KINDS, InspectionState, Snapshot
from tiercache.wire import TIERS

logger = logging.getLogger(__name__)
MAX_LIMIT = 100_000


def handle(state: InspectionState, request: Any) -> dict[str, Any]:
    try:
        if not isinstance(request, dict):
            raise RequestError(
                f"request must be a map {{'method': str, 'params': map}}, got {type(request).__name__}"
            )
        version = request.get("v", PROTOCOL_VERSION)
        if not isinstance(version, int) or isinstance(version, bool):
            wanted = f"protocol version {PROTOCOL_VERSION} (an integer)"
            raise RequestError(f"v: expected {wanted}, got {version!r}")
        if version > PROTOCOL_VERSION:
            raise RequestError(
                f"protocol version {version!r} is newer than this server's ({PROTOCOL_VERSION}); use the "
                "tiercache version of the engine's environment to inspect it"
            )
        method = request.get("method")
        handler = METHODS.get(method) if isinstance(method, str) else None
        if handler is None:
            raise RequestError(f"unknown method {method!r}; valid methods: {', '.join(sorted(METHODS))}")
        params = request.get("params", {})
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise RequestError(f"params must be a map, got {type(params).__name__}")
        return {"ok": True, "result": handler(state, params)}
    except RequestError as exc:
        return {"ok": False, "error": str(exc)}
    except Exception as exc:  # a bug here must not take the service (or the scheduler) down
        logger.exception("tiercache inspect: request %.200r failed", request)
        return {"ok": False, "error": f"internal error ({type(exc).__name__}: {exc}); please report it"}


def _snapshot(state: InspectionState) -> Snapshot:
    snap = state.snapshot
    if snap is None:
        raise RequestError(
            "nothing published yet: the engine has not run a scheduler step with tiercache; send a request "
            "to vLLM and ask again"
        )
    return snap


def _int(params: dict, key: str, default: int, lo: int = 0, hi: int = MAX_LIMIT) -> int:
    value = params.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise RequestError(f"{key}: expected an integer {lo}..{hi}, got {value!r}")
    return value


def _tier(params: dict) -> str | None:
    tier = params.get("tier")
    if tier is not None and tier not in TIERS:
        raise RequestError(f"tier: expected one of {', '.join(TIERS)} (or none for all), got {tier!r}")
    return tier


# ---------------------------------------------------------------------- methods
def _ping(state: InspectionState, params: dict) -> dict[str, Any]:
    snap = state.snapshot
    return {"protocol": PROTOCOL_VERSION, "pid": os.getpid(), "version": snap.version if snap else 0}


def _tiers(state: InspectionState, params: dict) -> list[dict[str, Any]]:
    snap = _snapshot(state)
    c = snap.counters
    out = []
    for tier in snap.tiers:
        name = tier["name"]
        out.append(
            {
                **tier,
                "hits": c.get("hits_" + name, 0),
                "evictions": c.get("evictions_from_" + name, 0),
                "occupancy": tier["used_slots"] / tier["capacity_blocks"] if tier["capacity_blocks"] else 0.0,
            }
        )
    return out


def _stats(state: InspectionState, params: dict) -> dict[str, Any]:
    snap = _snapshot(state)
    c, m = snap.counters, snap.manager_stats
    hits = sum(c.get("hits_" + t, 0) for t in TIERS)
    misses = c.get("misses", 0)
    loaded, recomputed = c.get("tokens_loaded", 0), c.get("tokens_recomputed", 0)
    by = "evictions_by_"
    return {
        "pid": snap.pid,
        "version": snap.version,
        "published_at": snap.wall_time,
        "snapshot_age_s": time.time() - snap.wall_time,
        "uptime_s": time.time() - snap.started_wall,
        "policy": snap.policy,
        "codec_id": snap.codec_id,
        "blocks": m.get("blocks", 0),
        "jobs_in_flight": m.get("jobs_in_flight", 0),
        "spilling": m.get("spilling", 0),
        "hits": hits,
        "hits_by_tier": {t: c.get("hits_" + t, 0) for t in TIERS},
        "misses": misses,
        "hit_rate": hits / (hits + misses) if hits + misses else None,
        "stores": c.get("stores", 0),
        "store_failures": c.get("store_failures", 0),
        "spills": c.get("spills_done", 0),
        "spill_failures": c.get("spills_failed", 0),
        "warms": c.get("warms_done", 0),
        "warm_failures": c.get("warms_failed", 0),
        "evictions": c.get("evictions", 0),
        "evictions_dropped": c.get("evictions_dropped", 0),
        "evictions_by_policy": {k[len(by) :]: v for k, v in c.items() if k.startswith(by)},
        "drops": c.get("drops", 0),
        "tokens_loaded": loaded,
        "tokens_recomputed": recomputed,
        "token_hit_rate": loaded / (loaded + recomputed) if loaded + recomputed else None,
        "ttft": dict(snap.ttft),
        "events": c.get("events", 0),
        "events_dropped": m.get("events_dropped", 0),
        "tiers": _tiers(state, params),
    }


def _decisions(state: InspectionState, params: dict) -> list[dict[str, Any]]:
    snap = _snapshot(state)
    limit = _int(params, "limit", 50)
    kinds = params.get("kinds")
    if kinds is not None and (
        not isinstance(kinds, list) or not all(isinstance(k, str) and k in DECISION_KINDS for k in kinds)
    ):
        raise RequestError(f"kinds: expected a list of {', '.join(DECISION_KINDS)}, got {kinds!r}")
    out = []
    for e in reversed(snap.decisions):
        if len(out) >= limit:
            break
        if kinds is None or e.kind in kinds:
            out.append(decision_dict(e, snap))
    return out


def _blocks(state: InspectionState, params: dict) -> list[dict[str, Any]]:
    snap = _snapshot(state)
    tier, limit = _tier(params), _int(params, "limit", 100)
    blocks = [b for t in TIERS if tier in (None, t) for b in snap.blocks[t]]
    blocks.sort(key=lambda b: -b.last_access)
    return [block_dict(b, snap) for b in blocks[:limit]]


def _explain(state: InspectionState, params: dict) -> dict[str, Any]:
    snap = _snapshot(state)
    return explain(state.view, snap, _block_hash(params.get("block_hash")))


def _block_hash(raw: Any) -> bytes | str:
    """bytes as given; a str as hex (possibly a prefix, resolved by explain)."""
    if isinstance(raw, bytes) and raw:
        return raw
    if isinstance(raw, str):
        text = raw.strip().lower().removeprefix("0x")
        if text and all(ch in "0123456789abcdef" for ch in text):
            return text
    raise RequestError(f"block_hash: expected bytes or a hex string (a prefix is fine), got {raw!r}")


METHODS = {
    "ping": _ping,
    "stats": _stats,
    "tiers": _tiers,
    "decisions": _decisions,
    "blocks": _blocks,
    "explain": _explain,
}
__all__ = ["METHODS", "handle"]
