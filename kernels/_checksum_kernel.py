"""Triton kernel: partial piece checksums of one section of n blocks (see checksum.py for the definition).

Grid (n, L · tiles): program (b, l · tiles + t) reads tile t of block b's piece of layer l (block ids[b]
with IDS) — TILE words, the last tile masked — and writes its two partial sums, Σ w and Σ pos · w (int64,
wrapping; pos counts from 1 at the first word of the group's piece, so this section's words start at
base + 1), to partial[b, l, col0 + t]. The launcher adds the partials of a piece up; every sum wraps mod
2^64, so the order of the additions does not change the result.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _piece_checksum_kernel(
    src, s_l, s_n,  # [L, NB, piece]: int32 words (WORDS) or uint8 bytes; a piece is contiguous
    ids,  # IDS: [n] int, the blocks to sum (else blocks 0 … n − 1)
    piece,  # elements of one (layer, block) piece of this section
    words,  # 32-bit words of it: piece (WORDS) or ceil(piece / 4) (bytes, zero-padded)
    base,  # words of the group's earlier sections in one piece
    tiles,  # tiles per piece of this section
    partial, s_pn, s_pl, col0,  # partial [n, L, cols, 2] int64 (one group's)
    TILE: tl.constexpr, WORDS: tl.constexpr, IDS: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0).to(tl.int64)
    if IDS:  # noqa: SIM108 (constexpr branch)
        block = tl.load(ids + b).to(tl.int64)
    else:
        block = b
    lt = tl.program_id(1)
    layer = (lt // tiles).to(tl.int64)
    tile = lt % tiles
    w_idx = tile * TILE + tl.arange(0, TILE)
    start = src + layer * s_l + block * s_n
    if WORDS:
        w = tl.load(start + w_idx, mask=w_idx < words, other=0)
        w = w.to(tl.uint32, bitcast=True).to(tl.int64)  # zero-extended
    else:  # little-endian words of the piece's bytes, zero-padded at its end
        byte = w_idx[:, None] * 4 + tl.arange(0, 4)[None, :]
        x = tl.load(start + byte, mask=byte < piece, other=0).to(tl.int64)
        shift = (tl.arange(0, 4) * 8).to(tl.int64)[None, :]
        w = tl.sum(x << shift, axis=1)
    pos = base + w_idx.to(tl.int64) + 1
    out = partial + b * s_pn + layer * s_pl + (col0 + tile) * 2
    tl.store(out, tl.sum(w, axis=0))
    tl.store(out + 1, tl.sum(w * pos, axis=0))
