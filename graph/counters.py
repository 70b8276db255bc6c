"""The scoring core: each stored block's counters and the rules that update them, in one place.

Provides `BlockCounters(tiers, weights)`, the base of `KVCacheGraph`: the live graph (fed by the tier
manager) and the replay's `GraphCache` (which drives a one-tier KVCacheGraph) count with this code only.
It holds, per block, the numpy columns of `tiercache.graph.state` and, per tier, the number of blocks (the
score's `horizon`) and the store counter (its `tick`); `reuse` is the learned `ReuseStats`.

Update rules (`_store`, `_hit`, `_move`, `_remove`; the caller holds the graph's lock):
- store: `requests` = 1; under a cached parent, `chain_hits` = what it inherits (below), `run` = the
  parent's run + 1 if the parent was never hit, else 1; the parent counts a new branch; opens a lifetime.
- hit by a new request: `hits` and `requests` + 1, the lifetime of its class is reused, a first hit counts
  as a branch hit of the parent, `chain_hits` = max(chain_hits, hits, inherited); opens a lifetime. The
  same request looking again only refreshes recency.
- inherited: a linear, unprotected parent's `chain_hits`; from a branching point or a protected parent,
  the fraction of the parent's branches that were later hit (see `scoring`).
- every store, hit and move takes the next value of one access counter as the block's `seq`: sorting a
  tier's blocks by `seq` is its least-recently-used order (`lru_fallback_order`); the tier manager keeps
  the live order, so the graph keeps no second one.
- leaves: a block is evictable from its tier when it has no cached child in that tier or a faster one.
- reuse distance (`_use`, `_came_back`): every store, hit by a new request and declined offer is one block
  request (`vt`); a block used again records its distance in `scoring.GAPS` buckets (`gap`) and whether it
  came from beyond recency's reach (`loop`: not among the last len(self) distinct blocks requested, so an
  LRU cache of this size would have lost it). A loop block is ranked by when it is due back
  (`scoring`); its on-time returns per bucket are the loop's learned probability (`ReuseStats.loops`).
- orphans: a block stored under a parent not stored, or below a removed block, is unreachable (`orphan`).
- admission (`tiercache.graph.admission`, a base of this class): a block not stored is scored as if stored;
  a declined one counts as a block request and a lifetime of its class, and is remembered as a ghost.
- the adaptive fallback (`tiercache.graph.arc`): `on_request` feeds a shadow ARC and decides `mode` (follow
  the graph's ranking, or evict first what ARC dropped: `arc_victims`); `bet` records an admission judgment,
  settled by the next block request of either block (`ModeSelector.admit`: whether admission may decline).
Queries (no lock; the notifying thread): `tier_of`, `tier_size`, `is_evictable`, `parent_of`,
`score_inputs` (one block's score arguments), `lru_fallback_order(tier)`, `check_invariants()`, and for an
incremental ranking such as the replay's heaps `rank_key(h, horizon)` and `evictable_seq(h, tier)`.
`changes` (any thread, no lock): a number that grows with every update that can change a ranking (store,
hit, move, removal, declined offer); the advisor's thread polls it to rank again only after a change.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

import numpy as np

from tiercache.graph import scoring
from tiercache.graph.admission import AdmissionRules
from tiercache.graph.arc import ArcFallback, ModeSelector, ShadowARC
from tiercache.graph.reuse import ReuseStats, reuse_class
from tiercache.graph.scoring import GAP_VALUES, SOURCES, Loop, ScoreWeights, gap_bucket
from tiercache.graph.state import BlockTable
from tiercache.scheduler.recency import RecencyOrder


class BlockCounters(AdmissionRules, ArcFallback):
    def __init__(self, tiers: tuple[str, ...], weights: ScoreWeights) -> None:
        if not tiers or len(set(tiers)) != len(tiers):
            raise ValueError(f"tiers must be distinct names, fastest first; got {tiers!r}")
        self.tiers = tuple(tiers)
        self.weights = weights
        self.table = BlockTable(len(tiers))
        self.reuse = ReuseStats(weights.reuse_window, weights.ghosts)
        self._tier = {name: i for i, name in enumerate(tiers)}
        self._tier_ids = range(len(tiers))
        self._slot: dict[Hashable, int] = {}
        self._hashes: list[Hashable | None] = []  # slot → block
        self._leaf_in: dict[Hashable, int] = {}  # block → tier it can be evicted from now, or -1
        self._size = [0] * len(tiers)  # blocks per tier: the score's `horizon`
        self._stores = [0] * len(tiers)  # blocks stored or moved into each tier so far: the score's `tick`
        self._accesses = 0  # stores, hits and moves so far: the `seq` column
        self._removals = 0  # blocks removed so far (with `vt` and `_accesses`: `changes`)
        self._protected = tuple(weights.is_protected(code) for code in range(len(SOURCES)))
        self.vt = 0  # block requests so far (stores, hits by a new request, declined offers): `last_vt`
        self._recent = RecencyOrder()  # recency's reach: the last len(self) distinct blocks requested
        self._declined: tuple[Hashable, float, int] = (None, 0.0, 0)  # last declined: (block, chain, run)
        self.shadow = ShadowARC()  # what ARC would hold (`tiercache.graph.arc`), fed by `_request`
        self.modes = ModeSelector(1 + round(weights.ghosts))  # follow the graph's ranking, or the shadow ARC
        self._arc_out: OrderedDict[Hashable, None] = OrderedDict()  # cached, not in the shadow: oldest first
        self._offers: dict[Hashable, Hashable] = {}  # judged, not stored or declined yet: block → frontier
        self._bets: OrderedDict[Hashable, Hashable] = OrderedDict()  # admission bets: offered → frontier
        self._spared: dict[Hashable, list[Hashable]] = {}  # frontier → its offered blocks
        self._requests = 0

    # --- queries -------------------------------------------------------------------------------------
    def __contains__(self, block_hash: Hashable) -> bool:
        return block_hash in self._slot

    def __len__(self) -> int:
        return len(self._slot)

    @property
    def changes(self) -> int:
        """Grows with every store, hit, move, removal and declined offer, and with nothing else (edges,
        sketches): every update a ranking depends on. Three int reads, each counter only grows: a thread
        that reads it without the lock sees any update finished before the read."""
        return self.vt + self._accesses + self._removals + self._requests

    def tier_index(self, tier: str) -> int:
        """Index of a tier name (0 = fastest); ValueError naming the valid tiers."""
        try:
            return self._tier[tier]
        except KeyError:
            raise ValueError(f"unknown tier {tier!r}; valid: {', '.join(self.tiers)}") from None

    def tier_of(self, block_hash: Hashable) -> str:
        return self.tiers[self.table.tier.item(self._slot[block_hash])]

    def tier_size(self, tier: str) -> int:
        return self._size[self.tier_index(tier)]

    @property
    def tier_ticks(self) -> list[int]:
        """Each tier's store counter now (the `tick` of a block stored or moved there next, less one)."""
        return list(self._stores)

    def is_evictable(self, block_hash: Hashable, tier: str) -> bool:
        """In `tier`, with no cached child in `tier` or a faster one (leaves first)."""
        return self._leaf_in.get(block_hash, -1) == self._tier.get(tier, -2)

    def is_orphan(self, block_hash: Hashable) -> bool:
        """Whether no lookup can reach the block any more: a block of its prefix was removed while it was
        cached, or it was stored under a parent not stored."""
        return bool(self.table.orphan.item(self._slot[block_hash]))

    def class_of(self, block_hash: Hashable) -> int:
        """The block's reuse class (fixed at its last access)."""
        return self.table.reuse_class.item(self._slot[block_hash])

    def parent_of(self, block_hash: Hashable) -> Hashable | None:
        p = self.table.live_parent(self._slot[block_hash])
        return self._hashes[p] if p >= 0 else None

    def score_inputs(self, block_hash: Hashable) -> tuple:
        """(tick, horizon, chain_hits, requests, source code, importance, reuse_p, loop, orphan): the
        arguments of `scoring.components` for one block, now. `loop`: its `scoring.Loop` when it is ranked by
        its loop (then reuse_p is its loop's on-time return probability), else None."""
        s, tb = self._slot[block_hash], self.table
        loop = self._loop_now(s)
        return (
            float(tb.tick.item(s)),
            float(max(self._size[tb.tier.item(s)], 1)),
            tb.chain_hits.item(s),
            tb.requests.item(s),
            tb.source.item(s),
            float(tb.importance.item(s)),
            self.reuse.probability(tb.reuse_class.item(s))
            if loop is None
            else self.reuse.loop_probability(loop.bucket),
            loop,
            bool(tb.orphan.item(s)),
        )

    def _loop_now(self, s: int) -> Loop | None:
        """The slot's loop state if it is ranked by its loop now (flagged, and not overdue)."""
        tb = self.table
        if not tb.loop.item(s):
            return None
        last, gap = tb.last_vt.item(s), GAP_VALUES[tb.gap.item(s)]
        if self.vt > last + (1 + self.weights.overdue) * gap:
            return None
        return Loop(tb.gap.item(s), last + gap, float(self._stores[tb.tier.item(s)]), float(self.vt))

    def rank_key(self, block_hash: Hashable, horizon: float) -> tuple[int, float, int]:
        """(reuse class, priority without the reuse term at this horizon, seq) of one block: the key an
        incremental ranking (the replay's heaps) orders a class by. It changes only when the block is
        accessed, and the reuse term, the same for the whole class, is added last (`scoring.priority`)."""
        s, tb = self._slot[block_hash], self.table
        key = scoring.priority(
            self.weights,
            float(tb.tick.item(s)),
            horizon,
            tb.chain_hits.item(s),
            tb.requests.item(s),
            tb.source.item(s),
            float(tb.importance.item(s)),
        )
        return tb.reuse_class.item(s), key, tb.seq.item(s)

    def loop_rank_key(self, block_hash: Hashable, horizon: float) -> tuple[int, float, int, float] | None:
        """(gap bucket, `scoring.loop_key` at this horizon, seq, the vt after which it is overdue) of a block
        ranked by its loop now, else None: the key the replay's loop heaps order a bucket by (what moves
        with the clocks and the bucket's learned return probability are the same for the whole bucket:
        `scoring.loop_priority`)."""
        s, tb = self._slot[block_hash], self.table
        if self._loop_now(s) is None:
            return None
        bucket, last = tb.gap.item(s), tb.last_vt.item(s)
        gap = GAP_VALUES[bucket]
        value = scoring.value_of(
            self.weights, tb.chain_hits.item(s), tb.requests.item(s), tb.source.item(s),
            float(tb.importance.item(s)),
        )  # fmt: skip
        key = scoring.loop_key(self.weights, horizon, last + gap, gap, value)
        return bucket, key, tb.seq.item(s), last + (1 + self.weights.overdue) * gap

    def evictable_seq(self, block_hash: Hashable, tier: str) -> int:
        """The block's `seq` (the access counter at its last store, hit or move; unique, larger is more
        recent) if it is evictable from `tier` now, else 0."""
        if self._leaf_in.get(block_hash, -1) != self._tier.get(tier, -2):
            return 0
        return self.table.seq.item(self._slot[block_hash])

    def lru_fallback_order(self, tier: str) -> list[Hashable]:
        """Blocks of `tier`, least recently used first, sorted by `seq` on each call (O(N log N)). The tier
        manager owns the live recency order and passes it to the advisor; this one serves where the advisor
        runs without it (tests, replays)."""
        tb, n = self.table, self.table.high
        idx = np.flatnonzero((tb.uid[:n] != 0) & (tb.tier[:n] == self.tier_index(tier)))
        return [self._hashes[s] for s in idx[np.argsort(tb.seq[idx])].tolist()]

    # --- updates (the caller holds the lock) ---------------------------------------------------------
    def _store(
        self,
        block_hash: Hashable,
        parent_hash: Hashable | None,
        request_id: Hashable | None,
        t: int,
        source: int,
        importance: float,
        now: float,
    ) -> int:
        """Counters of a block not stored yet; returns its parent's slot (-1: stored as a root)."""
        ghost = self.reuse.stored(block_hash, len(self._slot))
        tb = self.table  # scalar reads through .item(): numpy scalars cost more than the work here
        s = tb.alloc()
        if s == len(self._hashes):
            self._hashes.append(block_hash)
        else:
            self._hashes[s] = block_hash
        self._slot[block_hash] = s
        self._leaf_in[block_hash] = t
        near = self._use(block_hash)
        tb.last_vt[s] = self.vt
        if ghost is not None:  # it came back: its reuse distance, and whether recency would have kept it
            tb.gap[s], tb.loop[s] = self._came_back(ghost.last_vt, ghost.bucket, ghost.loop, near)
        tb.tier[s], tb.source[s], tb.requests[s] = t, source, 1
        if block_hash not in self.shadow:
            tb.arc_out[s] = 1
            self._arc_out[block_hash] = None
        tb.last_access[s] = tb.created[s] = now
        tb.importance[s] = importance
        tb.last_request[s] = hash(request_id)
        self._size[t] += 1
        self._stores[t] += 1
        tb.tick[s] = self._stores[t]
        self._stamp(s)
        p = self._slot.get(parent_hash, -1) if parent_hash is not None else -1
        branching = True
        if p >= 0:
            tb.parent[s], tb.parent_uid[s] = p, tb.uid.item(p)
            tb.children[p, t] = tb.children.item(p, t) + 1
            tb.branches[p] = tb.branches.item(p) + 1
            branching, tb.chain_hits[s] = self._from_parent(p)
            if t <= tb.tier.item(p):  # a cached child in its tier or a faster one: no leaf now
                self._leaf_in[parent_hash] = -1
        tb.run[s] = tb.run.item(p) + 1 if p >= 0 and tb.hits.item(p) == 0 else 1
        if (p < 0 and parent_hash is not None) or (p >= 0 and tb.orphan.item(p)):
            tb.orphan[s] = 1  # under a parent not stored, or unreachable itself: no lookup reaches it
        self._start_lifetime(s, branching)
        return p

    def _hit(self, s: int, request_id: Hashable | None, now: float) -> tuple[int, int]:
        """Counters of a hit; returns (requests that used the block, 0 for the same request looking again;
        the parent's slot or -1)."""
        tb = self.table
        rid = hash(request_id)
        if request_id is not None and rid == tb.last_request.item(s):
            self._touch(s, now)  # the same request looking again (lookups repeat): recency only
            return 0, -1
        self.reuse.reused(tb.reuse_class.item(s))
        tb.last_request[s] = rid
        near = self._use(self._hashes[s])
        tb.gap[s], tb.loop[s] = self._came_back(tb.last_vt.item(s), tb.gap.item(s), tb.loop.item(s), near)
        tb.last_vt[s] = self.vt
        hits = tb.hits.item(s) + 1
        tb.hits[s] = hits
        requests = tb.requests.item(s) + 1
        tb.requests[s] = requests
        p = tb.live_parent(s)
        branching, inherited = True, 0.0
        if p >= 0:
            if hits == 1:
                tb.branches_hit[p] = tb.branches_hit.item(p) + 1
            branching, inherited = self._from_parent(p)
        tb.chain_hits[s] = max(tb.chain_hits.item(s), hits, inherited)
        self._start_lifetime(s, branching)
        self._touch(s, now)
        return requests, p

    def _move(self, s: int, f: int, t: int) -> None:
        tb = self.table
        p = tb.live_parent(s)
        if p >= 0:
            tb.children[p, f] = tb.children.item(p, f) - 1
            tb.children[p, t] = tb.children.item(p, t) + 1
            self._update_leaf(p)
        tb.tier[s] = t
        self._update_leaf(s)
        self._size[f] -= 1
        self._size[t] += 1
        self._stores[t] += 1
        tb.tick[s] = self._stores[t]
        self._stamp(s)

    def _remove(self, block_hash: Hashable) -> None:
        """Drop a stored block's counters; its reuse class stays a while as a ghost."""
        tb = self.table
        s = self._slot.pop(block_hash)
        t = tb.tier.item(s)
        p = tb.live_parent(s)
        if p >= 0:
            tb.children[p, t] = tb.children.item(p, t) - 1
            self._update_leaf(p)
        del self._leaf_in[block_hash]
        self._arc_out.pop(block_hash, None)
        self._size[t] -= 1
        self._removals += 1
        self._hashes[s] = None
        self.reuse.evicted(
            block_hash, tb.reuse_class.item(s), len(self._slot), tb.last_vt.item(s), tb.gap.item(s),
            tb.loop.item(s),
        )  # fmt: skip
        tb.free(s)

    # --- rules ---------------------------------------------------------------------------------------
    def _from_parent(self, p: int, new: int = 0) -> tuple[bool, float]:
        """(whether a child of `p` opens a branch, what it inherits as chain_hits). A protected parent, or
        one with other cached children, is a branching point: its children open a branch and inherit the
        fraction of its branches later hit; a linear, unprotected parent passes on its own chain_hits.
        `new`: 1 for a child not counted yet (an offer), 0 for one just stored."""
        tb = self.table
        branching = self._protected[tb.source.item(p)]
        if not branching:
            kids = new
            for i in self._tier_ids:
                kids += tb.children.item(p, i)
            branching = kids > 1
        if branching:
            n = tb.branches.item(p) + new
            return True, tb.branches_hit.item(p) / n if n else 0.0
        return False, float(tb.chain_hits.item(p))

    def _came_back(self, last_vt: int, bucket: int, loop: bool, near: bool) -> tuple[int, bool]:
        """A block last used at `last_vt` (then ranked by a loop of `bucket` if `loop`) is used again now
        (`near`: within recency's reach): an on-time return counts for its loop; returns its new (reuse
        distance bucket, loop flag): a loop block used again early (a follow-up) keeps its loop, its next
        return is still a loop away; otherwise the new distance, a loop lifetime opened if it came from
        beyond recency's reach."""
        on_time = loop and self.vt <= last_vt + (1 + self.weights.overdue) * GAP_VALUES[bucket]
        if on_time:
            self.reuse.loop_back(bucket)
            if near:
                return bucket, True
        bucket = gap_bucket(self.vt - last_vt)
        if not near:
            self.reuse.start_loop(bucket)
        return bucket, not near

    def _use(self, block_hash: Hashable) -> bool:
        """Count one block request (`vt`) and make the block the most recent in recency's reach; returns
        whether it was within reach: among the last len(self) distinct blocks requested, so that an LRU
        cache of this size would still hold it (its stack distance is at most the cache's size)."""
        self.vt += 1
        if self._bets or self._offers:
            self._settle(block_hash)
        recent = self._recent
        near = block_hash in recent
        recent.add(block_hash)
        limit = max(len(self._slot), 1)
        while len(recent) > limit:
            recent.pop_oldest()
        return near

    def _start_lifetime(self, s: int, opens_branch: bool) -> None:
        """Fix the block's reuse class from its features now and open a lifetime in it."""
        tb = self.table
        code = reuse_class(tb.chain_hits.item(s), tb.run.item(s), opens_branch)
        tb.reuse_class[s] = code
        self.reuse.start(code)

    def _update_leaf(self, s: int) -> None:
        children = self.table.children
        t = self.table.tier.item(s)
        leaf = True
        for i in range(t + 1):
            if children.item(s, i):
                leaf = False
                break
        self._leaf_in[self._hashes[s]] = t if leaf else -1

    def _touch(self, s: int, now: float) -> None:
        tb = self.table
        tb.last_access[s] = now
        tb.tick[s] = self._stores[tb.tier.item(s)]
        self._stamp(s)

    def _stamp(self, s: int) -> None:
        """Count an access (store, hit or move) and make it the slot's `seq`: the most recent of its tier."""
        self._accesses += 1
        self.table.seq[s] = self._accesses

    def check_invariants(self) -> None:
        """Assert the counters agree with the structure (tests and debugging; O(N))."""
        tb, n_tiers = self.table, len(self.tiers)
        live = np.fromiter(self._slot.values(), dtype=np.int64, count=len(self._slot))
        assert np.bincount(tb.tier[live], minlength=n_tiers).tolist() == self._size
        seqs = tb.seq[live]  # every access took a fresh seq: recency has no ties
        assert len(np.unique(seqs)) == len(live) and (seqs > 0).all() and (seqs <= self._accesses).all()
        expected = {s: [0] * n_tiers for s in self._slot.values()}
        for h, s in self._slot.items():
            assert self._hashes[s] == h and tb.uid[s] != 0
            p = tb.live_parent(s)
            if p >= 0:
                expected[p][tb.tier[s]] += 1
        for s, counts in expected.items():
            assert list(tb.children[s]) == counts, (self._hashes[s], list(tb.children[s]), counts)
            t = tb.tier[s]
            assert self._leaf_in[self._hashes[s]] == (-1 if any(counts[: t + 1]) else t)
        assert len(self._leaf_in) == len(self._slot)
        used = set(self._slot.values())
        assert all(tb.uid[s] == 0 and self._hashes[s] is None for s in range(tb.high) if s not in used)
        ghosts = self.reuse.ghosts
        assert len(ghosts) <= max(int(self.reuse.ghost_factor * len(self._slot)), 1)
        assert not any(h in self._slot for h in ghosts)
        loops = live[tb.loop[live] != 0]
        assert (tb.gap[loops] > 0).all() and (tb.last_vt[live] <= self.vt).all()
        for h, s in self._slot.items():  # the shadow ARC's view: what it dropped is queued for ARC mode
            assert bool(tb.arc_out[s]) == (h not in self.shadow) == (h in self._arc_out), h
        assert len(self._arc_out) <= len(self._slot)
