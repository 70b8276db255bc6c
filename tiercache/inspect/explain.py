"""explain(block_hash): where a block is, how the eviction policy scores it now, and the recent decisions
about it, with a one-paragraph summary.

Provides:
    explain(view, snapshot, key) -> dict   in one process: lookup, read_points on the live view, answer
    lookup(snapshot, key) -> Lookup        key: the block hash (bytes), or hex (a unique prefix of a hash seen
                                           in the snapshot's decisions or block lists is enough): the hashes
                                           whose live state the answer needs (.hashes); RequestError when a
                                           prefix is ambiguous or names nothing
    read_points(view, hashes) -> {hash: PointRead}   the engine's side: each block's entry now (BLOCK_FIELDS
                                           order, or None), whether the disk tier holds it, and under a graph
                                           policy its graph counters and score (plain data, msgpack-able)
    answer(snapshot, lookup, reads) -> dict   the explanation, from the snapshot and the reads

The service process (server.py) answers from a mirror of the snapshots: it runs lookup and answer, and asks
the engine's process for the reads, the only live state any answer needs. read_points makes point reads:
one block of the manager's view (read without a lock: a block moving at that instant may show fields from
adjacent steps), and each block's graph counters under the graph's own lock (taken once for all of them,
held for microseconds, acquired with a timeout so a busy graph never stalls the reply).
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from tiercache.inspect.shapes import RequestError, block_dict, decision_dict
from tiercache.inspect.snapshot import BLOCK_FIELDS, BlockRow

if TYPE_CHECKING:
    from tiercache.inspect.snapshot import Snapshot
    from tiercache.scheduler.views import ManagerView

MAX_BLOCK_DECISIONS = 20
GRAPH_LOCK_TIMEOUT = 0.05  # s
_GRAPH_FIELDS = ("hits", "requests", "chain_hits", "tick", "importance", "source")
_ROW = attrgetter(*BLOCK_FIELDS)
PointRead = dict[str, Any]  # block (row | None), on_disk, advisor; with an advisor: score, components, graph


@dataclass(frozen=True)
class Lookup:
    key: bytes | str
    exact: bytes | None  # the hash the key spells (bytes, or an even number of hex digits)
    matches: tuple[bytes, ...]  # recent hashes the hex key is a prefix of

    @property
    def hashes(self) -> tuple[bytes, ...]:
        unique = self.matches[0] if len(self.matches) == 1 else None
        return tuple(dict.fromkeys(h for h in (self.exact, unique) if h is not None))


def explain(view: ManagerView | None, snap: Snapshot, key: bytes | str) -> dict[str, Any]:
    found = lookup(snap, key)
    return answer(snap, found, read_points(view, found.hashes) if view is not None else {})


def lookup(snap: Snapshot, key: bytes | str) -> Lookup:
    if isinstance(key, bytes):
        return Lookup(key, key, ())
    exact = bytes.fromhex(key) if len(key) % 2 == 0 else None
    found = Lookup(key, exact, _prefixed(snap, key))
    if exact is None and len(found.matches) != 1:
        _resolve(found, {})  # raises: what is wrong with the prefix
    return found


_index: tuple = (None, [], [])  # (snapshot, sorted hex of its recent hashes, the hashes in that order)


def _prefixed(snap: Snapshot, prefix: str) -> tuple[bytes, ...]:
    """The hashes in the snapshot's decisions and block lists whose hex starts with `prefix`, in order; the
    hex index is built once per snapshot (the service answers many explains between two) and replaced
    whole (threads of in-process clients may share it)."""
    global _index
    index = _index
    if index[0] is not snap:
        seen = {e.block_hash for e in snap.decisions}
        seen.update(b.block_hash for blocks in snap.blocks.values() for b in blocks)
        pairs = sorted((h.hex(), h) for h in seen if isinstance(h, bytes))
        index = _index = (snap, [x for x, _ in pairs], [h for _, h in pairs])
    _, hexes, hashes = index
    start = end = bisect.bisect_left(hexes, prefix)
    while end < len(hexes) and hexes[end].startswith(prefix):
        end += 1
    return tuple(hashes[start:end])


def _resolve(found: Lookup, reads: Mapping[bytes, PointRead]) -> bytes:
    """The block the key names: the exact hash when it is stored, else the one recent hash it is a prefix
    of, else the exact hash (a full hash we know nothing about: the explanation says so)."""
    exact, matches, prefix = found.exact, found.matches, found.key
    if exact is not None and (reads.get(exact) or {}).get("block") is not None:
        return exact
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        shown = ", ".join(h.hex()[: len(prefix) + 4] for h in matches[:5])
        raise RequestError(
            f"block_hash prefix {prefix!r} matches {len(matches)} blocks ({shown}…); give more hex digits"
        )
    if exact is not None:
        return exact
    raise RequestError(
        f"block_hash {prefix!r} is an odd number of hex digits and is no prefix of a block in the recent "
        "decisions or block lists; pass the full hash (tiercache inspect --json prints them)"
    )


# ---------------------------------------------------------------------- the engine's side: point reads
def read_points(view: ManagerView, hashes: tuple[bytes, ...] | list[bytes]) -> dict[bytes, PointRead]:
    advisor = getattr(getattr(view, "policy", None), "advisor", None)
    reads: dict[bytes, PointRead] = {}
    for block_hash in hashes:
        block = view.block(block_hash)
        reads[block_hash] = {
            "block": None if block is None else _ROW(block),
            "on_disk": block is None and bool(view.on_disk(block_hash)),
            "advisor": advisor is not None,
        }
    if advisor is not None and reads:
        _graph_reads(advisor, reads)
    return reads


def _graph_reads(advisor, reads: dict[bytes, PointRead]) -> None:
    graph = advisor.graph
    if not graph.lock.acquire(timeout=GRAPH_LOCK_TIMEOUT):
        for read in reads.values():
            read["graph"] = {"note": "graph busy; ask again"}
        return
    try:
        for block_hash, read in reads.items():
            _graph_read(advisor, graph, block_hash, read)
    finally:
        graph.lock.release()


def _graph_read(advisor, graph, block_hash: bytes, out: PointRead) -> None:
    if block_hash not in graph:
        return
    try:
        components = dataclasses.asdict(advisor.explain(block_hash))
        info = graph.info(block_hash)
    except (KeyError, IndexError):  # removed between the check and the read
        return
    parent = info.get("parent")
    out["score"] = float(components["total"])
    out["components"] = {k: float(v) for k, v in components.items()}
    out["graph"] = {
        "tier": info.get("tier"),
        "parent": parent if isinstance(parent, bytes | str | int) or parent is None else repr(parent),
        "children": {str(k): int(v) for k, v in info.get("children", {}).items()},
        **{k: _plain(info.get(k)) for k in _GRAPH_FIELDS if k in info},
        "evictable_now": bool(graph.is_evictable(block_hash, info.get("tier"))),
        "snapshot_age_s": advisor.snapshot_age(),
    }


# ---------------------------------------------------------------------- the answer
def answer(snap: Snapshot, found: Lookup, reads: Mapping[bytes, PointRead]) -> dict[str, Any]:
    block_hash = _resolve(found, reads)
    read = reads.get(block_hash) or {}
    decisions = [decision_dict(e, snap) for e in reversed(snap.decisions) if e.block_hash == block_hash]
    row = read.get("block")
    block = None if row is None else block_dict(BlockRow(*row), snap)
    out: dict[str, Any] = {
        "block_hash": block_hash,
        "stored": block is not None,
        "block": block,
        "policy": snap.policy,
        "score": None,
        "components": {},
        "graph": None,
        "decisions": decisions[:MAX_BLOCK_DECISIONS],
    }
    if read.get("advisor"):
        out.update({k: read[k] for k in ("score", "components", "graph") if k in read})
    elif block is not None:
        idle = block["idle_s"]
        out.update(policy="lru", score=-idle, components={"idle_s": idle})
    out["summary"] = summary(out)
    if block is None and read.get("on_disk"):
        out["summary"] = "On the disk tier (read back into DRAM at its next hit); " + out["summary"]
    return out


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
