"""The three ways to compute a priority agree; weights are validated."""

import itertools

import numpy as np
import pytest

from tiercache.graph import SOURCES, ScoreWeights, scoring

WEIGHTS = [ScoreWeights(), ScoreWeights(hits=3.0, requests=0.0, protect_bonus=0.0, source={"user": 1.0})]
GRID = list(
    itertools.product([0.0, 17.0], [1.0, 1000.0], [0, 1, 7], [0, 1, 5], range(len(SOURCES)), [0.0, 0.5])
)


@pytest.mark.parametrize("w", WEIGHTS)
def test_scalar_vector_and_components_agree(w):
    cols = [np.array(c) for c in zip(*GRID, strict=True)]
    tick, horizon, chain, req, src, imp = cols
    for h in (1.0, 1000.0):
        sel = horizon == h
        vec = scoring.priority_array(w, tick[sel], h, chain[sel], req[sel], src[sel].astype(int), imp[sel])
        for v, args in zip(vec, [g for g in GRID if g[1] == h], strict=True):
            comp = scoring.components(w, *args)
            assert comp.total == pytest.approx(v) and scoring.priority(w, *args) == pytest.approx(v)


def test_formula_terms():
    w = ScoreWeights()
    c = scoring.components(w, 10.0, 100.0, chain_hits=3, requests=4, source=scoring.source_code("system"))
    assert (c.hits, c.requests, c.source, c.protection) == (2.0, 1.0, 0.5, 4.0)
    assert c.total == 10.0 + 100.0 * 7.5
    assert scoring.components(w, 0.0, 1.0, 0, 1, 0).total == 0.0  # value 0: pure recency (LRU)


def test_weights_validated():
    with pytest.raises(ValueError, match="valid: unknown, system"):
        ScoreWeights(protected_sources=frozenset({"admin"}))
    with pytest.raises(ValueError, match="protect_bonus"):
        ScoreWeights(protect_bonus=-1)
