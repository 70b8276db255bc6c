"""Triton kernel: partial block checksums of one section of n blocks (see checksum.py for the definition).

Grid (n, L · tiles): program (b, l · tiles + t) reads tile t of block b's piece of layer l (block ids[b]
with IDS) — TILE words, the last tile masked — and writes its two partial sums, Σ w and Σ pos · w (int64,
wrapping), to partial[b, col0 + l · tiles + t]. The launcher adds the partials up; every sum wraps mod
2^64, so the order of the additions does not change the result.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _block_checksum_kernel(
    src, s_l, s_n,  # [L, NB, piece]: int32 words (WORDS) or uint8 bytes; a piece is contiguous
    ids,  # IDS: [n] int, the blocks to sum (else blocks 0 … n − 1)
    piece,  # elements of one (layer, block) piece
    words,  # 32-bit words of a piece: piece (WORDS) or ceil(piece / 4) (bytes, zero-padded)
    base,  # position of this section's first word in the block's word sequence
    tiles,  # tiles per piece
    partial, s_pn, col0,  # partial [n, cols, 2] int64
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
    pos = base + layer * words + w_idx.to(tl.int64) + 1
    out = partial + b * s_pn + (col0 + lt) * 2
    tl.store(out, tl.sum(w, axis=0))
    tl.store(out + 1, tl.sum(w * pos, axis=0))
