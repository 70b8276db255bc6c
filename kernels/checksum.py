"""Public launcher: checksums of stored blocks, a pure function of their bytes (issue 26: corrupted blocks).

Provides:
    block_checksums(sections, blocks=None) -> [n, 2] int64
        sections: [L, NB, …] tensors of NB blocks; blocks: [n] int, which of them (None: all, in order) —
        the checksums of a pool's slots read in place
    MAX_WORDS                                       the largest block the guarantee below holds for

Definition. A block's bytes are its sections in the order given, each section layer by layer: piece (s, l)
is sections[s][l, b] (its bytes in memory order, zero-padded to a multiple of 4). Read as a sequence of
little-endian unsigned 32-bit words w_0 … w_{N−1}, the block's checksum is the pair
    S1 = Σ w_i  mod 2^64,        S2 = Σ (i + 1) · w_i  mod 2^64      (stored as int64, two's complement).
Guarantee, for blocks of N < 2^32 words (16 GiB): any change confined to at most two words is detected —
every flipped bit, any one or two changed bytes, any changed word, and two different words swapped (in a
piece, across pieces, across layers or sections). Proof: a change of d_i at word i (0 < |d_i| < 2^32)
changes S1 by d_i ≠ 0; changes at i and j leave S1 equal only if d_j = −d_i, and then change S2 by
(i − j) · d_i, whose magnitude is below 2^64 and not 0. Larger corruptions go undetected only if both sums
happen to coincide (for random bytes, a 2^-64-scale event); the checksum is not a cryptographic MAC.
The sums are sums, so the device computes them in any order and gets the same bits as the reference.

Triton on CUDA (and under TRITON_INTERPRET=1); elsewhere block_checksums_host (checksum_host.py: the
reference's bits in two reductions). No host synchronisation.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._backend import HAVE_TRITON, next_pow2, use_triton
from .checksum_host import block_checksums_host
from .reference import piece_bytes

MAX_WORDS = 2**32 - 1
MAX_TILE = 1024  # words per program
MAX_GRID_Y = 65535

if HAVE_TRITON:
    from ._checksum_kernel import _block_checksum_kernel


def block_checksums(sections: Sequence[torch.Tensor], blocks: torch.Tensor | None = None) -> torch.Tensor:
    """[n, 2] int64 (S1, S2) per block of the [L, NB, …] sections (any dtypes), on their device: of every
    block in order, or of blocks[i] for each i."""
    if not sections:
        raise ValueError("block_checksums: no sections given")
    nb, device = sections[0].shape[1], sections[0].device
    for i, t in enumerate(sections):
        if t.ndim < 2 or t.shape[1] != nb or t.device != device:
            raise ValueError(
                f"block_checksums: section {i} must be [L, {nb}, …] on {device}, got {tuple(t.shape)} on "
                f"{t.device}"
            )
    if blocks is not None and (blocks.ndim != 1 or blocks.dtype not in (torch.int32, torch.int64)):
        raise ValueError(
            f"block_checksums: blocks must be a 1-D int tensor, got {blocks.dtype} {tuple(blocks.shape)}"
        )
    n = nb if blocks is None else blocks.shape[0]
    total = sum(t.shape[0] * -(-piece_bytes(t).shape[2] // 4) for t in sections)
    if total > MAX_WORDS:
        raise ValueError(f"block_checksums: a block of {total} words exceeds the {MAX_WORDS}-word bound")
    if n == 0 or not use_triton(*sections):
        return block_checksums_host(sections, blocks)
    ids = sections[0] if blocks is None else blocks.to(device)  # any tensor when unused
    plans = []
    cols = 0
    base = 0
    for t in sections:
        src, words, piece, is_words = _as_words(piece_bytes(t))
        layers = src.shape[0]
        tile = max(16, min(MAX_TILE, next_pow2(words)))
        while layers * -(-words // tile) > MAX_GRID_Y:
            tile *= 2
        tiles = -(-words // tile)
        plans.append((src, words, piece, is_words, base, tiles, tile, cols))
        cols += layers * tiles
        base += layers * words
    partial = torch.empty(n, cols, 2, dtype=torch.int64, device=device)
    for src, words, piece, is_words, base, tiles, tile, col0 in plans:
        grid = (n, src.shape[0] * tiles)
        _block_checksum_kernel[grid](
            src, src.stride(0), src.stride(1), ids, piece, words, base, tiles,
            partial, partial.stride(0), col0,
            TILE=tile, WORDS=is_words, IDS=blocks is not None, num_warps=4,
        )  # fmt: skip
    return partial.sum(1)


def _as_words(raw: torch.Tensor) -> tuple[torch.Tensor, int, int, bool]:
    """raw [L, n, B] uint8 → (source, words per piece, elements per piece, whether source is int32 words):
    the int32 view when every piece starts and ends on a 4-byte boundary, else the bytes themselves."""
    nbytes = raw.shape[2]
    aligned = (
        nbytes % 4 == 0 and raw.stride(0) % 4 == 0 and raw.stride(1) % 4 == 0 and raw.data_ptr() % 4 == 0
    )
    if aligned:
        return raw.view(torch.int32), nbytes // 4, nbytes // 4, True
    return raw, -(-nbytes // 4), nbytes, False
