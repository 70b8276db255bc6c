"""Codebooks for the sphere-coordinate density: Lloyd-Max (shape, symmetry, fixed point, expected MSE) and
uniform (affine, exact in float32, optimal step, MSE between Lloyd-Max's and a stated bound)."""

import numpy as np
import pytest

from tiercache.kernels.codebook import (
    _cell_moments,
    _moment_tables,
    _quantizer_mse,
    coordinate_pdf,
    lloyd_max_codebook,
    uniform_codebook,
)

BITS = list(range(1, 9))
HEAD_DIMS = [64, 128, 256]


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_sorted_symmetric_and_a_fixed_point(head_dim, bits):
    centroids, boundaries, mse = lloyd_max_codebook(head_dim, bits)
    assert centroids.shape == (2**bits,) and boundaries.shape == (2**bits - 1,)
    assert np.all(np.diff(centroids) > 0)
    np.testing.assert_allclose(centroids, -centroids[::-1], atol=1e-15)
    np.testing.assert_allclose(boundaries, 0.5 * (centroids[1:] + centroids[:-1]))
    # Lloyd-Max fixed point: each centroid is the conditional mean of its cell.
    edges = np.concatenate(([-1.0], boundaries, [1.0]))
    mass, first, _ = _cell_moments(edges, _moment_tables(head_dim))
    spacing = np.min(np.diff(centroids))
    np.testing.assert_allclose(first / mass, centroids, rtol=0, atol=1e-4 * spacing)
    assert 0 < mse * head_dim < 1.0


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_density_is_normalised_and_has_variance_one_over_d(head_dim):
    _, m0, _, m2 = _moment_tables(head_dim)
    assert m0[-1] == pytest.approx(1.0, abs=1e-9)
    # E[t²] = 1/d for a coordinate of a uniform unit vector in R^d.
    assert m2[-1] == pytest.approx(1.0 / head_dim, rel=1e-6)
    assert coordinate_pdf(np.array([1.0, -1.0, 1.5]), head_dim).tolist() == [0.0, 0.0, 0.0]


def test_mse_between_paper_bounds():
    for bits in BITS[1:]:
        mse = lloyd_max_codebook(128, bits)[2] * 128
        assert 1 / 4**bits < mse < (3**0.5 * np.pi / 2) / 4**bits


def test_known_values_at_d128():
    # Paper / design brief: ≈ 0.116 (2-bit), 0.034 (3-bit), 0.0093 (4-bit) on unit vectors at d = 128.
    expected = {2: 0.116, 3: 0.034, 4: 0.0093}
    for bits, value in expected.items():
        assert lloyd_max_codebook(128, bits)[2] * 128 == pytest.approx(value, rel=0.01)


def test_bad_arguments():
    with pytest.raises(ValueError, match="bits must be an integer in 1..8"):
        lloyd_max_codebook(128, 9)
    with pytest.raises(ValueError, match="head_dim must be at least 4"):
        lloyd_max_codebook(3, 4)


# MSE(uniform) / MSE(Lloyd-Max) upper bounds per width. Measured at every supported head_dim (64–256):
# 1.000, 1.011, 1.082, 1.210, 1.385, 1.596, 1.833, 2.087 (the largest, at d = 256); bounds leave ~8 % room.
UNIFORM_OVER_LLOYD_BOUND = {1: 1.0 + 1e-9, 2: 1.02, 3: 1.1, 4: 1.25, 5: 1.45, 6: 1.7, 7: 2.0, 8: 2.25}


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_uniform_is_affine_symmetric_and_exact_in_float32(head_dim, bits):
    centroids, boundaries, _ = uniform_codebook(head_dim, bits)
    n = 2**bits
    step = centroids[1] - centroids[0]
    assert centroids.shape == (n,) and boundaries.shape == (n - 1,) and step > 0
    assert np.array_equal(centroids, step * (np.arange(n) - (n - 1) / 2))
    assert np.array_equal(centroids, -centroids[::-1])
    np.testing.assert_array_equal(boundaries, 0.5 * (centroids[1:] + centroids[:-1]))
    # step has ≤ 16 significant bits, so every centroid is a float32 and float32 arithmetic reproduces it.
    assert np.array_equal(centroids.astype(np.float32).astype(np.float64), centroids)
    k = np.arange(n, dtype=np.float32)
    assert np.array_equal(np.float32(step) * (k - np.float32((n - 1) / 2)), centroids.astype(np.float32))


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_uniform_mse_between_lloyd_and_the_bound(head_dim, bits):
    uniform, lloyd = uniform_codebook(head_dim, bits)[2], lloyd_max_codebook(head_dim, bits)[2]
    assert lloyd * (1 - 1e-9) <= uniform <= UNIFORM_OVER_LLOYD_BOUND[bits] * lloyd


@pytest.mark.parametrize("bits", BITS)
def test_uniform_step_is_the_best_step(bits):
    centroids, boundaries, mse = uniform_codebook(128, bits)
    tables = _moment_tables(128)
    np.testing.assert_allclose(_quantizer_mse(centroids, boundaries, tables), mse, rtol=1e-15)
    for factor in (0.99, 1.01, 0.9, 1.1):
        c = centroids * factor
        assert _quantizer_mse(c, 0.5 * (c[1:] + c[:-1]), tables) > mse


def test_uniform_known_value_at_d128():
    # 8-bit keys: the uniform codebook costs ~2x Lloyd-Max's 4.02e-5 per unit vector.
    assert uniform_codebook(128, 8)[2] * 128 == pytest.approx(8.23e-5, rel=0.01)
    assert lloyd_max_codebook(128, 8)[2] * 128 == pytest.approx(4.02e-5, rel=0.01)


def test_uniform_disk_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TIERCACHE_CACHE_DIR", str(tmp_path))
    solve = uniform_codebook.__wrapped__  # bypass the in-process cache
    expected = solve(64, 3)
    (path,) = tmp_path.glob("codebooks/uniform_v*_d64_b3.npy")
    np.testing.assert_array_equal(np.load(path), expected[0])
    np.save(path, expected[0] * 1.5)  # a different (valid) affine codebook is read back as is
    assert np.array_equal(solve(64, 3)[0], expected[0] * 1.5)
    np.save(path, lloyd_max_codebook(64, 3)[0])  # not affine: solved again and rewritten
    assert np.array_equal(solve(64, 3)[0], expected[0])
    np.testing.assert_array_equal(np.load(path), expected[0])


def test_uniform_bad_arguments():
    with pytest.raises(ValueError, match="bits must be an integer in 1..8"):
        uniform_codebook(128, 0)
    with pytest.raises(ValueError, match="head_dim must be at least 4"):
        uniform_codebook(2, 4)
