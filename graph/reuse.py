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
a new request, or stored again while the class it was evicted in is still remembered (a *ghost*: evicted
blocks keep their class in a FIFO no longer than the number of cached blocks, as ARC keeps its B1/B2 lists,
so the blocks the policy drops early still teach it whether they came back). Per class::

    p(class) = (reuses + 1) / (lifetimes + 2)       # Laplace's rule: 1/2 for a class never seen

When the lifetimes of all classes reach `window`, every counter is halved, so old behaviour fades.
Every update is O(1) (halving is O(N_CLASSES), once per `window/2` lifetimes).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

import numpy as np

CHAIN_LEVELS, RUN_LEVELS = 6, 5
N_CLASSES = CHAIN_LEVELS * RUN_LEVELS * 2


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


class ReuseStats:
    """Per-class lifetimes and reuses (plain lists: scalar updates on the hot path) and the ghost FIFO."""

    def __init__(self, window: int = 1 << 20) -> None:
        if window < 2:
            raise ValueError(f"reuse window must be >= 2 lifetimes, got {window}")
        self.window = window
        self.lifetimes = [0.0] * N_CLASSES
        self.reuses = [0.0] * N_CLASSES
        self.total = 0.0
        self.halvings = 0
        self.ghosts: OrderedDict[Hashable, int] = OrderedDict()

    def start(self, code: int) -> None:
        """A block entered class `code` (stored, or hit by a new request)."""
        self.lifetimes[code] += 1.0
        self.total += 1.0
        if self.total >= self.window:
            self.lifetimes = [x / 2 for x in self.lifetimes]
            self.reuses = [x / 2 for x in self.reuses]
            self.total /= 2
            self.halvings += 1

    def reused(self, code: int) -> None:
        """The lifetime a block opened in class `code` ended with a reuse."""
        self.reuses[code] += 1.0

    def evicted(self, block: Hashable, code: int, limit: int) -> None:
        """Remember an evicted block's class; keep at most `limit` ghosts (oldest forgotten first)."""
        self.ghosts[block] = code
        while len(self.ghosts) > limit:
            self.ghosts.popitem(last=False)

    def stored(self, block: Hashable) -> int | None:
        """A block is stored: if it is a ghost, the lifetime it was evicted in counts as reused (its class is
        returned, else None)."""
        code = self.ghosts.pop(block, None)
        if code is not None:
            self.reused(code)
        return code

    def probability(self, code: int) -> float:
        return (self.reuses[code] + 1.0) / (self.lifetimes[code] + 2.0)

    def probabilities(self) -> np.ndarray:
        """float64 [N_CLASSES]: p(class) for every class."""
        return (np.array(self.reuses) + 1.0) / (np.array(self.lifetimes) + 2.0)
