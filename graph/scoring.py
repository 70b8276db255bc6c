"""The eviction score: one documented formula, kept as components for explanation.

Provides:
- `SOURCES`: the source labels, in code order (`source_code(label)` maps a label to its code).
- `ScoreWeights`: the formula's weights and the protected sources (frozen; validated).
- `ScoreComponents`: the terms of one block's score (frozen), as `explain()` returns them.
- `components(...)` (one block), `priority(...)` (one block, fast) and `priority_array(...)` (numpy, all
  blocks at once). The three compute the same number; a test checks it.

The formula (lower priority = evicted first, among blocks that are leaves of the prefix tree)::

    value    = w_hits·log2(1 + chain_hits) + w_requests·log2(max(requests, 1))
               + w_source[source] + w_importance·importance + (protect_bonus if source is protected)
    priority = last_access_tick + horizon · value

- `last_access_tick`: the tier's store counter (blocks stored or moved into the tier so far) when the block
  was last stored or hit, so recency is measured in cache insertions, not seconds (deterministic,
  load-independent). Ties go to the earlier access (LRU).
- `horizon`: the tier's size in blocks. One unit of value buys a block the residence of one whole cache
  turnover (that many insertions), so the weights mean the same thing at every capacity; value = 0 is LRU.
- `chain_hits`: the block's hits (later requests that found it cached), or what it inherited if larger.
  From an unprotected parent with no other cached child (a linear chain) it inherits the parent's
  `chain_hits`: the tail a conversation just appended is worth what the conversation has proven. From a
  branching point or a protected parent (a shared system prompt, a document) it inherits the fraction of
  that parent's branches that were later hit: how often continuations off this prefix come back.
- `requests`: distinct requests that used the block (sharing across requests, the `prefix_share` signal).
- `source`: label weight (system prompts and retrieved documents are reused by design); protected sources
  add `protect_bonus` turnovers, so they leave only when nothing else can or after long disuse.
- `importance`: an optional external input (e.g. attention mass), 0 by default.

Leaves first is not part of the number: rankings only list blocks with no cached children in the tier or a
faster one, so a parent — needed by every hit on its descendants — always outlives them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

SOURCES: tuple[str, ...] = ("unknown", "system", "user", "assistant", "tool", "generation")
_SOURCE_CODE = {name: i for i, name in enumerate(SOURCES)}


def source_code(label: str | None) -> int:
    """Code of a source label (None → "unknown"); raises ValueError naming the valid labels."""
    if label is None:
        return 0
    try:
        return _SOURCE_CODE[label]
    except KeyError:
        raise ValueError(f"unknown source label {label!r}; valid: {', '.join(SOURCES)}") from None


def _default_source_weights() -> dict[str, float]:
    return {"system": 0.5, "tool": 1.0}


@dataclass(frozen=True)
class ScoreWeights:
    """Weights of the score formula (see the module docstring); values are in cache turnovers."""

    hits: float = 1.0
    requests: float = 0.5
    importance: float = 1.0
    source: dict[str, float] = field(default_factory=_default_source_weights)
    protected_sources: frozenset[str] = frozenset({"system"})
    protect_bonus: float = 4.0

    def __post_init__(self) -> None:
        for label in (*self.source, *self.protected_sources):
            source_code(label)
        if self.protect_bonus < 0:
            raise ValueError(f"protect_bonus must be >= 0, got {self.protect_bonus}")

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
    """The terms of one block's priority: total = tick + horizon·(hits + requests + source + importance +
    protection)."""

    tick: float
    horizon: float
    hits: float
    requests: float
    source: float
    importance: float
    protection: float
    total: float


def components(
    w: ScoreWeights,
    tick: float,
    horizon: float,
    chain_hits: float,
    requests: int,
    source: int,
    importance: float = 0.0,
) -> ScoreComponents:
    """All terms of the priority of one block (source is a code from `source_code`)."""
    name = SOURCES[source]
    terms = (
        w.hits * math.log2(1 + chain_hits),
        w.requests * math.log2(max(requests, 1)),
        w.source.get(name, 0.0),
        w.importance * importance,
        w.protect_bonus if name in w.protected_sources else 0.0,
    )
    return ScoreComponents(tick, horizon, *terms, total=tick + horizon * math.fsum(terms))


def priority(
    w: ScoreWeights,
    tick: float,
    horizon: float,
    chain_hits: float,
    requests: int,
    source: int,
    importance: float = 0.0,
) -> float:
    """The priority of one block (`components(...).total`, computed faster)."""
    value = (
        w.hits * math.log2(1 + chain_hits)
        + w.requests * math.log2(max(requests, 1))
        + w.source_value(source)
        + w.importance * importance
    )
    return tick + horizon * value


def priority_array(
    w: ScoreWeights,
    tick: np.ndarray,
    horizon: float,
    chain_hits: np.ndarray,
    requests: np.ndarray,
    source: np.ndarray,
    importance: np.ndarray,
) -> np.ndarray:
    """float64 [N]: the priorities of N blocks (arrays [N]; source as int codes)."""
    value = w.hits * np.log2(1.0 + chain_hits)
    value += w.requests * np.log2(np.maximum(requests, 1).astype(np.float64))
    value += w.source_table()[source]
    value += w.importance * importance
    return tick + horizon * value
