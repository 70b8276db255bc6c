"""Issue test 3 as a slow test (~15 min on 2 loaded cores): SmolLM2-135M second chat turns from the tiers.
Run with `pytest -m slow tests/connector/test_quality_slow.py`; numbers are in benchmarks/RESULTS.md."""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_second_turn_from_the_tiers_smollm2():
    from tiercache.cli.models import ModelUnavailableError, smollm2_path

    try:
        smollm2_path()
    except ModelUnavailableError as exc:
        pytest.skip(str(exc))
    import quality_smollm2

    results = quality_smollm2.measure(["none", "tq4", "k8v4"])
    assert results["none"]["agreement"] == 1.0  # lossless tiers: identical greedy tokens
    for codec in ("none", "tq4", "k8v4"):
        assert results[codec]["from_tiers"] > 0.5  # most of turn 2 was served from the tiers
    assert results["k8v4"]["mean_abs_dlogprob"] <= results["tq4"]["mean_abs_dlogprob"] + 0.05
