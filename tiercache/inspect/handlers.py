"""Request → response for the inspection service (shared by the socket server and the in-process client).

Provides:
    METHODS                              name → handler(state, params) -> result (plain, msgpack-able data)
    handle(state, request) -> dict | Deferred   {"ok": True, "result": …} or {"ok": False, "error": "…"};
                                         no raise. Deferred: only for a state without a live view (the
                                         service process's Mirror) asked to explain a block
    Deferred(hashes, finish)             read these blocks in the engine (explain.read_points), then
                                         finish(reads) is the reply dict
    MAX_LIMIT, MAX_FILTER                the bounds of `limit` and of a `kinds` filter (params.py checks every
                                         parameter before any work; the client runs the same checks)

`state` is the live InspectionState (in-process clients) or the service process's Mirror (mirror.py): the
same snapshot, request log and departures, a mirror's no older than one publish. Every answer except
`explain` and `explain_request` comes from the published Snapshot (immutable). `explain` also needs point
reads of live state (explain.py): done at once on a live state's view, deferred to the engine by a mirror;
`explain_request` point-reads the request log and the departures (request_log.py). Work per request is
bounded: parameters are checked (sizes first) before anything is read, results hold at most MAX_LIMIT rows,
and a long result is built in slices of SLICE rows with the GIL let go between them, so that the scheduler
thread never waits for more than a slice (in the engine's process).
Error messages quote a request's values shortened (errors.shown), whatever their size or nesting.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tiercache.errors import shown
from tiercache.inspect import explain
from tiercache.inspect import params as check
from tiercache.inspect.params import MAX_FILTER, MAX_LIMIT
from tiercache.inspect.protocol import PROTOCOL_VERSION
from tiercache.inspect.shapes import RequestError, block_dict, decision_dict
from tiercache.inspect.snapshot import Snapshot
from tiercache.inspect.state import InspectionState
from tiercache.inspect.why import explain_request
from tiercache.wire import TIERS

logger = logging.getLogger(__name__)
SLICE = 64


@dataclass(frozen=True)
class Deferred:
    hashes: tuple[bytes, ...]
    finish: Callable[[Mapping[bytes, dict]], dict[str, Any]]


def handle(state, request: Any) -> dict[str, Any] | Deferred:
    return _reply(request, lambda: _dispatch(state, request))


def _reply(request: Any, compute: Callable[[], Any]) -> dict[str, Any] | Deferred:
    try:
        result = compute()
        if isinstance(result, Deferred):
            return Deferred(result.hashes, lambda reads: _reply(request, lambda: result.finish(reads)))
        return {"ok": True, "result": result}
    except RequestError as exc:
        return {"ok": False, "error": str(exc)}
    except Exception as exc:  # a bug here must not take the service (or the scheduler) down
        logger.exception("tiercache inspect: request %s failed", shown(request))
        error = f"internal error ({type(exc).__name__}: {shown(str(exc), 120)}); please report it"
        return {"ok": False, "error": error}


def _dispatch(state, request: Any) -> Any:
    if not isinstance(request, dict):
        raise RequestError(
            f"request must be a map {{'method': str, 'params': map}}, got {type(request).__name__}"
        )
    version = request.get("v", PROTOCOL_VERSION)
    if not isinstance(version, int) or isinstance(version, bool):
        wanted = f"protocol version {PROTOCOL_VERSION} (an integer)"
        raise RequestError(f"v: expected {wanted}, got {shown(version, 60)}")
    if version > PROTOCOL_VERSION:
        raise RequestError(
            f"protocol version {shown(version, 60)} is newer than this server's ({PROTOCOL_VERSION}); "
            "use the tiercache version of the engine's environment to inspect it"
        )
    method = request.get("method")
    handler = METHODS.get(method) if isinstance(method, str) else None
    if handler is None:
        valid = ", ".join(sorted(METHODS))
        raise RequestError(f"unknown method {shown(method, 60)}; valid methods: {valid}")
    params = request.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise RequestError(f"params must be a map, got {type(params).__name__}")
    return handler(state, params)


def _snapshot(state: InspectionState) -> Snapshot:
    snap = state.snapshot
    if snap is None:
        raise RequestError(
            "nothing published yet: the engine has not run a scheduler step with tiercache; send a request "
            "to vLLM and ask again"
        )
    return snap


def _sliced(items: Iterable, convert: Callable[[Any], Any], limit: int) -> list:
    """convert() of up to `limit` items, letting the GIL go every SLICE rows (time.sleep(0))."""
    out = []
    for item in items:
        if len(out) >= limit:
            break
        out.append(convert(item))
        if len(out) % SLICE == 0:
            time.sleep(0)
    return out


# ---------------------------------------------------------------------- methods
def _ping(state: InspectionState, params: dict) -> dict[str, Any]:
    """pid: the engine's; service_pid: the process answering (the service's own, or the engine's in-process);
    connections: the service's open connections, this one included (over the socket only)."""
    snap = state.snapshot
    out = {"protocol": PROTOCOL_VERSION, "pid": state.pid, "version": snap.version if snap else 0}
    out["service_pid"] = os.getpid()
    connections = getattr(state, "connections", None)
    if connections is not None:
        out["connections"] = connections
    return out


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
    by, declined = "evictions_by_", "declined_by_"
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
        "declines": c.get("declines", 0),
        "declines_by_policy": {k[len(declined) :]: v for k, v in c.items() if k.startswith(declined)},
        "tokens_loaded": loaded,
        "tokens_recomputed": recomputed,
        "token_hit_rate": loaded / (loaded + recomputed) if loaded + recomputed else None,
        "ttft": dict(snap.ttft),
        "events": c.get("events", 0),
        "events_dropped": m.get("events_dropped", 0),
        "tiers": _tiers(state, params),
    }


def _decisions(state: InspectionState, params: dict) -> list[dict[str, Any]]:
    limit, kinds = check.limit(params.get("limit"), 50), check.kinds(params.get("kinds"))
    snap = _snapshot(state)
    rows = (e for e in reversed(snap.decisions) if kinds is None or e.kind in kinds)
    return _sliced(rows, lambda e: decision_dict(e, snap), limit)


def _blocks(state: InspectionState, params: dict) -> list[dict[str, Any]]:
    tier, limit = check.tier(params.get("tier")), check.limit(params.get("limit"), 100)
    snap = _snapshot(state)
    blocks = [b for t in TIERS if tier in (None, t) for b in snap.blocks[t]]
    blocks.sort(key=lambda b: -b.last_access)
    return _sliced(blocks, lambda b: block_dict(b, snap), limit)


def _explain(state: InspectionState, params: dict) -> dict[str, Any] | Deferred:
    key = check.block_hash(params.get("block_hash"))
    snap = _snapshot(state)
    found = explain.lookup(snap, key)
    if state.view is not None:  # live: read now
        return explain.answer(snap, found, explain.read_points(state.view, found.hashes))
    return Deferred(found.hashes, lambda reads: explain.answer(snap, found, reads))


def _explain_request(state: InspectionState, params: dict) -> dict[str, Any]:
    key = check.request_key(params.get("request_id"), params.get("prompt_digest"))
    return explain_request(state, _snapshot(state), key)


METHODS = {
    "ping": _ping,
    "stats": _stats,
    "tiers": _tiers,
    "decisions": _decisions,
    "blocks": _blocks,
    "explain": _explain,
    "explain_request": _explain_request,
}
__all__ = ["MAX_FILTER", "MAX_LIMIT", "METHODS", "Deferred", "handle"]
