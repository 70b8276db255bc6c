"""Lloyd-Max codebooks for the sphere-coordinate density: shape, symmetry, fixed point, expected MSE."""

import numpy as np
import pytest

from tiercache.kernels.codebook import _cell_moments, _moment_tables, coordinate_pdf, lloyd_max_codebook

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
