"""GraphEvictionAdvisor: a background thread ranks blocks; the hot path reads the ranking without a lock.

Provides `GraphEvictionAdvisor` and `Snapshot`. Typical use by the tier manager::

    graph = KVCacheGraph(tiers=("vram", "dram"))
    advisor = GraphEvictionAdvisor(graph, interval_s=0.1, max_stale_s=1.0)
    advisor.start()                                 # or `with advisor:`; advisor.stop() joins the thread
    graph.on_store(h, parent_hash=p, request_id=r, tier="vram", token_span=(0, 16), source="system")
    decisions = advisor.choose_victims(4, "vram", candidates_lru_order=lru)  # lru: the manager's recency
                                                    # order, LRU first; list[EvictionDecision] to act on
    advisor.suggest_eviction(4, "vram")             # just the hashes
    advisor.suggest_prefetch(active_hashes, 8)      # blocks in slower tiers related to the active ones
    advisor.explain(h)                              # ScoreComponents of one block, now
    advisor.admission(h, parent, "dram", candidates)  # AdmissionDecision: do not store h; or None: store it

The thread (`start()`; its schedule is `tiercache.graph.cadence`'s) runs a cycle soon after the graph
changes (a store, hit, move, removal or declined offer: `graph.changes`), resting after each cycle at least
max(`cadence.MIN_GAP_S`, `cadence.BUSY_FACTOR` × its duration), so that it ranks at most a fifth of the
time. `interval_s` is the longest wait between cycles (from one's end to the next's start), changed or
not, and caps the rest: a snapshot is renewed at least as often as on a fixed `interval_s` schedule.

One cycle (`refresh()`, also callable synchronously): copy the counters and the learned probabilities
under the graph's lock (memcpy), then — outside the lock — score every block (`scoring.priority_array`,
and `loop_priority_array` for the blocks ranked by their loop), keep the leaves of each tier (no cached
child in that tier or a faster one) and sort them, lowest priority first (while the graph follows its
shadow ARC, `graph.mode == "arc"`, the leaves it does not hold come first, least recently used first;
the hot path reads those from `graph.arc_victims`, kept current by `on_request`, and admission stores
everything: `tiercache.graph.arc`). The result is an immutable
`Snapshot` (rankings, their priorities, the clocks, the cycle's duration) published by one reference
assignment. Readers take the reference and walk its tuples: no lock, no per-call scoring. A snapshot older
than `max_stale_s` (or none yet) is not trusted: `choose_victims` falls back to LRU (leaves first still;
the order the tier manager passes, or without one the graph's `lru_fallback_order`) and each decision says
so; `admission` stores everything.
"""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from collections.abc import Callable, Container, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from tiercache.graph import scoring
from tiercache.graph.cadence import run_cycles
from tiercache.graph.events import AdmissionDecision, EvictionDecision
from tiercache.graph.kvgraph import KVCacheGraph
from tiercache.graph.scoring import ScoreComponents

PREFETCH_EDGE_WEIGHTS = {"temporal": 2.0, "co_attend": 1.0, "semantic": 0.5, "prefix_share": 1.0}


@dataclass(frozen=True)
class Snapshot:
    """Eviction order per tier (lowest priority first, leaves only) at `created_at` (the graph's clock),
    with each ranked block's priority (`priorities[tier][i]` is that of `rankings[tier][i]`) and what
    admission scores an offered block against: each tier's horizon and store counter, and `vt`, then."""

    created_at: float
    version: int
    rankings: Mapping[str, tuple[Hashable, ...]]
    cycle_s: float
    priorities: Mapping[str, np.ndarray] = field(default_factory=dict)
    horizons: Mapping[str, float] = field(default_factory=dict)
    ticks: Mapping[str, int] = field(default_factory=dict)
    vt: int = 0
    mode: str = "graph"


class GraphEvictionAdvisor:
    def __init__(
        self,
        graph: KVCacheGraph,
        interval_s: float = 0.1,
        max_stale_s: float = 1.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if interval_s <= 0 or max_stale_s <= 0:
            raise ValueError(f"interval_s and max_stale_s must be > 0, got {interval_s}, {max_stale_s}")
        self.graph = graph
        self.interval_s = interval_s
        self.max_stale_s = max_stale_s
        self.clock = clock or graph.clock
        self._snapshot: Snapshot | None = None
        self._cursor: dict[str, int] = {}
        self._cursor_version = -1
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.cycles = 0

    # --- lifecycle -----------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=run_cycles, args=(weakref.ref(self), self._stop, self.interval_s), name="tiercache-advisor"
        )
        self._thread.daemon = True
        weakref.finalize(self, self._stop.set)
        self._thread.start()

    def stop(self, timeout: float | None = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise RuntimeError(f"advisor thread did not stop within {timeout}s")
            self._thread = None

    def __enter__(self) -> GraphEvictionAdvisor:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # --- the cycle -----------------------------------------------------------------------------------
    def refresh(self) -> Snapshot:
        """One ranking cycle, synchronously; publishes and returns the new snapshot."""
        t0 = time.perf_counter()
        created = self.clock()
        state = self.graph.export()
        rankings, priorities, horizons = {}, {}, {}
        live = state.uid != 0
        hashes = np.empty(len(state.hashes), dtype=object)
        hashes[:] = state.hashes
        for t, name in enumerate(self.graph.tiers):
            leaf = live & (state.tier == t) & ~state.children[:, : t + 1].any(axis=1)
            idx = np.flatnonzero(leaf)
            horizons[name] = float(max(state.tier_sizes[t], 1))
            prio = self._priorities(state, idx, horizons[name], state.tier_ticks[t])
            if state.mode == "arc":  # following the shadow ARC: the blocks it dropped first, oldest first
                out = state.arc_out[idx] != 0
                sort = np.lexsort((state.seq[idx], np.where(out, 0.0, prio), ~out))
            else:
                sort = np.lexsort((state.last_access[idx], prio))
            rankings[name] = tuple(hashes[idx[sort]])  # no per-block Python objects: no GC pressure
            priorities[name] = prio[sort]
        version = self.cycles + 1
        ticks = dict(zip(self.graph.tiers, state.tier_ticks, strict=True))
        snap = Snapshot(
            created, version, MappingProxyType(rankings), time.perf_counter() - t0,
            MappingProxyType(priorities), MappingProxyType(horizons), MappingProxyType(ticks), state.vt,
            state.mode,
        )  # fmt: skip
        self._snapshot = snap  # the publication: one reference assignment
        self.cycles = version
        return snap

    def _priorities(self, state, idx: np.ndarray, horizon: float, now_tick: int) -> np.ndarray:
        """float64 [len(idx)]: the priority of each block `idx` of one tier: by recency, or by its loop where
        it is flagged and not overdue (the same operations as the scalar path and the replay's heaps)."""
        w = self.graph.weights
        value = scoring.value_array(
            w, state.chain_hits[idx], state.requests[idx], state.source[idx], state.importance[idx]
        )
        prio = (
            state.tick[idx]
            + horizon * value
            + horizon * scoring.reuse_terms(w, state.reuse_p[state.reuse_class[idx]])
        )
        prio += horizon * scoring.ORPHAN * state.orphan[idx]  # unreachable blocks first (never in a replay)
        loop = np.flatnonzero(state.loop[idx] != 0)
        if len(loop):
            bucket, last = state.gap[idx[loop]], state.last_vt[idx[loop]]
            on = np.flatnonzero(state.vt <= last + (1 + w.overdue) * scoring.GAPS[bucket])  # not overdue
            loop, bucket, last = loop[on], bucket[on], last[on]
            prio[loop] = (
                scoring.loop_priority_array(
                    w, horizon, now_tick, state.vt, bucket, last, value[loop], state.loop_p[bucket]
                )
                + horizon * scoring.ORPHAN * state.orphan[idx[loop]]
            )
        return prio

    # --- hot path ------------------------------------------------------------------------------------
    @property
    def snapshot(self) -> Snapshot | None:
        return self._snapshot

    def snapshot_age(self) -> float | None:
        snap = self._snapshot
        return None if snap is None else self.clock() - snap.created_at

    def suggest_eviction(self, n: int, tier: str) -> list[Hashable]:
        """Up to n blocks of `tier` to evict, best first, from the published snapshot (no lock). Entries
        that stopped being evictable since the snapshot are skipped. Empty when there is no snapshot."""
        snap = self._snapshot
        if snap is None:
            return []
        if self._cursor_version != snap.version:
            self._cursor, self._cursor_version = {}, snap.version
        ranking = snap.rankings.get(tier, ())
        i = self._cursor.get(tier, 0)
        ok = self.graph.is_evictable
        while i < len(ranking) and not ok(ranking[i], tier):
            i += 1
        self._cursor[tier] = i
        out = []
        if self.graph.mode == "arc":  # following the shadow ARC: what it dropped, kept current by on_request
            out = list(itertools.islice(self.graph.arc_victims(tier), n))
            if len(out) == n:
                return out
        taken = set(out)
        for j in range(i, len(ranking)):  # no slicing: the ranking may hold 250k entries
            if ok(ranking[j], tier) and ranking[j] not in taken:
                out.append(ranking[j])
                if len(out) == n:
                    break
        return out

    def choose_victims(
        self, n: int, tier: str, candidates_lru_order: Iterable[Hashable] | None = None
    ) -> list[EvictionDecision]:
        """Decisions for up to n evictions from `tier` (to the next slower tier, or dropped from the last).
        Uses the snapshot when it is at most `max_stale_s` old; otherwise — or for the rest when the
        snapshot ranks fewer than n evictable blocks (blocks stored since it was taken) — LRU order
        (`candidates_lru_order`: the tier manager's own; without it, standalone, the graph's
        `lru_fallback_order(tier)`), evictable blocks only, and each decision records which policy it came
        from and why."""
        tiers = self.graph.tiers
        t = self.graph.tier_index(tier)
        tier_to = tiers[t + 1] if t + 1 < len(tiers) else None
        age = self.snapshot_age()
        picks: list[tuple[Hashable, str, str]] = []
        if age is not None and age <= self.max_stale_s:
            why = f"lowest priority leaf in {tier} (snapshot v{self._snapshot.version})"
            if self.graph.mode == "arc":
                why = (
                    f"following ARC in {tier} (the graph's ranking lost to a shadow ARC on the same "
                    "requests): not held by the shadow ARC, or its lowest priority leaf "
                    f"(snapshot v{self._snapshot.version})"
                )
            picks = [(h, "graph", why) for h in self.suggest_eviction(n, tier)]
            fallback = f"snapshot v{self._snapshot.version} ranks no more evictable blocks of {tier}"
        elif age is None:
            fallback = "no snapshot yet"
        else:
            fallback = f"snapshot {age:.3f}s old > max_stale {self.max_stale_s}s"
        if len(picks) < n:  # stale, missing or exhausted snapshot: LRU, leaves first still
            taken = {h for h, _, _ in picks}
            lru = candidates_lru_order
            if lru is None:  # standalone: no tier manager's order, so the graph's, sorted from its counters
                lru = self.graph.lru_fallback_order(tier)
            why = f"least recently used leaf in {tier}; {fallback}"
            more = self._lru_victims(n - len(picks), tier, (h for h in lru if h not in taken))
            picks += [(h, "lru-fallback", why) for h in more]
        out = []
        for h, policy, reason in picks:
            comp = self.explain(h)
            if comp.gap and policy == "graph":
                reason += _loop_reason(comp)
            out.append(EvictionDecision(h, tier, tier_to, policy, comp.total, comp, age, reason))
        return out

    def admission(
        self,
        block_hash: Hashable,
        parent_hash: Hashable | None,
        tier: str,
        candidates: Container[Hashable] | None = None,
        source: int = 0,
    ) -> AdmissionDecision | None:
        """A decision not to store `block_hash` (under `parent_hash`), or None to store it, when storing it
        means evicting the lowest-ranked evictable block of `tier` (in `candidates`, when given): the block is
        scored as if stored at the snapshot's clocks and compared with that one's priority in the snapshot
        (`BlockCounters.offer`, `decline_reason`). Without a snapshot at most `max_stale_s` old: None."""
        block, frontier = next(self.frontier_blocks(tier, candidates), (None, None))
        return self.judge(block_hash, parent_hash, tier, frontier, source, block)

    def frontiers(self, tier: str, candidates: Container[Hashable] | None = None) -> Iterator[float]:
        """The snapshot's priorities of the evictable blocks of `tier` (in `candidates`), lowest first: what
        the 1st, 2nd, … block stored would evict (for a batch of offers: each one admitted takes the next)."""
        return (priority for _, priority in self.frontier_blocks(tier, candidates))

    def frontier_blocks(
        self, tier: str, candidates: Container[Hashable] | None = None
    ) -> Iterator[tuple[Hashable, float]]:
        """`frontiers` with each block: (block, its priority in the snapshot)."""
        snap = self._snapshot
        if snap is None or tier not in snap.rankings:
            return
        ranking, ok, prio = snap.rankings[tier], self.graph.is_evictable, snap.priorities[tier]
        if self._cursor_version != snap.version:
            self._cursor, self._cursor_version = {}, snap.version
        for i in range(self._cursor.get(tier, 0), len(ranking)):  # entries before it left (suggest_eviction)
            h = ranking[i]
            if ok(h, tier) and (candidates is None or h in candidates):
                yield h, float(prio[i])

    def judge(
        self,
        block_hash: Hashable,
        parent_hash: Hashable | None,
        tier: str,
        frontier: float | None,
        source: int = 0,
        frontier_block: Hashable | None = None,
    ) -> AdmissionDecision | None:
        """`admission` against a given `frontier` (the priority of the block storing it would evict,
        `frontier_block`): a block judged not worth storing opens a bet on which of the two is requested
        first (`BlockCounters.bet`), and is declined only while such bets prove admission right
        (`ModeSelector.admit`; else None: store it)."""
        snap, age = self._snapshot, self.snapshot_age()
        if snap is None or age is None or age > self.max_stale_s or tier not in snap.rankings:
            return None
        if self.graph.mode == "arc":  # following the shadow ARC, which stores every block
            return None
        g = self.graph
        offer = g.offer(block_hash, parent_hash, snap.horizons[tier], snap.ticks[tier], snap.vt, source)
        reason = g.decline_reason(offer, frontier)
        if reason is None:
            return None
        if frontier_block is not None:
            g.bet(block_hash, frontier_block)
        if not g.modes.admit:
            return None
        why = f"not stored: {reason} (snapshot v{snap.version})"
        return AdmissionDecision(block_hash, tier, offer.priority, offer.components, frontier, age, why)

    def _lru_victims(self, n: int, tier: str, candidates: Iterable[Hashable]) -> list[Hashable]:
        out = []
        for h in candidates:
            if self.graph.is_evictable(h, tier):
                out.append(h)
                if len(out) == n:
                    break
        return out

    def explain(self, block_hash: Hashable) -> ScoreComponents:
        """The score components of one block, computed from its current counters."""
        return scoring.components(self.graph.weights, *self.graph.score_inputs(block_hash))

    def suggest_prefetch(self, active_hashes: Sequence[Hashable], n: int) -> list[Hashable]:
        """Up to n blocks outside the fastest tier linked to the active blocks, strongest links first
        (edge counts weighted by PREFETCH_EDGE_WEIGHTS; a block's not-yet-fast parent comes first)."""
        g, fastest = self.graph, self.graph.tiers[0]
        active = dict.fromkeys(active_hashes)
        score: dict[Hashable, float] = {}
        for h in active:
            if h not in g:
                continue
            parent = g.parent_of(h)
            if parent is not None and parent not in active and g.tier_of(parent) != fastest:
                score[parent] = score.get(parent, 0.0) + 1e9  # a hit needs the whole chain
            for other, data in g.neighbors(h):
                if other in active or g.tier_of(other) == fastest:
                    continue
                gain = sum(PREFETCH_EDGE_WEIGHTS.get(k, 0.0) * v for k, v in data.items())
                if gain > 0:
                    score[other] = score.get(other, 0.0) + gain
        return sorted(score, key=lambda h: -score[h])[:n]  # stable: ties keep discovery order


def _loop_reason(comp: ScoreComponents) -> str:
    """Why a block ranked by its loop goes (see `scoring`): it is due back later than the blocks kept."""
    due = f"due back in {comp.due_in:,.0f}" if comp.due_in >= 0 else f"{-comp.due_in:,.0f} late"
    return (
        f"; ranked by its loop: back every {comp.gap:,.0f} block requests, beyond recency's reach, {due}: "
        "the newest arrival of a loop goes first so that the blocks kept stay kept"
    )
