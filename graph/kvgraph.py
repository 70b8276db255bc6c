"""KVCacheGraph: how stored KV blocks relate, kept up to date by the tier manager's notifications.

Provides `KVCacheGraph` and `EDGE_TYPES`. Nodes are block hashes (bytes); `graph.nx` is the networkx.Graph
(node attributes `source`, `token_span`, `created`; edge attributes are per-type counts, e.g.
`graph.nx.edges[a, b] == {"temporal": 1, "prefix_share": 3}`). Counters live in numpy columns
(`tiercache.graph.state`), updated by the scoring core it is built on (`tiercache.graph.counters`, whose
docstring states the rules); `info(h)` returns all of a block's attributes.

Notifications (the manager calls them from its own thread; each is O(1) or O(degree) and takes the lock):
- `on_request(block_hashes)` — a request arrived, before its hits and stores (O(its length)): the shadow
  ARC the cache falls back to takes it (`tiercache.graph.arc`).
- `on_store(block_hash, parent_hash=None, request_id=None, tier=tiers[0], token_span=(0, 0), source=None,
  importance=0.0)` — a block was stored (its parent is the previous block of the same prefix).
- `on_hit(block_hash, request_id=None)` — a request found the block cached (call in prefix order); the
  same request looking again only refreshes recency (hits count requests after the one that stored it).
- `on_step(hashes_used_together)` — blocks loaded or attended in one step.
- `on_move(block_hash, tier_from, tier_to)` — spill or warm between tiers.
- `on_remove(block_hash)` — the block is gone from every tier: its edges and counters go with it (its reuse
  class stays a while as a ghost, see `tiercache.graph.reuse`); its cached descendants, if any, become
  orphans (no lookup reaches them: ranked first, see `scoring`).
- `on_decline(block_hash, parent_hash=None)` — a block offered for storing was not stored (the admission
  control of `offer` / `decline_reason`): it counts as a block request and becomes a ghost, no node.
- `on_sketch(block_hash, sketch)` — optional 64-bit key sketch; similar sketches get a `semantic` edge.
Queries without the lock (same thread as the notifications): `info`, `edge_types`, `neighbors`, and the
core's (`tier_of`, `tier_size`, `is_evictable`, `parent_of`, `score_inputs`, `lru_fallback_order`, ...).
The graph keeps no recency order: the tier manager owns the one order and passes it to the advisor, and
`lru_fallback_order` sorts a tier by the `seq` counter where there is none. `export()` copies the counters
under the lock for the advisor.
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
from collections.abc import Callable, Hashable, Iterable, Iterator

import networkx as nx

from tiercache.graph.counters import BlockCounters
from tiercache.graph.scoring import ScoreWeights, source_code
from tiercache.graph.sketches import SketchIndex
from tiercache.graph.state import TableCopy

EDGE_TYPES: tuple[str, ...] = ("prefix_share", "temporal", "co_attend", "semantic", "spill_link")


class KVCacheGraph(BlockCounters):
    def __init__(
        self,
        tiers: tuple[str, ...] = ("vram", "dram"),
        clock: Callable[[], float] = time.monotonic,
        weights: ScoreWeights | None = None,
        max_co_attend: int = 64,
        sketches: SketchIndex | None = None,
    ) -> None:
        super().__init__(tiers, weights or ScoreWeights())
        self.clock = clock
        self.max_co_attend = max_co_attend
        self.nx = nx.Graph()
        self.lock = threading.Lock()
        self._sketches = sketches or SketchIndex()

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
            p = self._store(block_hash, parent_hash, request_id, t, code, importance, now)
            self.nx.add_node(
                block_hash, source=source or "unknown", token_span=tuple(token_span), created=now
            )
            if p >= 0:  # a new node: no edge to bump yet
                self.nx.add_edge(parent_hash, block_hash, temporal=1)

    def on_hit(self, block_hash: Hashable, request_id: Hashable | None = None) -> None:
        s = self._slot[block_hash]
        now = self.clock()
        with self.lock:
            requests, p = self._hit(s, request_id, now)
            if p >= 0 and requests >= 2:
                self._set(self._hashes[p], block_hash, "prefix_share", requests)

    def on_request(self, block_hashes: Iterable[Hashable]) -> None:
        """A request arrived (its blocks in prefix order), before its hits and stores: the shadow ARC takes
        it and the mode the cache follows is updated (`tiercache.graph.arc`)."""
        with self.lock:
            self._request(list(block_hashes))

    def on_step(self, hashes_used_together: Iterable[Hashable]) -> None:
        known = [h for h in hashes_used_together if h in self._slot][: self.max_co_attend]
        with self.lock:
            for a, b in itertools.pairwise(known):
                if a != b:
                    self._bump(a, b, "co_attend")

    def on_move(self, block_hash: Hashable, tier_from: str, tier_to: str) -> None:
        s = self._slot[block_hash]
        f, t = self.tier_index(tier_from), self.tier_index(tier_to)
        if self.table.tier.item(s) != f:
            where = self.tier_of(block_hash)
            raise ValueError(f"block {block_hash!r} is in tier {where!r}, not {tier_from!r}")
        with self.lock:
            self._move(s, f, t)
            self._bump(block_hash, block_hash, "spill_link")

    def on_decline(self, block_hash: Hashable, parent_hash: Hashable | None = None) -> int:
        """A block offered for storing was not stored (admission control; a block stored now is left
        alone): counted as a block request, remembered as a ghost; returns the reuse class it counted in."""
        if block_hash in self._slot:
            return self.table.reuse_class.item(self._slot[block_hash])
        with self.lock:
            return self._decline(block_hash, parent_hash)

    def on_remove(self, block_hash: Hashable) -> None:
        if block_hash not in self._slot:
            return
        with self.lock:
            s = self._slot[block_hash]
            if self.table.children[s].any():  # a hole in the prefix chains below it: unreachable now
                self._orphan_below(block_hash)
            self._remove(block_hash)
            self.nx.remove_node(block_hash)
            self._sketches.remove(block_hash)

    def on_sketch(self, block_hash: Hashable, sketch: int) -> None:
        if block_hash not in self._slot:
            raise KeyError(block_hash)
        with self.lock:
            for other in self._sketches.add(block_hash, sketch):
                self._bump(block_hash, other, "semantic")

    # --- queries -------------------------------------------------------------------------------------
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

    def export(self) -> TableCopy:
        """Copies of the counters (taken under the lock; O(memcpy), no per-block work)."""
        with self.lock:
            reuse = self.reuse
            return self.table.copy(
                self._hashes, self._size, reuse.probabilities(), reuse.loop_probabilities(), self._stores,
                self.vt, self.modes.mode,
            )  # fmt: skip

    def check_invariants(self) -> None:
        """Assert the counters and the edges agree with the blocks stored (tests and debugging; O(N))."""
        super().check_invariants()
        assert len(self._slot) == self.nx.number_of_nodes()
        assert all(h in self._slot for h in self._sketches._sketch)

    # --- internals -----------------------------------------------------------------------------------
    def _orphan_below(self, block_hash: Hashable) -> None:
        """Mark every cached descendant of a block about to be removed as an orphan (its `temporal` edges
        lead to its children; O(subtree · degree), only when a block with cached children goes)."""
        tb, todo = self.table, [block_hash]
        while todo:
            x = todo.pop()
            sx = self._slot[x]
            for c in self.nx.adj[x]:
                sc = self._slot[c]
                if c != x and tb.live_parent(sc) == sx and not tb.orphan.item(sc):
                    tb.orphan[sc] = 1
                    todo.append(c)

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
