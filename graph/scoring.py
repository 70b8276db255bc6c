"""The eviction score: one documented formula, kept as components for explanation.

Provides:
- `SOURCES`: the source labels, in code order (`source_code(label)` maps a label to its code).
- `ScoreWeights`: the formula's weights and the protected sources (frozen; validated).
- `ScoreComponents`: the terms of one block's score (frozen), as `explain()` returns them.
- `components(...)` (one block), `priority(...)` (one block, fast) and `priority_array(...)` (numpy, all
  blocks at once). The three compute the same number; a test checks it.

The formula (lower priority = evicted first, among blocks that are leaves of the prefix tree)::

    value    = w_reuse·log2(reuse_p) + w_hits·log2(1 + chain_hits) + w_requests·log2(max(requests, 1))
               + w_source[source] + w_importance·importance + (protect_bonus if source is protected)
    priority = last_access_tick + horizon · value

- `last_access_tick`: the tier's store counter (blocks stored or moved into the tier so far) when the block
  was last stored or hit, so recency is measured in cache insertions, not seconds (deterministic,
  load-independent). Ties go to the earlier access (LRU).
- `horizon`: the tier's size in blocks. One unit of value buys a block the residence of one whole cache
  turnover (that many insertions), so the weights mean the same thing at every capacity; value = 0 is LRU.
- `reuse_p`: the probability, learned online for the block's class (`tiercache.graph.reuse`), that a block
  of that class is used again by a later request before it is forgotten; the class is fixed at the
  block's last access from its chain level, its run of never-reused blocks and whether it opens a branch.
  Each halving of reuse_p costs the block `w_reuse` turnovers: a one-off long prompt (a class that never
  comes back) leaves first, a conversation that came back once stays about as long as LRU would keep it.
  No trace parameter is read: the estimate comes only from the hits and evictions the cache observes.
- `chain_hits`: the block's hits (later requests that found it cached), or what it inherited if larger.
  From an unprotected parent with no other cached child (a linear chain) it inherits the parent's
  `chain_hits`: the tail a conversation just appended is worth what the conversation has proven. From a
  branching point or a protected parent (a shared system prompt, a document) it inherits the fraction of
  that parent's branches that were later hit: how often continuations off this prefix come back. It enters
  the value through the block's class, and directly with `w_hits` (0 by default).
- `requests`: distinct requests that used the block (sharing across requests, the `prefix_share` signal):
  a block shared by 2^k requests stays `w_requests`·k turnovers longer.
- `source`: label weight (none by default: what each source is worth is learned through reuse_p);
  protected sources add `protect_bonus` turnovers, so they leave only when nothing else can or after long
  disuse.
- `importance`: an optional external input (e.g. attention mass), 0 by default.

Loops larger than the cache (`tiercache.graph.counters` tells them apart: a block whose last reuse came
after more distinct blocks than the cache holds, so recency would have lost it): such a block is ranked by
when it is due back instead of by when it was last used, as Belady's rule would rank it::

    priority = now_tick − w_loop·horizon·r + horizon·(hits + requests + source + importance + protection)
    r        = (due − vt) / gap,   due = last use + gap    (in block requests: the graph's `vt` clock)

`gap` is the block's last reuse distance (rounded to a quarter octave, `GAPS`), `r` the fraction of it
still to wait: 1 just after a use, 0 when it is due. A block just used is worth what a block idle for
`w_loop` turnovers is, and more as its return nears; the newest arrival of a loop is the first to go, so
the blocks already kept stay kept (a stable subset, not a churn). The learned reuse term does not apply
(the block came back); a block still not back at `due + w_overdue·gap` is ranked by the formula above
again. Components report the loop term as `loop` = (now_tick − tick)/horizon − w_loop·r, so `total` is
still tick + horizon·(sum of the terms), with `gap` and `due_in` (= due − vt) beside.

An unreachable block (`orphan`: a block of its prefix was removed while it was cached, so no lookup reaches
it any more) has the term `orphan` = ORPHAN (−1000 turnovers): it goes before any reachable block.

Leaves first is not part of the number: rankings only list blocks with no cached children in the tier or a
faster one, so a parent — needed by every hit on its descendants — always outlives them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

SOURCES: tuple[str, ...] = ("unknown", "system", "user", "assistant", "tool", "generation")
_SOURCE_CODE = {name: i for i, name in enumerate(SOURCES)}
GAPS = 2.0 ** (np.arange(256) / 4)  # reuse distances by bucket (a quarter octave each; bucket 0: none)
GAP_VALUES: tuple[float, ...] = tuple(GAPS.tolist())  # the same, as Python floats (scalar code)
ORPHAN = -1000.0  # the value term of an unreachable block, in turnovers


def gap_bucket(gap: int) -> int:
    """The `GAPS` bucket of a reuse distance of `gap` block requests (>= 1)."""
    return min(max(round(4 * math.log2(max(gap, 1))), 1), len(GAPS) - 1)


def source_code(label: str | None) -> int:
    """Code of a source label (None → "unknown"); raises ValueError naming the valid labels."""
    if label is None:
        return 0
    try:
        return _SOURCE_CODE[label]
    except KeyError:
        raise ValueError(f"unknown source label {label!r}; valid: {', '.join(SOURCES)}") from None


@dataclass(frozen=True)
class ScoreWeights:
    """Weights of the score formula (see the module docstring); values are in cache turnovers.
    `reuse_window`: lifetimes after which the learned reuse counters are halved (`reuse.ReuseStats`);
    `ghosts`, `admit_floor`: how long evicted blocks are remembered, and the admission floor
    (`tiercache.graph.counters`)."""

    reuse: float = 1.0
    hits: float = 0.0
    requests: float = 0.5
    importance: float = 1.0
    source: dict[str, float] = field(default_factory=dict)
    protected_sources: frozenset[str] = frozenset({"system"})
    protect_bonus: float = 4.0
    reuse_window: int = 1 << 20
    loop: float = 1.0  # turnovers a loop block just used is worth less than a fresh block (see above)
    overdue: float = 0.5  # a loop block not back by due + overdue·gap is ranked as any other again
    ghosts: float = 3.0  # evicted blocks remembered, in multiples of the blocks cached (reuse.ReuseStats)
    admit_floor: float = 1 / 512  # under pressure, a block whose class comes back less often is not stored

    def __post_init__(self) -> None:
        for label in (*self.source, *self.protected_sources):
            source_code(label)
        for name in ("protect_bonus", "reuse", "loop", "overdue", "ghosts", "admit_floor"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.reuse_window < 2:
            raise ValueError(f"reuse_window must be >= 2 lifetimes, got {self.reuse_window}")

    def source_table(self) -> np.ndarray:
        """float64 [len(SOURCES)]: source weight plus protection bonus, by source code."""
        return np.array([self.source_value(code) for code in range(len(SOURCES))], dtype=np.float64)

    def source_value(self, code: int) -> float:
        name = SOURCES[code]
        return self.source.get(name, 0.0) + (self.protect_bonus if name in self.protected_sources else 0.0)

    def is_protected(self, code: int) -> bool:
        return SOURCES[code] in self.protected_sources


@dataclass(frozen=True)
class ScoreComponents:
    """The terms of one block's priority: total = tick + horizon·(reuse + hits + requests + source +
    importance + protection + loop + orphan). `loop`, `gap` and `due_in` are 0 unless the block is ranked by
    its loop (see the module docstring): then `reuse` is its loop's term, `gap` its reuse distance and
    `due_in` the block requests until it is due back (negative: late); `orphan` is ORPHAN for a block no
    lookup can reach, else 0."""

    tick: float
    horizon: float
    reuse: float
    hits: float
    requests: float
    source: float
    importance: float
    protection: float
    loop: float
    orphan: float
    total: float
    gap: float = 0.0
    due_in: float = 0.0


@dataclass(frozen=True)
class Loop:
    """A block's loop state for the formula: `gap` bucket (`GAPS`), `due` (vt), the clocks now."""

    bucket: int
    due: float
    now_tick: float
    vt: float


def components(
    w: ScoreWeights,
    tick: float,
    horizon: float,
    chain_hits: float,
    requests: int,
    source: int,
    importance: float = 0.0,
    reuse_p: float = 1.0,
    loop: Loop | None = None,
    orphan: bool = False,
) -> ScoreComponents:
    """All terms of the priority of one block (source is a code from `source_code`; reuse_p the learned
    reuse probability of its class, 1.0 = no penalty; `loop` when the block is ranked by its loop; `orphan`
    when no lookup can reach it)."""
    name = SOURCES[source]
    terms = [
        w.reuse * math.log2(reuse_p),
        w.hits * math.log2(1 + chain_hits),
        w.requests * math.log2(max(requests, 1)),
        w.source.get(name, 0.0),
        w.importance * importance,
        w.protect_bonus if name in w.protected_sources else 0.0,
    ]
    off = ORPHAN if orphan else 0.0
    if loop is None:
        total = tick + horizon * math.fsum([*terms, off])
        return ScoreComponents(tick, horizon, *terms, 0.0, off, total=total)
    gap = GAP_VALUES[loop.bucket]
    term = (loop.now_tick - tick) / horizon - w.loop * (loop.due - loop.vt) / gap
    key = loop_key(w, horizon, loop.due, gap, math.fsum(terms[1:]))
    total = loop_priority(w, horizon, loop.now_tick, loop.vt, gap, key, reuse_p) + horizon * off
    return ScoreComponents(tick, horizon, *terms, term, off, total=total, gap=gap, due_in=loop.due - loop.vt)


def priority(
    w: ScoreWeights,
    tick: float,
    horizon: float,
    chain_hits: float,
    requests: int,
    source: int,
    importance: float = 0.0,
    reuse_p: float = 1.0,
) -> float:
    """The priority of one block ranked by recency (`components(...).total`, computed faster; the same
    operations, in the same order, as `priority_array`)."""
    return (
        tick
        + horizon * value_of(w, chain_hits, requests, source, importance)
        + horizon * (w.reuse * math.log2(reuse_p))
    )


def value_of(w: ScoreWeights, chain_hits: float, requests: int, source: int, importance: float) -> float:
    """The value without the reuse term: hits + requests + source (with protection) + importance."""
    return (
        w.hits * math.log2(1 + chain_hits)
        + w.requests * math.log2(max(requests, 1))
        + w.source_value(source)
        + w.importance * importance
    )


def loop_key(w: ScoreWeights, horizon: float, due, gap, value):
    """The part of a loop block's priority fixed at its last use: horizon·value − w_loop·horizon·due/gap
    (scalars or numpy arrays; the replay keys its loop heaps by it)."""
    return horizon * value - (w.loop * horizon) * due / gap


def loop_shift(w: ScoreWeights, horizon: float, now_tick, vt, gap):
    """The part of a loop block's priority that moves with the clocks: now_tick + w_loop·horizon·vt/gap."""
    return now_tick + (w.loop * horizon) * vt / gap


def loop_priority(w: ScoreWeights, horizon: float, now_tick, vt, gap, key, reuse_p):
    """A loop block's priority from its `loop_key`: (loop_shift + key) + horizon·w_reuse·log2(reuse_p),
    reuse_p being its loop's learned on-time return probability (scalars; `loop_priority_array` is the
    same operations on arrays)."""
    return (loop_shift(w, horizon, now_tick, vt, gap) + key) + horizon * (w.reuse * math.log2(reuse_p))


def priority_array(
    w: ScoreWeights,
    tick: np.ndarray,
    horizon: float,
    chain_hits: np.ndarray,
    requests: np.ndarray,
    source: np.ndarray,
    importance: np.ndarray,
    reuse_p: np.ndarray,
) -> np.ndarray:
    """float64 [N]: the priorities of N blocks ranked by recency (arrays [N]; source as int codes). The
    reuse term is added last, so blocks of one class keep their order whatever their class's reuse_p (the
    replay relies on it)."""
    value = value_array(w, chain_hits, requests, source, importance)
    return tick + horizon * value + horizon * reuse_terms(w, reuse_p)


def value_array(w: ScoreWeights, chain_hits, requests, source, importance) -> np.ndarray:
    """float64 [N]: `value_of` for N blocks (the same operations)."""
    value = w.hits * np.log2(1.0 + np.asarray(chain_hits, dtype=np.float64))  # float64 from here on
    value += w.requests * np.log2(np.maximum(requests, 1).astype(np.float64))
    value += w.source_table()[source]
    value += w.importance * importance
    return value


def loop_priority_array(
    w: ScoreWeights, horizon: float, now_tick: float, vt: float, bucket, last_vt, value, reuse_p
) -> np.ndarray:
    """float64 [N]: `loop_priority` of N blocks ranked by their loop (arrays [N]: gap bucket, last use,
    `value_array`, their loop's return probability), with the operations of the scalar path."""
    gap = GAPS[bucket]
    key = loop_key(w, horizon, last_vt + gap, gap, value)
    return (loop_shift(w, horizon, now_tick, vt, gap) + key) + horizon * reuse_terms(w, reuse_p)


def reuse_terms(w: ScoreWeights, reuse_p: np.ndarray) -> np.ndarray:
    """float64 [N]: w_reuse·log2(reuse_p), the reuse term of the value, for an array of probabilities."""
    return w.reuse * np.log2(reuse_p)
