"""Admission control's rules: score a block offered for storing as if it were stored, say why not to store
it, and count one that was not stored.

Provides `Offer` (frozen: an offered block's priority, components and the probability behind them) and
`AdmissionRules`, a base of `BlockCounters` (`tiercache.graph.counters`) whose state it reads and updates:
- `offer(block, parent, horizon, now_tick, vt, source) -> Offer`: a ghost back from beyond recency's
  reach is scored by its loop (`scoring`), any other block by recency with its class's reuse probability.
- `decline_reason(offer, frontier) -> str | None`: Belady's choice for a loop block (not stored if it would
  rank below the block storing it evicts), a floor on the learned reuse probability for any other.
- `_decline(block, parent)`: the counters of a block not stored (the caller holds the graph's lock).
- `bet(block, frontier)`: a block judged not worth storing against the block storing it would evict; the
  next request of either settles the bet (`_settle`), and `ModeSelector.admit` says from the settled bets
  whether admission may decline at all (`tiercache.graph.arc`).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from tiercache.graph import scoring
from tiercache.graph.reuse import class_label, reuse_class
from tiercache.graph.scoring import GAP_VALUES, Loop, ScoreComponents, gap_bucket


@dataclass(frozen=True)
class Offer:
    """A block offered for storing, scored as if stored now: its priority and components, the learned
    probability behind its reuse term (its class's, or its loop's when `components.gap` > 0: it is ranked
    by its loop), its class code and the lifetimes seen in that class."""

    priority: float
    components: ScoreComponents
    reuse_p: float
    reuse_class: int
    lifetimes: float


class AdmissionRules:
    """Admission rules over `BlockCounters`' state (`weights`, `reuse`, `table`, `_slot`, `_recent`,
    `_declined`, `vt`) and rules (`_from_parent`, `_use`, `_came_back`)."""

    def offer(
        self,
        block_hash: Hashable,
        parent_hash: Hashable | None,
        horizon: float,
        now_tick: float,
        vt: int,
        source: int = 0,
    ) -> Offer:
        """A block not stored, scored as if it were stored now under `parent_hash` (clocks `now_tick`, `vt`:
        the tier's and the graph's, or a snapshot's): a ghost back from beyond recency's reach by its loop,
        any other by recency with its class's learned reuse probability. Changes nothing."""
        w = self.weights
        branching, chain, run = self._features(parent_hash)
        code = reuse_class(chain, run, branching)
        tick, vt = now_tick + 1, vt + 1  # the clocks it would be stored at
        ghost = self.reuse.ghost(block_hash, len(self._slot))
        if ghost is not None and block_hash not in self._recent:
            bucket = gap_bucket(vt - ghost.last_vt)
            reuse_p, gap = self.reuse.loop_probability(bucket), GAP_VALUES[bucket]
            loop = Loop(bucket, vt + gap, tick, vt)
            value = scoring.value_of(w, chain, 1, source, 0.0)
            key = scoring.loop_key(w, horizon, vt + gap, gap, value)
            priority = scoring.loop_priority(w, horizon, tick, vt, gap, key, reuse_p)
        else:
            reuse_p = self.reuse.probability(code)
            loop, priority = None, scoring.priority(w, tick, horizon, chain, 1, source, 0.0, reuse_p)
        comp = scoring.components(w, tick, horizon, chain, 1, source, 0.0, reuse_p, loop)
        return Offer(priority, comp, reuse_p, code, self.reuse.lifetimes[code])

    def decline_reason(self, offer: Offer, frontier: float | None) -> str | None:
        """Why an offered block should not be stored when storing it means evicting another (None: store
        it). `frontier`: the priority of the block that would be evicted (the lowest evictable one).
        A block back from beyond recency's reach is not stored if it would be due back later than every
        block kept (Belady's choice: it ranks below them all); any other, if its class is known, from at
        least 8 / `admit_floor` lifetimes, to come back less often than `admit_floor`."""
        comp, floor = offer.components, self.weights.admit_floor
        if comp.gap:
            if frontier is not None and offer.priority < frontier:
                return (
                    f"comes back every {comp.gap:,.0f} block requests, beyond recency's reach, and would "
                    f"be back last of the blocks kept (priority {offer.priority:.1f} < {frontier:.1f}, the "
                    "lowest kept)"
                )
            return None
        if offer.reuse_p < floor and offer.lifetimes * floor >= 8:
            return (
                f"blocks of its class ({class_label(offer.reuse_class)}) came back {offer.reuse_p:.2%} of "
                f"{offer.lifetimes:,.0f} times, under the admission floor {floor:.2%}"
            )
        return None

    def _decline(self, block_hash: Hashable, parent_hash: Hashable | None) -> int:
        """Counters of a block offered and not stored (admission control): one block request, a lifetime
        in the class it would have had, ended at once: it is remembered as a ghost used now (a return
        counts as reused, as for an evicted block). Returns that class."""
        ghost = self.reuse.stored(block_hash, len(self._slot))
        near = self._use(block_hash)
        bucket, loop = 0, False
        if ghost is not None:
            bucket, loop = self._came_back(ghost.last_vt, ghost.bucket, ghost.loop, near)
        branching, chain, run = self._features(parent_hash)
        code = reuse_class(chain, run, branching)
        self.reuse.start(code)
        self.reuse.evicted(block_hash, code, len(self._slot), self.vt, bucket, loop)
        self._declined = (block_hash, chain, run)
        return code

    def _features(self, parent_hash: Hashable | None) -> tuple[bool, float, int]:
        """(opens a branch, chain_hits, run) a block offered under `parent_hash` would have: as `_store`
        gives them under a cached parent; under the block declined just before it (the rest of a declined
        request), a linear child of that one; else a root."""
        p = self._slot.get(parent_hash, -1) if parent_hash is not None else -1
        if p >= 0:
            branching, chain = self._from_parent(p, 1)
            tb = self.table
            return branching, chain, tb.run.item(p) + 1 if tb.hits.item(p) == 0 else 1
        last, chain, run = self._declined
        if parent_hash is not None and parent_hash == last:
            return False, chain, run + 1
        return True, 0.0, 1

    def bet(self, block_hash: Hashable, frontier: Hashable) -> None:
        """Admission judged `block_hash` not worth storing against `frontier`, the block storing it would
        evict (declined or not: `ModeSelector.admit`): once it is stored or declined, whichever of the two is
        requested first settles the bet (`_settle`)."""
        self._offers[block_hash] = frontier

    def _settle(self, block_hash: Hashable) -> None:
        """A block request: settle the bets it ends, then open the one judged on it (if any)."""
        frontier = self._bets.pop(block_hash, None)
        if frontier is not None:  # the offered block came back first: declining it was wrong
            self._spared[frontier].remove(block_hash)
            if not self._spared[frontier]:
                del self._spared[frontier]
            self.modes.bet(False)
        for offered in self._spared.pop(block_hash, ()):  # the spared block came first: right
            del self._bets[offered]
            self.modes.bet(True)
        frontier = self._offers.pop(block_hash, None)
        if frontier is not None and frontier != block_hash and frontier not in self._bets:
            self._bets[block_hash] = frontier
            self._spared.setdefault(frontier, []).append(block_hash)
            while len(self._bets) > max(len(self._slot), 1):  # a turnover's worth: the oldest are void
                self._void(next(iter(self._bets)))

    def _void(self, block_hash: Hashable) -> None:
        """Forget the bets `block_hash` is part of (the oldest, beyond a cache's worth of open bets)."""
        frontier = self._bets.pop(block_hash, None)
        if frontier is not None:
            self._spared[frontier].remove(block_hash)
            if not self._spared[frontier]:
                del self._spared[frontier]
        for offered in self._spared.pop(block_hash, ()):
            del self._bets[offered]
