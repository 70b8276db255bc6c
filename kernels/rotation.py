"""Seeded random orthogonal rotations for TurboQuant.

Provides:
    haar_rotation(head_dim, seed)      -> float64 numpy [d, d], Haar-distributed orthogonal matrix
    hadamard_rotation(head_dim, seed)  -> float64 numpy [d, d], H·D₃·H·D₂·H·D₁ (normalised Walsh-Hadamard H,
                                          random ±1 diagonals Dᵢ); d must be a power of two
    ROTATIONS                          the valid rotation kinds

Both are built on the CPU in float64 from numpy's PCG64 generator, whose stream is fixed by the seed on
every platform, so the same seed gives the same matrix in every process and on every device.
"""

from __future__ import annotations

import numpy as np

ROTATIONS = ("haar", "hadamard")
# Separate streams for the two kinds, so changing the kind with the same seed never reuses the draw.
_STREAM_TAG = {"haar": 0x7E5C_0001, "hadamard": 0x7E5C_0002}


def haar_rotation(head_dim: int, seed: int) -> np.ndarray:
    """QR of a seeded Gaussian matrix, with the signs of diag(R) folded into Q (Haar measure on O(d))."""
    rng = np.random.default_rng([_STREAM_TAG["haar"], seed])
    gaussian = rng.standard_normal((head_dim, head_dim))
    q, r = np.linalg.qr(gaussian)
    signs = np.sign(np.diag(r))
    signs[signs == 0] = 1.0
    return q * signs[None, :]


def hadamard_rotation(head_dim: int, seed: int) -> np.ndarray:
    """Randomised Hadamard transform H·D₃·H·D₂·H·D₁ as a dense matrix (applied to column vectors)."""
    if head_dim < 1 or head_dim & (head_dim - 1):
        raise ValueError(f"the hadamard rotation needs head_dim a power of two, got {head_dim}; use 'haar'")
    rng = np.random.default_rng([_STREAM_TAG["hadamard"], seed])
    h = walsh_hadamard(head_dim)
    out = np.eye(head_dim)
    for _ in range(3):
        diag = rng.choice((-1.0, 1.0), size=head_dim)
        out = h @ (diag[:, None] * out)
    return out


def walsh_hadamard(n: int) -> np.ndarray:
    """Sylvester's Hadamard matrix of order n (a power of two), scaled by 1/√n so it is orthogonal."""
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)
