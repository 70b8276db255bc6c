"""The graph policy's fallback: an ARC shadow the live cache follows while the graph's predictions lose to it.

Provides `ARCCache` (ARC's algorithm over blocks: the replay's "arc" policy), `ShadowARC` (the same,
hash-only, fed the same requests as the cache), `ModeSelector` (which of the two the cache follows,
decided online from their hits on the same requests) and `ArcFallback` (a base of `BlockCounters`: the
`on_request` update, `mode` and `arc_victims`).

Why: the graph's predictions (reuse classes, loop ranking, admission) pay on some traffic and cost on other
traffic (a production trace where conversations do not return on a period: issue 40). Instead of tuning
them, the cache measures its own regret online, as ARC measures its recency/frequency balance with its ghost
lists: a shadow ARC (Megiddo & Modha, FAST 2003) of the cache's size sees every request (`on_request`, in
prefix order, before the cache evicts for it) and records the prefix hit it would have had; the cache's own
prefix hit on the same request is known at the same moment. Per request, `d = cache hits − ARC hits`.

The mode (`ModeSelector`): "graph" (the graph's ranking and admission, as before) or "arc" (evict first the
blocks the shadow ARC does not hold, least recently used first; store every block: the cache converges to
ARC's content within about one turnover and then evicts what ARC evicts). While in "graph" mode the
differences are summed, `D = Σ d`, with `V = Σ |d|`: a sign test over the blocks that one of the two hit and
the other missed; the cache follows ARC once the graph is behind by two standard deviations, `D < −2·√V`
(the usual 5 % significance: noise keeps the graph). A turnover is as many misses as the cache holds; both
sums halve every turnover, so the test weighs the last few turnovers of traffic. The graph is not judged
during its cold start, the first `1 + ghosts` turnovers after the cache is full (`ScoreWeights.ghosts`:
before then its ghosts have not had the time to come back and teach it its reuse classes and loops), and
what it lost then is forgotten. After a loss the cache follows ARC for `backoff` turnovers and then tries
the graph again; the backoff doubles after each loss and is one turnover again once the graph leads (z > 0
at a turnover): each prediction keeps proving itself, and a graph that wins keeps the cache. No parameter
is fitted to a trace: the capacity is the cache's own (its high-water mark of stored blocks), the threshold
a significance level, the warm-up the graph's own ghost memory, the backoff exponential.

Admission control proves itself the same way, one decision at a time: each block it judges not worth
storing opens a bet against the block that storing it would evict (`BlockCounters.bet`); whichever of the
two is requested first settles it (the spared block first: admission was right; the offered block first:
wrong). It declines only while its settled bets, halved every turnover as above, are right at least as often
as wrong (`ModeSelector.admit`); otherwise the block is stored, and the bet is still recorded, so that the
evidence keeps coming in either state. At most a cache's worth of bets is open (the oldest are void).

The learned statistics (reuse classes, loops) keep learning from every notification in either mode.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable, Iterator, Sequence


class ARCCache:
    """Adaptive Replacement Cache (Megiddo & Modha, FAST 2003) over blocks, with ghost lists B1/B2."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity = capacity_blocks
        self.evictions = 0
        self.p = 0.0
        self.t1: OrderedDict[Hashable, None] = OrderedDict()
        self.t2: OrderedDict[Hashable, None] = OrderedDict()
        self.b1: OrderedDict[Hashable, None] = OrderedDict()
        self.b2: OrderedDict[Hashable, None] = OrderedDict()
        self._pinned: set[Hashable] = set()

    @property
    def size(self) -> int:
        return len(self.t1) + len(self.t2)

    def __contains__(self, block: Hashable) -> bool:
        return block in self.t1 or block in self.t2

    def process(self, blocks: Sequence[Hashable], sources: Sequence[int]) -> int:
        blocks = blocks[: self.capacity]
        hit = prefix_hit(blocks, self)
        self._pinned = set(blocks)
        for b in reversed(blocks):
            if b in self:
                self._access(b)
        for b in reversed(blocks):
            if b not in self:
                self._access(b)
        for b in reversed(blocks):
            (self.t1 if b in self.t1 else self.t2).move_to_end(b)
        self._pinned = set()
        return hit

    def _access(self, x: Hashable) -> None:
        c, t1, t2, b1, b2 = self.capacity, self.t1, self.t2, self.b1, self.b2
        if x in t1:
            del t1[x]
            t2[x] = None
        elif x in t2:
            t2.move_to_end(x)
        elif x in b1:
            self.p = min(float(c), self.p + max(len(b2) / len(b1), 1.0))
            self._replace(in_b2=False)
            del b1[x]
            t2[x] = None
        elif x in b2:
            self.p = max(0.0, self.p - max(len(b1) / len(b2), 1.0))
            self._replace(in_b2=True)
            del b2[x]
            t2[x] = None
        else:
            l1 = len(t1) + len(b1)
            if l1 >= c:
                if len(t1) < c:
                    b1.popitem(last=False)
                    self._replace(in_b2=False)
                else:
                    self._evict_from(t1, ghost=None)
            elif l1 + len(t2) + len(b2) >= c:
                if l1 + len(t2) + len(b2) >= 2 * c:
                    b2.popitem(last=False)
                self._replace(in_b2=False)
            t1[x] = None

    def _replace(self, in_b2: bool) -> None:
        if len(self.t1) + len(self.t2) < self.capacity:
            return
        t1_first = len(self.t1) > 0 and (len(self.t1) > self.p or (in_b2 and len(self.t1) == self.p))
        first, second = (self.t1, self.t2) if t1_first else (self.t2, self.t1)
        if not self._evict_from(first, ghost=self.b1 if t1_first else self.b2):
            self._evict_from(second, ghost=self.b2 if t1_first else self.b1)

    def _evict_from(self, lst: OrderedDict, ghost: OrderedDict | None) -> bool:
        for b in lst:  # the LRU end, skipping the current request's blocks
            if b not in self._pinned:
                del lst[b]
                if ghost is not None:
                    ghost[b] = None
                self.evictions += 1
                return True
        return False


Z = 2.0  # significance of the graph's loss before the cache follows ARC (two standard deviations)


class ShadowARC(ARCCache):
    """ARC over hashes only (no data), fed whole requests; `left` collects the blocks it evicted since the
    caller last cleared it. Its capacity only grows (`grow`): the cache's high-water mark."""

    def __init__(self) -> None:
        super().__init__(1)
        self.left: list[Hashable] = []

    def grow(self, capacity: int) -> None:
        if capacity > self.capacity:
            self.capacity = capacity

    def _evict_from(self, lst, ghost) -> bool:
        for b in lst:  # ARCCache's rule, recording the victim
            if b not in self._pinned:
                del lst[b]
                if ghost is not None:
                    ghost[b] = None
                self.evictions += 1
                self.left.append(b)
                return True
        return False


class ModeSelector:
    """Which ranking the cache follows: "graph" or "arc" (see the module docstring). `warmup`: turnovers
    before the graph is judged (its cold start: 1 + the ghost list's length in turnovers)."""

    def __init__(self, warmup: int = 4) -> None:
        self.warmup = warmup
        self.mode = "graph"
        self.diff = 0.0  # D: cache hits − ARC hits, in blocks, while in graph mode (decayed)
        self.evidence = 0.0  # V: Σ |d| (decayed)
        self.seen = 0  # misses since the last turnover
        self.turnovers = 0  # since the cache was first full
        self.switches = 0
        self.backoff = 1  # turnovers the next stay in "arc" mode lasts; doubles after each loss
        self.wait = 0  # turnovers left before the graph is tried again
        self.cache_hits = self.arc_hits = 0  # totals, for reports
        self.admit_right = self.admit_wrong = 0.0  # admission's resolved bets (decayed): see `admit`

    @property
    def admit(self) -> bool:
        """Whether admission control may decline: unless its settled bets (`BlockCounters.bet`) were wrong
        more often than right by two standard deviations over the last turnovers (a sign test, as `z`)."""
        n = self.admit_right + self.admit_wrong
        return not n or self.admit_right - self.admit_wrong >= -Z * math.sqrt(n)

    def bet(self, right: bool) -> None:
        """One admission bet resolved: the declined (or would-be declined) block or the block it spared was
        requested first."""
        if right:
            self.admit_right += 1
        else:
            self.admit_wrong += 1

    @property
    def z(self) -> float:
        """The graph's lead over ARC in standard deviations (0 with no evidence)."""
        return self.diff / math.sqrt(self.evidence) if self.evidence else 0.0

    def update(self, cache_hit: int, arc_hit: int, blocks: int, capacity: int) -> None:
        """One request: its prefix hit (blocks) in the cache and in the shadow ARC, and its length;
        `capacity`: the cache's, once it is full (0 before: no turnover is counted while it fills)."""
        self.cache_hits += cache_hit
        self.arc_hits += arc_hit
        if self.mode == "graph":
            d = cache_hit - arc_hit
            self.diff += d
            self.evidence += abs(d)
        if capacity:
            self.seen += max(blocks - cache_hit, 0)
            while self.seen >= capacity:
                self.seen -= capacity
                self._turnover()
        if self.mode == "graph" and self.z < -Z and self.turnovers >= self.warmup:
            self.mode, self.wait = "arc", self.backoff
            self.backoff *= 2
            self.switches += 1
        elif self.mode == "arc" and self.wait <= 0:
            self.mode = "graph"
            self.switches += 1

    def _turnover(self) -> None:
        """As many misses as the cache holds: the evidence halves."""
        self.diff /= 2
        self.evidence /= 2
        self.admit_right /= 2
        self.admit_wrong /= 2
        self.turnovers += 1
        if self.turnovers == self.warmup:  # the cold start is not held against the graph
            self.diff = self.evidence = 0.0
        if self.mode == "arc":
            self.wait -= 1
        elif self.z > 0:  # the graph leads: a later loss is tried again after one turnover
            self.backoff = 1


def prefix_hit(blocks: Sequence[Hashable], cached) -> int:
    n = 0
    for b in blocks:
        if b not in cached:
            break
        n += 1
    return n


class ArcFallback:
    """The shadow ARC's side of `BlockCounters` (a base of it), over its state (`shadow`, `modes`, `_arc_out`,
    `_offers`, `table`, `_slot`, `_leaf_in`, `_tier`)."""

    @property
    def mode(self) -> str:
        """The ranking the cache follows now: "graph" or "arc" (`tiercache.graph.arc`)."""
        return self.modes.mode

    def arc_victims(self, tier: str) -> Iterator[Hashable]:
        """Evictable blocks of `tier` that the shadow ARC does not hold, in the order it dropped them (what
        the cache evicts first while it follows ARC; lazy: stop early). No lock: the notifying thread."""
        t, leaf_in = self._tier.get(tier, -2), self._leaf_in
        return (b for b in self._arc_out if leaf_in[b] == t)

    def _request(self, blocks: list[Hashable]) -> None:
        """A request arrives: its prefix hit here and in the shadow ARC (which then takes the request and
        evicts what ARC would) decide the mode; blocks the shadow dropped are marked `arc_out`."""
        self._requests += 1
        self._offers.clear()  # judged for an earlier request and never stored nor declined
        shadow, tb = self.shadow, self.table
        cache_hit = prefix_hit(blocks, self._slot)
        shadow.grow(len(self._slot))
        arc_hit = shadow.process(blocks, ())
        for b in shadow.left:
            s = self._slot.get(b, -1)
            if s >= 0:
                tb.arc_out[s] = 1
                self._arc_out[b] = None
        shadow.left.clear()
        for b in blocks[: shadow.capacity]:
            s = self._slot.get(b, -1)
            if s >= 0:
                tb.arc_out[s] = 0
                self._arc_out.pop(b, None)
        self.modes.update(cache_hit, arc_hit, len(blocks), shadow.capacity if shadow.evictions else 0)
