"""Scalar codebooks (Lloyd-Max and uniform) for the coordinates of a rotated unit vector.

Provides:
    coordinate_pdf(t, head_dim)      density of one coordinate of a uniform unit vector in R^head_dim
    lloyd_max_codebook(head_dim, bits) -> (centroids, boundaries, mse_per_coordinate), numpy float64, cached
    uniform_codebook(head_dim, bits)   -> the same triple for the best affine codebook, cached
    CODEBOOKS                        name → one of the two functions ("lloyd", "uniform")

After a Haar rotation each coordinate of a unit vector in R^d follows the marginal of a uniform point on
S^{d-1}: density ∝ (1 − t²)^((d−3)/2) on [−1, 1]. The MSE-optimal scalar quantizer for that density is the
Lloyd-Max fixed point: boundaries are midpoints of neighbouring centroids, each centroid is the conditional
mean of its cell. We solve it on a dense grid with cumulative moments, so every iteration is a handful of
interpolations over 2^bits cells.

The uniform codebook is affine, c_k = step·(k − (n − 1)/2) for k = 0..n−1 (n = 2^bits), boundaries at the
midpoints, so a kernel can compute a centroid from its index instead of reading a table. Only `step` is
free; it minimises the MSE for the same density, computed with the same cumulative moments as Lloyd-Max
(so the two MSEs are comparable). The search is a log-spaced scan over step·n·√d ∈ [0.5, 64] followed by
a golden-section refinement around the best scan point. The found step is then rounded to 16 significant
bits: every centroid step·(k − (n−1)/2) is then exact in float32 (a half-integer below 2^8 has ≤ 8
significant bits), so float32 arithmetic in a kernel reproduces the float32 table bit for bit; the rounding
changes the MSE by a relative ~1e-10.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np

_GRID_POINTS = (1 << 20) + 1
_MAX_ITERS = 20_000
_TOL = 1e-12
_OVER_RELAXATION = 1.8  # c ← c + ω·(lloyd(c) − c); ω = 1.8 cuts the iterations 2–4× at every width tested
_SOLVER_VERSION = 1  # bump when the solver changes, so cached codebooks are recomputed
_UNIFORM_VERSION = 1  # the same for uniform_codebook's step search
_STEP_SCAN = 400  # log-spaced scan points before the golden-section refinement
_STEP_RANGE = (0.5, 64.0)  # scanned range of step · levels · √head_dim (optima: ≈ 3.2 at 1 bit, ≈ 8 at 8)
_STEP_SIGNIFICANT_BITS = 16  # step · (k − (n−1)/2) stays exact in float32 (24-bit significand)


def coordinate_pdf(t: np.ndarray, head_dim: int) -> np.ndarray:
    """Unnormalised density (1 − t²)^((d−3)/2) of one coordinate, evaluated in log space for stability."""
    t = np.asarray(t, dtype=np.float64)
    inside = np.abs(t) < 1.0
    out = np.zeros_like(t)
    out[inside] = np.exp(0.5 * (head_dim - 3) * np.log1p(-(t[inside] ** 2)))
    return out


@functools.cache
def _moment_tables(head_dim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Grid t, and cumulative integrals of f, t·f and t²·f (trapezoid rule), f normalised to mass 1.

    The grid spans ±12 standard deviations (σ ≈ 1/√d); the mass outside is below 1e-30.
    """
    half_width = min(1.0, 12.0 / np.sqrt(head_dim))
    t = np.linspace(-half_width, half_width, _GRID_POINTS)
    f = coordinate_pdf(t, head_dim)
    dt = t[1] - t[0]

    def cumulative(g: np.ndarray) -> np.ndarray:
        return np.concatenate(([0.0], np.cumsum(0.5 * (g[1:] + g[:-1]) * dt)))

    m0 = cumulative(f)
    f = f / m0[-1]
    return t, cumulative(f), cumulative(t * f), cumulative(t * t * f)


def _cell_moments(
    edges: np.ndarray, tables: tuple[np.ndarray, ...]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    t, m0, m1, m2 = tables
    edges = np.clip(edges, t[0], t[-1])
    return tuple(np.diff(np.interp(edges, t, m)) for m in (m0, m1, m2))


def _compander_start(head_dim: int, levels: int) -> np.ndarray:
    """Initial centroids at the quantiles of f^(1/3) (Panter-Dite): near-optimal at high rates, so Lloyd
    iterations converge in far fewer steps than from equal-mass quantiles."""
    t = _moment_tables(head_dim)[0]
    g = coordinate_pdf(t, head_dim) ** (1.0 / 3.0)
    cdf = np.concatenate(([0.0], np.cumsum(0.5 * (g[1:] + g[:-1]))))
    cdf /= cdf[-1]
    return np.interp((np.arange(levels) + 0.5) / levels, cdf, t)


def _cache_path(head_dim: int, bits: int, kind: str = "lloyd_max", version: int = _SOLVER_VERSION) -> Path:
    root = os.environ.get("TIERCACHE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tiercache"
    )
    return Path(root) / "codebooks" / f"{kind}_v{version}_d{head_dim}_b{bits}.npy"


def _check_arguments(head_dim: int, bits: int) -> None:
    if head_dim < 4:
        raise ValueError(f"head_dim must be at least 4 for the sphere-marginal density, got {head_dim}")
    if not 1 <= bits <= 8:
        raise ValueError(f"bits must be an integer in 1..8, got {bits}")


def _quantizer_mse(centroids: np.ndarray, boundaries: np.ndarray, tables: tuple[np.ndarray, ...]) -> float:
    """Σ over cells of ∫ (t − c)² f = m2 − 2 c m1 + c² m0, the outer cells reaching ±1."""
    edges = np.concatenate(([-1.0], boundaries, [1.0]))
    mass, first, second = _cell_moments(edges, tables)
    return float(np.sum(second - 2.0 * centroids * first + centroids**2 * mass))


def _frozen(centroids: np.ndarray, mse: float) -> tuple[np.ndarray, np.ndarray, float]:
    centroids = centroids.copy()
    boundaries = 0.5 * (centroids[1:] + centroids[:-1])
    centroids.setflags(write=False)
    boundaries.setflags(write=False)
    return centroids, boundaries, mse


@functools.cache
def lloyd_max_codebook(head_dim: int, bits: int) -> tuple[np.ndarray, np.ndarray, float]:
    """Solve the Lloyd-Max quantizer for one coordinate of a rotated unit vector in R^head_dim.

    Returns (centroids [2**bits], boundaries [2**bits − 1], mse_per_coordinate), all float64, centroids
    sorted ascending and symmetric about 0. The expected squared error of a unit vector is
    head_dim · mse_per_coordinate.
    """
    _check_arguments(head_dim, bits)
    path = _cache_path(head_dim, bits)
    centroids = _try_load(path, 1 << bits)
    if centroids is None:
        centroids = _solve(head_dim, bits)
        _try_save(path, centroids)
    boundaries = 0.5 * (centroids[1:] + centroids[:-1])
    return _frozen(centroids, _quantizer_mse(centroids, boundaries, _moment_tables(head_dim)))


@functools.cache
def uniform_codebook(head_dim: int, bits: int) -> tuple[np.ndarray, np.ndarray, float]:
    """The MSE-optimal affine codebook c_k = step·(k − (2**bits − 1)/2) for the same density.

    Returns (centroids [2**bits], boundaries [2**bits − 1] (midpoints), mse_per_coordinate), float64, like
    lloyd_max_codebook, whose MSE it never beats. `step` (= centroids[1] − centroids[0]) is found by a scan
    and golden-section search, then rounded to 16 significant bits (see the module docstring).
    """
    _check_arguments(head_dim, bits)
    levels = 1 << bits
    path = _cache_path(head_dim, bits, "uniform", _UNIFORM_VERSION)
    cached = _try_load(path, levels)
    step = float(cached[1] - cached[0]) if cached is not None else None
    if step is None or not np.array_equal(cached, _affine(step, levels)):
        step = _round_significant(_best_step(head_dim, levels), _STEP_SIGNIFICANT_BITS)
        _try_save(path, _affine(step, levels))
    centroids = _affine(step, levels)
    boundaries = 0.5 * (centroids[1:] + centroids[:-1])
    return _frozen(centroids, _quantizer_mse(centroids, boundaries, _moment_tables(head_dim)))


def _affine(step: float, levels: int) -> np.ndarray:
    return step * (np.arange(levels, dtype=np.float64) - 0.5 * (levels - 1))


def _round_significant(x: float, significant_bits: int) -> float:
    mantissa, exponent = np.frexp(x)
    return float(np.ldexp(np.round(np.ldexp(mantissa, significant_bits)), exponent - significant_bits))


def _best_step(head_dim: int, levels: int) -> float:
    """Step minimising the uniform quantizer's MSE: log-spaced scan, then golden section on log(step)."""
    tables = _moment_tables(head_dim)

    def mse(log_step: float) -> float:
        centroids = _affine(float(np.exp(log_step)), levels)
        return _quantizer_mse(centroids, 0.5 * (centroids[1:] + centroids[:-1]), tables)

    scale = levels * np.sqrt(head_dim)
    grid = np.linspace(np.log(_STEP_RANGE[0] / scale), np.log(_STEP_RANGE[1] / scale), _STEP_SCAN)
    best = int(np.argmin([mse(g) for g in grid]))
    assert 0 < best < _STEP_SCAN - 1, f"uniform step search hit the edge of its range (levels {levels})"
    lo, hi = grid[best - 1], grid[best + 1]
    ratio = (np.sqrt(5.0) - 1.0) / 2.0
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = mse(a), mse(b)
    while hi - lo > 1e-12:
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - ratio * (hi - lo)
            fa = mse(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + ratio * (hi - lo)
            fb = mse(b)
    return float(np.exp(0.5 * (lo + hi)))


def _solve(head_dim: int, bits: int) -> np.ndarray:
    """Over-relaxed Lloyd iteration from a compander start; returns the centroids (float64, ascending)."""
    tables = _moment_tables(head_dim)
    centroids = _compander_start(head_dim, 1 << bits)
    for _ in range(_MAX_ITERS):
        boundaries = 0.5 * (centroids[1:] + centroids[:-1])
        edges = np.concatenate(([-1.0], boundaries, [1.0]))
        mass, first, _second = _cell_moments(edges, tables)
        conditional_means = first / np.maximum(mass, 1e-300)
        conditional_means = 0.5 * (conditional_means - conditional_means[::-1])  # the density is even
        step = conditional_means - centroids
        if np.max(np.abs(step)) < _TOL:
            return conditional_means
        centroids = centroids + _OVER_RELAXATION * step
    return centroids


def _try_load(path: Path, levels: int) -> np.ndarray | None:
    """A cached solution, or None when absent or not a valid codebook (then it is solved again)."""
    try:
        centroids = np.load(path)
    except (OSError, ValueError):
        return None
    valid = (
        centroids.shape == (levels,)
        and centroids.dtype == np.float64
        and np.all(np.isfinite(centroids))
        and np.all(np.diff(centroids) > 0)
    )
    return centroids if valid else None


def _try_save(path: Path, centroids: np.ndarray) -> None:
    """Best effort: a read-only or missing cache directory only costs a re-solve in the next process."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp.npy")
        np.save(tmp, centroids)
        os.replace(tmp, path)
    except OSError:
        pass


CODEBOOKS = {"lloyd": lloyd_max_codebook, "uniform": uniform_codebook}
