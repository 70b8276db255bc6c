"""KVCacheGraph: how stored KV blocks relate, kept up to date by the tier manager's notifications.

Provides `KVCacheGraph` and `EDGE_TYPES`. Nodes are block hashes (bytes); `graph.nx` is the networkx.Graph
(node attributes `source`, `token_span`, `created`; edge attributes are per-type counts, e.g.
`graph.nx.edges[a, b] == {"temporal": 1, "prefix_share": 3}`). Counters live in numpy columns
(`tiercache.graph.state`); `info(h)` returns all of a block's attributes.

Notifications (the manager calls them from its own thread; each is O(1) or O(degree) and takes the lock):
- `on_store(block_hash, parent_hash=None, request_id=None, tier=tiers[0], token_span=(0, 0), source=None,
  importance=0.0)` — a block was stored (its parent is the previous block of the same prefix).
- `on_hit(block_hash, request_id=None)` — a request found the block cached (call in prefix order); the
  same request looking again only refreshes recency (hits count requests after the one that stored it).
- `on_step(hashes_used_together)` — blocks loaded or attended in one step.
- `on_move(block_hash, tier_from, tier_to)` — spill or warm between tiers.
- `on_remove(block_hash)` — the block is gone from every tier: its edges and counters go with it (its reuse
  class stays a while as a ghost, see `tiercache.graph.reuse`).
- `on_sketch(block_hash, sketch)` — optional 64-bit key sketch; similar sketches get a `semantic` edge.
Queries without the lock (same thread as the notifications): `tier_of`, `is_evictable`, `info`,
`lru_order`, `edge_types`, `neighbors`. `export()` copies the counters under the lock for the advisor.
`graph.reuse` is the `ReuseStats` learned from these notifications (each store and each hit by a new request
opens a lifetime in the block's reuse class; a later hit or a store of a ghost closes it as reused).

Edge types and the signal that creates each:
- `temporal`: consecutive blocks of one request (a block and the parent it was stored under).
- `prefix_share`: a block and its parent once the block is used by ≥ 2 requests (count = requests).
- `co_attend`: blocks used in the same step (a path over the step's blocks, ≤ `max_co_attend` of them).
- `semantic`: blocks whose key sketches are within `SketchIndex.max_hamming` bits.
- `spill_link`: a block's VRAM ↔ DRAM residence: a self-loop counting its moves between tiers.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator

import networkx as nx

from tiercache.graph.reuse import ReuseStats, reuse_class
from tiercache.graph.scoring import SOURCES, ScoreWeights, source_code
from tiercache.graph.sketches import SketchIndex
from tiercache.graph.state import BlockTable, TableCopy

EDGE_TYPES: tuple[str, ...] = ("prefix_share", "temporal", "co_attend", "semantic", "spill_link")


class KVCacheGraph:
    def __init__(
        self,
        tiers: tuple[str, ...] = ("vram", "dram"),
        clock: Callable[[], float] = time.monotonic,
        weights: ScoreWeights | None = None,
        max_co_attend: int = 64,
        sketches: SketchIndex | None = None,
    ) -> None:
        if not tiers or len(set(tiers)) != len(tiers):
            raise ValueError(f"tiers must be distinct names, fastest first; got {tiers!r}")
        self.tiers = tuple(tiers)
        self.clock = clock
        self.weights = weights or ScoreWeights()
        self.max_co_attend = max_co_attend
        self.nx = nx.Graph()
        self.table = BlockTable(len(tiers))
        self.lock = threading.Lock()
        self._tier = {name: i for i, name in enumerate(tiers)}
        self._slot: dict[Hashable, int] = {}
        self._hashes: list[Hashable | None] = []
        self._lru: list[OrderedDict[Hashable, None]] = [OrderedDict() for _ in tiers]
        self._stores = [0] * len(tiers)  # per-tier store counter: the score's `tick`
        self._sketches = sketches or SketchIndex()
        self._leaf_in: dict[Hashable, int] = {}  # block → tier it can be evicted from now, or -1
        self.reuse = ReuseStats(self.weights.reuse_window)
        self._protected = tuple(self.weights.is_protected(code) for code in range(len(SOURCES)))

    # --- notifications -------------------------------------------------------------------------------
    def on_store(
        self,
        block_hash: Hashable,
        parent_hash: Hashable | None = None,
        request_id: Hashable | None = None,
        tier: str | None = None,
        token_span: tuple[int, int] = (0, 0),
        source: str | None = None,
        importance: float = 0.0,
    ) -> None:
        t = self.tier_index(tier or self.tiers[0])
        code = source_code(source)
        if block_hash in self._slot:  # stored again (e.g. recomputed): a use, maybe in another tier
            if self.tier_of(block_hash) != self.tiers[t]:
                self.on_move(block_hash, self.tier_of(block_hash), self.tiers[t])
            self.on_hit(block_hash, request_id)
            return
        now = self.clock()
        with self.lock:
            self.reuse.stored(block_hash)
            tb = self.table
            s = tb.alloc()
            if s == len(self._hashes):
                self._hashes.append(block_hash)
            else:
                self._hashes[s] = block_hash
            self._slot[block_hash] = s
            tb.tier[s], tb.source[s], tb.requests[s] = t, code, 1
            tb.last_access[s] = tb.created[s] = now
            tb.importance[s] = importance
            tb.last_request[s] = hash(request_id)
            self._stores[t] += 1
            tb.tick[s] = self._stores[t]
            self.nx.add_node(
                block_hash, source=source or "unknown", token_span=tuple(token_span), created=now
            )
            self._lru[t][block_hash] = None
            p = self._slot.get(parent_hash, -1) if parent_hash is not None else -1
            self._leaf_in[block_hash] = t
            if p >= 0:
                tb.parent[s], tb.parent_uid[s] = p, tb.uid.item(p)
                tb.children[p, t] = tb.children.item(p, t) + 1
                tb.branches[p] = tb.branches.item(p) + 1
                tb.chain_hits[s] = self._inherited(p)
                self._bump(parent_hash, block_hash, "temporal")
                self._update_leaf(p)
            tb.run[s] = tb.run.item(p) + 1 if p >= 0 and tb.hits.item(p) == 0 else 1
            self._start_lifetime(s, p)

    def on_hit(self, block_hash: Hashable, request_id: Hashable | None = None) -> None:
        s = self._slot[block_hash]
        with self.lock:
            tb = self.table  # scalar reads through .item(): numpy scalars cost more than the work here
            rid = hash(request_id)
            if request_id is not None and rid == tb.last_request.item(s):
                self._touch(s, block_hash)  # the same request looking again (lookups repeat): recency only
                return
            self.reuse.reused(tb.reuse_class.item(s))
            tb.last_request[s] = rid
            hits = tb.hits.item(s) + 1
            tb.hits[s] = hits
            requests = tb.requests.item(s) + 1
            tb.requests[s] = requests
            p = tb.live_parent(s)
            if p >= 0 and hits == 1:
                tb.branches_hit[p] = tb.branches_hit.item(p) + 1
            tb.chain_hits[s] = max(tb.chain_hits.item(s), hits, self._inherited(p))
            self._start_lifetime(s, p)
            self._touch(s, block_hash)
            if p >= 0 and requests >= 2:
                self._set(self._hashes[p], block_hash, "prefix_share", requests)

    def on_step(self, hashes_used_together: Iterable[Hashable]) -> None:
        known = [h for h in hashes_used_together if h in self._slot][: self.max_co_attend]
        with self.lock:
            for a, b in itertools.pairwise(known):
                if a != b:
                    self._bump(a, b, "co_attend")

    def on_move(self, block_hash: Hashable, tier_from: str, tier_to: str) -> None:
        s = self._slot[block_hash]
        f, t = self.tier_index(tier_from), self.tier_index(tier_to)
        tb = self.table
        if tb.tier[s] != f:
            raise ValueError(f"block {block_hash!r} is in tier {self.tiers[tb.tier[s]]!r}, not {tier_from!r}")
        with self.lock:
            p = tb.live_parent(s)
            if p >= 0:
                tb.children[p, f] -= 1
                tb.children[p, t] += 1
                self._update_leaf(p)
            tb.tier[s] = t
            self._update_leaf(s)
            del self._lru[f][block_hash]
            self._lru[t][block_hash] = None
            self._stores[t] += 1
            tb.tick[s] = self._stores[t]
            self._bump(block_hash, block_hash, "spill_link")

    def on_remove(self, block_hash: Hashable) -> None:
        s = self._slot.get(block_hash)
        if s is None:
            return
        with self.lock:
            tb = self.table
            p = tb.live_parent(s)
            if p >= 0:
                tb.children[p, tb.tier[s]] -= 1
                self._update_leaf(p)
            del self._leaf_in[block_hash]
            del self._lru[tb.tier[s]][block_hash]
            del self._slot[block_hash]
            self._hashes[s] = None
            self.reuse.evicted(block_hash, tb.reuse_class.item(s), len(self._slot))
            tb.free(s)
            self.nx.remove_node(block_hash)
            self._sketches.remove(block_hash)

    def on_sketch(self, block_hash: Hashable, sketch: int) -> None:
        if block_hash not in self._slot:
            raise KeyError(block_hash)
        with self.lock:
            for other in self._sketches.add(block_hash, sketch):
                self._bump(block_hash, other, "semantic")

    # --- queries -------------------------------------------------------------------------------------
    def __contains__(self, block_hash: Hashable) -> bool:
        return block_hash in self._slot

    def __len__(self) -> int:
        return len(self._slot)

    def tier_of(self, block_hash: Hashable) -> str:
        return self.tiers[self.table.tier[self._slot[block_hash]]]

    def tier_size(self, tier: str) -> int:
        return len(self._lru[self.tier_index(tier)])

    def is_evictable(self, block_hash: Hashable, tier: str) -> bool:
        """In `tier`, with no cached child in `tier` or a faster one (leaves first)."""
        return self._leaf_in.get(block_hash, -1) == self._tier.get(tier, -2)

    def lru_order(self, tier: str) -> Iterator[Hashable]:
        """Blocks of `tier`, least recently used first."""
        return iter(self._lru[self.tier_index(tier)])

    def parent_of(self, block_hash: Hashable) -> Hashable | None:
        p = self.table.live_parent(self._slot[block_hash])
        return self._hashes[p] if p >= 0 else None

    def info(self, block_hash: Hashable) -> dict:
        """Every attribute of a block: node attributes plus counters."""
        s, tb = self._slot[block_hash], self.table
        out = dict(self.nx.nodes[block_hash])
        out.update(
            tier=self.tiers[tb.tier[s]],
            parent=self.parent_of(block_hash),
            children={name: int(tb.children[s, i]) for i, name in enumerate(self.tiers)},
            **{k: getattr(tb, k)[s].item() for k in ("hits", "requests", "chain_hits", "tick", "branches")},
            **{k: getattr(tb, k)[s].item() for k in ("run", "reuse_class")},
            **{k: getattr(tb, k)[s].item() for k in ("last_access", "importance")},
        )
        return out

    def edge_types(self, a: Hashable, b: Hashable) -> dict[str, int]:
        """{edge type: count} between two blocks ({} when not linked)."""
        return dict(self.nx.get_edge_data(a, b, default={}))

    def neighbors(self, block_hash: Hashable) -> Iterator[tuple[Hashable, dict[str, int]]]:
        for other, data in self.nx.adj[block_hash].items():
            if other != block_hash:
                yield other, data

    def score_inputs(self, block_hash: Hashable) -> tuple[float, float, float, int, int, float, float]:
        """(tick, horizon, chain_hits, requests, source code, importance, reuse_p): the arguments of
        `scoring.components` / `scoring.priority` for one block, now."""
        s, tb = self._slot[block_hash], self.table
        horizon = max(len(self._lru[tb.tier.item(s)]), 1)
        return (
            float(tb.tick.item(s)),
            float(horizon),
            tb.chain_hits.item(s),
            tb.requests.item(s),
            tb.source.item(s),
            float(tb.importance.item(s)),
            self.reuse.probability(tb.reuse_class.item(s)),
        )

    def export(self) -> TableCopy:
        """Copies of the counters (taken under the lock; O(memcpy), no per-block work)."""
        with self.lock:
            return self.table.copy(self._hashes, [len(d) for d in self._lru], self.reuse.probabilities())

    def check_invariants(self) -> None:
        """Assert the counters agree with the structure (tests and debugging; O(N))."""
        tb = self.table
        assert len(self._slot) == self.nx.number_of_nodes() == sum(len(d) for d in self._lru)
        expected = {s: [0] * len(self.tiers) for s in self._slot.values()}
        for h, s in self._slot.items():
            assert self._hashes[s] == h and tb.uid[s] != 0 and h in self._lru[tb.tier[s]]
            p = tb.live_parent(s)
            if p >= 0:
                expected[p][tb.tier[s]] += 1
        for s, counts in expected.items():
            assert list(tb.children[s]) == counts, (self._hashes[s], list(tb.children[s]), counts)
            t = tb.tier[s]
            assert self._leaf_in[self._hashes[s]] == (-1 if any(counts[: t + 1]) else t)
        assert len(self._leaf_in) == len(self._slot)
        live = set(self._slot.values())
        assert all(tb.uid[s] == 0 and self._hashes[s] is None for s in range(tb.high) if s not in live)
        assert all(h in self._slot for h in self._sketches._sketch)
        ghosts = self.reuse.ghosts
        assert len(ghosts) <= len(self._slot) and not any(h in self._slot for h in ghosts)

    # --- internals -----------------------------------------------------------------------------------
    def tier_index(self, tier: str) -> int:
        """Index of a tier name (0 = fastest); ValueError naming the valid tiers."""
        try:
            return self._tier[tier]
        except KeyError:
            raise ValueError(f"unknown tier {tier!r}; valid: {', '.join(self.tiers)}") from None

    def _inherited(self, p: int) -> float:
        """What a child inherits (see `scoring`): a linear, unprotected parent's chain_hits; else the
        fraction of the parent's branches that were later hit."""
        tb = self.table
        if p < 0:
            return 0.0
        kids = sum(tb.children.item(p, i) for i in range(len(self.tiers)))
        if kids > 1 or self.weights.is_protected(tb.source.item(p)):
            n = tb.branches.item(p)
            return tb.branches_hit.item(p) / n if n else 0.0
        return float(tb.chain_hits.item(p))

    def _start_lifetime(self, s: int, p: int) -> None:
        """Fix the block's reuse class from its features now and open a lifetime in it."""
        tb = self.table
        opens_branch = p < 0 or self._protected[tb.source.item(p)]
        if not opens_branch:
            kids = 0
            for i in range(len(self.tiers)):
                kids += tb.children.item(p, i)
            opens_branch = kids > 1
        code = reuse_class(tb.chain_hits.item(s), tb.run.item(s), opens_branch)
        tb.reuse_class[s] = code
        self.reuse.start(code)

    def _update_leaf(self, s: int) -> None:
        tb = self.table
        t = tb.tier.item(s)
        leaf = not any(tb.children.item(s, i) for i in range(t + 1))
        self._leaf_in[self._hashes[s]] = t if leaf else -1

    def _touch(self, s: int, block_hash: Hashable) -> None:
        tb, t = self.table, self.table.tier.item(s)
        tb.last_access[s] = self.clock()
        tb.tick[s] = self._stores[t]
        self._lru[t].move_to_end(block_hash)

    def _bump(self, a: Hashable, b: Hashable, kind: str) -> None:
        data = self.nx.get_edge_data(a, b)
        if data is None:
            self.nx.add_edge(a, b, **{kind: 1})
        else:
            data[kind] = data.get(kind, 0) + 1

    def _set(self, a: Hashable, b: Hashable, kind: str, value: int) -> None:
        data = self.nx.get_edge_data(a, b)
        if data is None:
            self.nx.add_edge(a, b, **{kind: value})
        else:
            data[kind] = value
