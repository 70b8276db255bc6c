"""Public launcher: checksums of the pieces of stored blocks, a pure function of their bytes (issue 26:
corrupted blocks).

Provides:
    piece_checksums(groups, blocks=None) -> [n, G, L, 2] int64
        groups: G sequences of [L, NB, …] tensors (any dtypes) of NB blocks; blocks: [n] int, which of them
        (None: all, in order) — the checksums of a pool's slots read in place
    piece_words(groups) -> list[int]                  32-bit words of one piece of each group
    fold_pieces(sums, words) -> [n, 2] int64 (CPU)    the checksum of a whole block from its pieces' sums
                                                      ([n, G, L, 2], any device; words: piece_words)
    MAX_WORDS                                         the largest piece the guarantee below holds for

Definition. Piece (g, l) of block b is the bytes of groups[g][0][l, b], groups[g][1][l, b], … in that order,
each in memory order and zero-padded to a multiple of 4 bytes. Read as little-endian unsigned 32-bit words
w_1 … w_W, its checksum is the pair
    S1 = Σ w_i  mod 2^64,        S2 = Σ i · w_i  mod 2^64      (stored as int64, two's complement).
The tiers' blocks have two groups, K = (k_packed, k_norms) and V = (v_packed, v_norms): one piece per layer
and side, exactly what one program of the load's decode reads before it writes (dequantize.py verifies each
piece there, so a load needs no separate pass over its bytes and no byte of a changed piece reaches vLLM's
cache). A block checksum would only be known once every piece was read, after the writes.
Guarantee, for pieces of W < 2^32 words: any change confined to at most two words of a piece is detected —
every flipped bit, any one or two changed bytes, any changed word, two different words swapped — and so is
any change that leaves no piece with more than two changed words. Proof: a change of d_i at word i
(0 < |d_i| < 2^32) changes S1 by d_i ≠ 0; changes at i and j leave S1 equal only if d_j = −d_i, and then
change S2 by (i − j) · d_i, whose magnitude is below 2^64 and not 0. Larger corruptions go undetected only
if both sums of every changed piece happen to coincide (for random bytes, a 2^-64-scale event per piece); the
checksum is not a cryptographic MAC. The sums are sums, so the device computes them in any order and gets
the same bits as the reference (reference.py) and the host (checksum_host.py).

A whole block's checksum (the remote tier's header carries one) is the same pair over the block's words taken
as its pieces in order — group 0's layers 0 … L−1, then group 1's, … — so it has the same guarantee for the
whole block, and fold_pieces computes it from the pieces' sums: S1 = Σ_p S1_p, S2 = Σ_p (S2_p + o_p · S1_p),
o_p the words of the pieces before p.

Triton on CUDA (and under TRITON_INTERPRET=1); elsewhere piece_checksums_host. No host synchronisation
(except fold_pieces, which reads its sums on the host).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ._backend import HAVE_TRITON, next_pow2, use_triton
from .checksum_host import piece_checksums_host
from .reference import piece_bytes

MAX_WORDS = 2**32 - 1
MAX_TILE = 1024  # words per program
MAX_GRID_Y = 65535

if HAVE_TRITON:
    from ._checksum_kernel import _piece_checksum_kernel


def piece_checksums(
    groups: Sequence[Sequence[torch.Tensor]], blocks: torch.Tensor | None = None
) -> torch.Tensor:
    """[n, G, L, 2] int64 (S1, S2) per piece, on the sections' device: of every block in order, or of
    blocks[i] for each i."""
    check_groups(groups, blocks)
    sections = [t for group in groups for t in group]
    nb, device = sections[0].shape[1], sections[0].device
    n = nb if blocks is None else blocks.shape[0]
    if n == 0 or not use_triton(*sections):
        return piece_checksums_host(groups, blocks)
    ids = sections[0] if blocks is None else blocks.to(device)  # any tensor when unused
    layers = sections[0].shape[0]
    plans = []  # (group, source, words, elements, is_words, base, tiles, tile, col0)
    width = 0
    for g, group in enumerate(groups):
        base = col = 0
        for t in group:
            src, words, piece, is_words = _as_words(piece_bytes(t))
            tile = max(16, min(MAX_TILE, next_pow2(words)))
            while layers * -(-words // tile) > MAX_GRID_Y:
                tile *= 2
            tiles = -(-words // tile)
            plans.append((g, src, words, piece, is_words, base, tiles, tile, col))
            base += words
            col += tiles
        width = max(width, col)
    partial = torch.zeros(n, len(groups), layers, width, 2, dtype=torch.int64, device=device)
    for g, src, words, piece, is_words, base, tiles, tile, col0 in plans:
        out = partial[:, g]
        _piece_checksum_kernel[(n, layers * tiles)](
            src, src.stride(0), src.stride(1), ids, piece, words, base, tiles,
            out, out.stride(0), out.stride(1), col0,
            TILE=tile, WORDS=is_words, IDS=blocks is not None, num_warps=4,
        )  # fmt: skip
    return partial.sum(3)


def piece_words(groups: Sequence[Sequence[torch.Tensor]]) -> list[int]:
    """Words of one piece of each group: Σ over its sections of ceil(bytes of one (layer, block) / 4)."""
    return [sum(-(-t[:1, :1].numel() * t.element_size() // 4) for t in group) for group in groups]


def fold_pieces(sums: torch.Tensor, words: Sequence[int]) -> torch.Tensor:
    """[n, G, L, 2] piece sums (int64, any device) and the words of one piece of each group → [n, 2] int64 on
    the host: each block's checksum with its pieces' words in order (g, l)."""
    n, groups, layers, _ = sums.shape
    if len(words) != groups:
        raise ValueError(f"fold_pieces: {len(words)} piece sizes for {groups} groups")
    s = sums.cpu().numpy().view(np.uint64).reshape(n, groups * layers, 2)
    offsets = np.concatenate([[0], np.cumsum(np.repeat(np.asarray(words, dtype=np.uint64), layers))[:-1]])
    s1 = s[:, :, 0].sum(axis=1, dtype=np.uint64)
    s2 = (s[:, :, 1] + offsets.astype(np.uint64) * s[:, :, 0]).sum(axis=1, dtype=np.uint64)
    return torch.from_numpy(np.stack([s1, s2], axis=1).view(np.int64))


def check_groups(groups: Sequence[Sequence[torch.Tensor]], blocks: torch.Tensor | None) -> None:
    """ValueError unless every section is [L, NB, …] with the same L and NB on one device, and blocks (when
    given) is a 1-D int tensor."""
    if not groups or not all(groups):
        raise ValueError("piece_checksums: give at least one group, each of at least one section")
    first = groups[0][0]
    layers, nb = (*first.shape[:2], 0, 0)[:2]
    device = first.device
    for g, group in enumerate(groups):
        for i, t in enumerate(group):
            if t.ndim < 2 or tuple(t.shape[:2]) != (layers, nb) or t.device != device:
                raise ValueError(
                    f"piece_checksums: section {i} of group {g} must be [{layers}, {nb}, …] on {device} (as "
                    f"the first), got {tuple(t.shape)} on {t.device}"
                )
    if blocks is not None and (blocks.ndim != 1 or blocks.dtype not in (torch.int32, torch.int64)):
        raise ValueError(
            f"piece_checksums: blocks must be a 1-D int tensor, got {blocks.dtype} {tuple(blocks.shape)}"
        )
    for words in piece_words(groups):
        if words > MAX_WORDS:
            raise ValueError(f"piece_checksums: a piece of {words} words exceeds the {MAX_WORDS}-word bound")


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
