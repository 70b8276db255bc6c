"""explain(block_hash): where a block is, how the eviction policy scores it now, and the recent decisions
about it, with a one-paragraph summary.

Provides:
    explain(view, snapshot, key) -> dict   view: the ManagerView last published; key: the block hash (bytes),
                                           or hex (a unique prefix of a hash seen in the snapshot's decisions
                                           or block lists is enough)

Runs on the server thread. Reads of live state are point reads: one block of the manager's view, and the
graph's counters for one block under the graph's own lock (held for microseconds, acquired with a timeout
so a busy graph never stalls the reply).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tiercache.inspect.shapes import RequestError, block_dict, decision_dict
from tiercache.inspect.state import Snapshot
from tiercache.scheduler.views import ManagerView

MAX_BLOCK_DECISIONS = 20
_GRAPH_FIELDS = ("hits", "requests", "chain_hits", "tick", "importance", "source")


def explain(view: ManagerView | None, snap: Snapshot, key: bytes | str) -> dict[str, Any]:
    block_hash = key if isinstance(key, bytes) else _resolve(view, snap, key)
    decisions = [decision_dict(e, snap) for e in reversed(snap.decisions) if e.block_hash == block_hash]
    block = view.block(block_hash) if view is not None else None
    out: dict[str, Any] = {
        "block_hash": block_hash,
        "stored": block is not None,
        "block": None,
        "policy": snap.policy,
        "score": None,
        "components": {},
        "graph": None,
        "decisions": decisions[:MAX_BLOCK_DECISIONS],
    }
    if block is not None:
        out["block"] = block_dict(block, snap)
    advisor = getattr(getattr(view, "policy", None), "advisor", None)
    if advisor is not None:
        _graph_view(advisor, block_hash, out)
    elif out["block"] is not None:
        idle = out["block"]["idle_s"]
        out.update(policy="lru", score=-idle, components={"idle_s": idle})
    out["summary"] = summary(out)
    if block is None and view is not None and view.on_disk(block_hash):
        out["summary"] = "On the disk tier (read back into DRAM at its next hit); " + out["summary"]
    return out


def _graph_view(advisor, block_hash: bytes, out: dict[str, Any]) -> None:
    graph = advisor.graph
    if not graph.lock.acquire(timeout=0.05):
        out["graph"] = {"note": "graph busy; ask again"}
        return
    try:
        if block_hash not in graph:
            return
        components = dataclasses.asdict(advisor.explain(block_hash))
        info = graph.info(block_hash)
    except (KeyError, IndexError):  # removed between the check and the read
        return
    finally:
        graph.lock.release()
    parent = info.get("parent")
    out["score"] = components["total"]
    out["components"] = {k: float(v) for k, v in components.items()}
    out["graph"] = {
        "tier": info.get("tier"),
        "parent": parent if isinstance(parent, bytes | str | int) or parent is None else repr(parent),
        "children": {str(k): int(v) for k, v in info.get("children", {}).items()},
        **{k: _plain(info.get(k)) for k in _GRAPH_FIELDS if k in info},
        "evictable_now": bool(graph.is_evictable(block_hash, info.get("tier"))),
        "snapshot_age_s": advisor.snapshot_age(),
    }


def _resolve(view: ManagerView | None, snap: Snapshot, prefix: str) -> bytes:
    if len(prefix) % 2 == 0:
        exact = bytes.fromhex(prefix)
        if view is not None and exact in view:
            return exact
    seen = {e.block_hash for e in snap.decisions}
    seen.update(b.block_hash for blocks in snap.blocks.values() for b in blocks)
    matches = sorted(h for h in seen if isinstance(h, bytes) and h.hex().startswith(prefix))
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        shown = ", ".join(h.hex()[: len(prefix) + 4] for h in matches[:5])
        raise RequestError(
            f"block_hash prefix {prefix!r} matches {len(matches)} blocks ({shown}…); give more hex digits"
        )
    if len(prefix) % 2 == 0:
        return bytes.fromhex(prefix)  # a full hash we know nothing about: the explanation says so
    raise RequestError(
        f"block_hash {prefix!r} is an odd number of hex digits and is no prefix of a block in the recent "
        "decisions or block lists; pass the full hash (tiercache inspect --json prints them)"
    )


def summary(x: dict[str, Any]) -> str:
    parts = []
    block = x["block"]
    if block is not None:
        state = "evictable" if block["evictable"] else _pinned(block)
        parts.append(
            f"in {block['tier']} slot {block['slot']}: stored {block['stored_age_s']:.1f}s ago, last used "
            f"{block['idle_s']:.1f}s ago, {block['hits']} hit(s); {state}."
        )
    else:
        parts.append("not stored now.")
    comp = x["components"]
    if x["policy"] == "lru" and "idle_s" in comp:
        parts.append(f"LRU: idle {comp['idle_s']:.2f}s; the least recently used evictable block goes first.")
    elif "total" in comp:
        terms = ("reuse", "hits", "requests", "source", "importance", "protection")
        value = " + ".join(f"{k} {comp[k]:.2f}" for k in terms if k in comp)
        parts.append(
            f"graph priority {comp['total']:.1f} = tick {comp['tick']:.0f} + horizon {comp['horizon']:.0f} × "
            f"({value}); the lowest-priority leaf is evicted first."
        )
    if x["decisions"]:
        d = x["decisions"][0]
        where = f"{d['tier_from']}→{d['tier_to']}" if d["tier_to"] else f"dropped from {d['tier_from']}"
        by = f" by {d['policy']}" if d["policy"] else ""
        parts.append(f"Last decision {d['age_s']:.1f}s ago: {d['kind']} {where}{by}: {d['reason']}.")
    elif block is None:
        parts.append("No recent decision about it (evicted long ago, never stored, or another hash).")
    return " ".join(parts)


def _pinned(block: dict[str, Any]) -> str:
    why = []
    if not block["ready"]:
        why.append("its store is in flight")
    if block["loads_in_flight"]:
        why.append(f"{block['loads_in_flight']} load(s) in flight")
    if block["moving"]:
        why.append("a move is in flight")
    return "not evictable now: " + (", ".join(why) or "a retired slot is still being read")


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str | bytes):
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)
