"""Reuse probability by block class, learned online from the hits and evictions the cache observes.

Provides `reuse_class(chain_hits, run, opens_branch) -> int`, `N_CLASSES`, `class_label(c)` and `ReuseStats`.

A block's class is fixed each time it is accessed (stored, or hit by a new request), from three features:
- chain level: 0 when `chain_hits` is 0, 1 for a fraction (a branch off a shared prefix, see `scoring`),
  then 2, 3, 4, 5 for `chain_hits` in [1, 2), [2, 4), [4, 8), [8, ∞): how often its prefix came back.
- run level: `run` is the number of never-reused blocks of the chain that end at this block (1 for the
  first new block after a reused one, 40 for the 40th block of a long prompt nobody sent before);
  levels 1..5 for run in [1], [2, 4), [4, 8), [8, 16), [16, ∞).
- opens a branch: the block has no cached parent, a protected parent, or siblings (its parent has other
  cached children).

Each access opens a *lifetime* in the block's class; the lifetime is *reused* if the block is hit again by
a new request, or stored (or offered and declined) again while the class it was evicted in is still
remembered (a *ghost*: evicted and declined blocks keep their class and the time of their last use in a
FIFO, as ARC keeps its B1/B2 lists, so the blocks the policy drops early still teach it whether, and after
how long, they came back). The FIFO holds `ghosts` × the number of cached blocks, so a loop up to
`ghosts` + 1 times the cache is seen to come back. Per class::

    p(class) = (reuses + 1) / (lifetimes + 2)       # Laplace's rule: 1/2 for a class never seen

When the lifetimes of all classes reach `window`, every counter is halved, so old behaviour fades.
Every update is O(1) (halving is O(N_CLASSES), once per `window/2` lifetimes).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import NamedTuple

import numpy as np

CHAIN_LEVELS, RUN_LEVELS = 6, 5
N_CLASSES = CHAIN_LEVELS * RUN_LEVELS * 2
N_BUCKETS = 256  # reuse-distance buckets (scoring.GAPS)


def chain_level(chain_hits: float) -> int:
    if chain_hits <= 0:
        return 0
    if chain_hits < 1:
        return 1
    return 2 + min(int(chain_hits).bit_length() - 1, 3)


def run_level(run: int) -> int:
    return min(max(run, 1).bit_length(), RUN_LEVELS)


def reuse_class(chain_hits: float, run: int, opens_branch: bool) -> int:
    """The class code in [0, N_CLASSES) of a block with these features (see the module docstring)."""
    return (chain_level(chain_hits) * RUN_LEVELS + run_level(run) - 1) * 2 + bool(opens_branch)


def class_label(code: int) -> str:
    """A readable name of a class code, e.g. 'chain 1/2 run 16+ branch'."""
    chain, rest = divmod(code, RUN_LEVELS * 2)
    run, branch = divmod(rest, 2)
    chains = ("0", "<1", "1", "2-3", "4-7", "8+")
    runs = ("1", "2-3", "4-7", "8-15", "16+")
    return f"chain {chains[chain]} run {runs[run]}" + (" branch" if branch else "")


class Ghost(NamedTuple):
    """What is remembered of an evicted or declined block: its class, last use (vt), reuse-distance bucket
    and loop flag then (`tiercache.graph.counters`), and whether it is still recent enough to be credited
    to its class (fewer evictions since than blocks cached)."""

    code: int
    last_vt: int
    bucket: int
    loop: bool
    recent: bool


class ReuseStats:
    """Per-class lifetimes and reuses (plain lists: scalar updates on the hot path), per reuse-distance
    bucket the loop lifetimes and on-time returns, and the ghost FIFO (block → one packed int)."""

    def __init__(self, window: int = 1 << 20, ghosts: float = 1.0) -> None:
        if window < 2:
            raise ValueError(f"reuse window must be >= 2 lifetimes, got {window}")
        self.window = window
        self.ghost_factor = ghosts
        self.lifetimes = [0.0] * N_CLASSES
        self.reuses = [0.0] * N_CLASSES
        self.loops = [0.0] * N_BUCKETS  # loop lifetimes by reuse-distance bucket
        self.loops_back = [0.0] * N_BUCKETS  # of those, the ones back before they were overdue
        self.total = 0.0
        self.halvings = 0
        self.evictions = 0  # ghosts recorded so far: a ghost's age
        self.ghosts: OrderedDict[Hashable, int] = OrderedDict()

    def start(self, code: int) -> None:
        """A block entered class `code` (stored, hit by a new request, or declined)."""
        self.lifetimes[code] += 1.0
        self.total += 1.0
        if self.total >= self.window:
            self.lifetimes = [x / 2 for x in self.lifetimes]
            self.reuses = [x / 2 for x in self.reuses]
            self.loops = [x / 2 for x in self.loops]
            self.loops_back = [x / 2 for x in self.loops_back]
            self.total /= 2
            self.halvings += 1

    def reused(self, code: int) -> None:
        """The lifetime a block opened in class `code` ended with a reuse."""
        self.reuses[code] += 1.0

    def start_loop(self, bucket: int) -> None:
        """A block came back from beyond recency's reach after about GAPS[bucket] block requests."""
        self.loops[bucket] += 1.0

    def loop_back(self, bucket: int) -> None:
        """A block that came back after GAPS[bucket] came back again before it was overdue."""
        self.loops_back[bucket] += 1.0

    def evicted(
        self, block: Hashable, code: int, cached: int, last_vt: int = 0, bucket: int = 0, loop: bool = False
    ) -> None:
        """Remember an evicted (or declined) block as the newest ghost: its class, last use (vt) and loop
        state; keep at most `ghost_factor` × `cached` ghosts (oldest forgotten first)."""
        self.ghosts.pop(block, None)
        self.evictions += 1
        self.ghosts[block] = ((self.evictions << 40 | last_vt) << 15) | bucket << 7 | bool(loop) << 6 | code
        limit = max(int(self.ghost_factor * cached), 1)
        while len(self.ghosts) > limit:
            self.ghosts.popitem(last=False)

    def stored(self, block: Hashable, cached: int) -> Ghost | None:
        """A block is stored or offered: if it is a ghost, forget it and return it; if it is recent (fewer
        evictions since than the `cached` blocks), the lifetime it was evicted in counts as reused."""
        ghost = self.ghost(block, cached)
        if ghost is not None:
            del self.ghosts[block]
            if ghost.recent:
                self.reused(ghost.code)
        return ghost

    def ghost(self, block: Hashable, cached: int) -> Ghost | None:
        """The ghost of `block` (None if not remembered); changes nothing."""
        packed = self.ghosts.get(block)
        if packed is None:
            return None
        seq, last_vt = packed >> 55, (packed >> 15) & ((1 << 40) - 1)
        bucket, loop, code = (packed >> 7) & 0xFF, bool(packed >> 6 & 1), packed & 0x3F
        return Ghost(code, last_vt, bucket, loop, self.evictions - seq < cached)

    def probability(self, code: int) -> float:
        return (self.reuses[code] + 1.0) / (self.lifetimes[code] + 2.0)

    def probabilities(self) -> np.ndarray:
        """float64 [N_CLASSES]: p(class) for every class."""
        return (np.array(self.reuses) + 1.0) / (np.array(self.lifetimes) + 2.0)

    def loop_probability(self, bucket: int) -> float:
        """Of the blocks that came back after about GAPS[bucket] block requests, the fraction back again
        in time (Laplace's rule, as `probability`)."""
        return (self.loops_back[bucket] + 1.0) / (self.loops[bucket] + 2.0)

    def loop_probabilities(self) -> np.ndarray:
        """float64 [N_BUCKETS]: `loop_probability` for every bucket."""
        return (np.array(self.loops_back) + 1.0) / (np.array(self.loops) + 2.0)
