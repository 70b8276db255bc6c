"""The three ways to compute a priority agree; weights are validated."""

import itertools

import numpy as np
import pytest

from tiercache.graph import SOURCES, ScoreWeights, scoring

WEIGHTS = [
    ScoreWeights(),
    ScoreWeights(reuse=0.5, hits=3.0, requests=0.0, protect_bonus=0.0, source={"user": 1.0}),
]
GRID = list(
    itertools.product(
        [0.0, 17.0], [1.0, 1000.0], [0, 0.5, 1, 7], [0, 1, 5], range(len(SOURCES)), [0.0, 0.5], [1.0, 0.3]
    )
)


@pytest.mark.parametrize("w", WEIGHTS)
def test_scalar_vector_and_components_agree(w):
    cols = [np.array(c) for c in zip(*GRID, strict=True)]
    tick, horizon, chain, req, src, imp, reuse_p = cols
    for h in (1.0, 1000.0):
        sel = horizon == h
        chain32 = chain[sel].astype(np.float32)  # as the graph stores it
        vec = scoring.priority_array(
            w, tick[sel], h, chain32, req[sel], src[sel].astype(int), imp[sel], reuse_p[sel]
        )
        for v, args in zip(vec, [g for g in GRID if g[1] == h], strict=True):
            comp = scoring.components(w, *args)
            assert comp.total == pytest.approx(v, rel=1e-12) and scoring.priority(w, *args) == v


def test_formula_terms():
    w = ScoreWeights(hits=1.0, source={"system": 0.5})
    system = scoring.source_code("system")
    c = scoring.components(w, 10.0, 100.0, chain_hits=3, requests=4, source=system, reuse_p=0.25)
    assert (c.reuse, c.hits, c.requests, c.source, c.protection) == (-2.0, 2.0, 1.0, 0.5, 4.0)
    assert c.total == 10.0 + 100.0 * 5.5
    assert scoring.components(ScoreWeights(), 0.0, 1.0, 0, 1, 0).total == 0.0  # value 0: pure recency (LRU)


def test_default_value_is_learned_reuse_plus_sharing():
    # Defaults: one turnover per halving of the class's reuse probability, half a turnover per doubling of
    # the requests sharing the block, 4 turnovers for a protected source; chain_hits only through the class.
    c = scoring.components(ScoreWeights(), 0.0, 10.0, chain_hits=7, requests=8, source=0, reuse_p=0.125)
    assert (c.reuse, c.hits, c.requests, c.source, c.protection) == (-3.0, 0.0, 1.5, 0.0, 0.0)
    assert c.total == 10.0 * -1.5


def test_reuse_term_keeps_the_order_within_a_class():
    # The replay compares class heads only: within a class the order must not depend on reuse_p.
    w = ScoreWeights()
    tick = np.array([5, 6, 6, 9])
    req = np.array([3, 1, 2, 1])
    args = (tick, 40.0, np.zeros(4), req, np.zeros(4, dtype=int), np.zeros(4))
    orders = {
        tuple(np.argsort(scoring.priority_array(w, *args, np.full(4, p)), kind="stable")) for p in (1, 0.01)
    }
    assert len(orders) == 1


def test_weights_validated():
    with pytest.raises(ValueError, match="valid: unknown, system"):
        ScoreWeights(protected_sources=frozenset({"admin"}))
    with pytest.raises(ValueError, match="protect_bonus"):
        ScoreWeights(protect_bonus=-1)
    with pytest.raises(ValueError, match="reuse must be >= 0"):
        ScoreWeights(reuse=-1)
    with pytest.raises(ValueError, match="reuse_window"):
        ScoreWeights(reuse_window=1)
