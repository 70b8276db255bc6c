"""Gluon kernel: the decode split kernel on mma.sync with centroid lookups in shared memory (head_dim D = 64
or 128, a constexpr).

_decode_lut_kernel, grid (programs,), W warps each: a persistent loop over work items (sequence, kv head,
split); inside an item the warps walk tiles of W·T tokens, warp w taking tokens Tw … Tw+T−1 of each tile,
each with its own online softmax, and no warp waits for another. At the item's end each warp writes its
partial (P ≥ S·W partials per query head), or (COMBINE) the warps' partials are combined through shared
memory (combine_warps in _decode_lut_reduce.py) into the item's one (P ≥ S).

Per T-token tile (T = 16, 32 or 64) and warp, in the transposed form (tokens and head dims are the M side of
the MMAs, the G ≤ 8 query heads of the kv head the N side):
    Sᵀ [T, 8]  = K̂ [T, D] · Q̂ᵀ [D, 8]        K̂ straight from registers (dot operand A; D/16 k-steps)
    Oᵀ [D, 8] += V̂ᵀ [D, T] · Pᵀ [T, 8]       V̂ᵀ from registers (D/16 m-tiles), Pᵀ by movmatrix from Sᵀ
Centroids come from two 256-entry tables of 32-bit words (the key table and the value table, one when
equal), replicated for the 32 lanes in the first 64 KiB of shared memory: entry e, lane l at byte
e·256 + l·4 (+128 for the second table), so one `prmt` forms the address from a packed byte and a lookup
never has a bank conflict.
Key mode 4 (nibble words): a byte's two nibbles → the float16 pair (c[lo], c[hi]). Key mode 8 (byte
words): one lookup per byte, its float16 centroid in the entry's low half, two bytes' centroids packed by
`prmt`. Key mode 9 (uniform 8-bit keys): arithmetic (k − 128 as float16, the step folded into the query),
no table. Values pair two tokens, (token 2t, token 2t+1) of one coordinate, as operand A needs: value
mode 4 (nibble words) pairs the two tokens' nibbles into one byte first, so one lookup yields the pair;
value mode 8 (byte words, D/4 a token) looks up each token's byte and packs the two centroids by `prmt`.
Other widths (K_BITS 1–3 in key mode 4, 5–7 in key mode 8, V_BITS 1–3 in value mode 4, 5–7 in value mode 8;
sm_90+): the TMA boxes carry the packed rows unswizzled, and the read-back spreads each piece's fields into
nibble or byte slots (_decode_lut_ptx.spread_piece_asm), so everything after it is the 4- or 8-bit path,
with tables that repeat every 2^bits entries. TMA boxes take rows of a multiple of 16 bytes: a token's row in
the boxes and slots is its packed bytes rounded up to 16 (the box pitch); at D = 64 odd widths' rows (8·bits
bytes, not a multiple of 16) come through flat-form maps (K_FLAT, V_FLAT: _tensor_map.box_map), whose boxes
span a token's row of all heads from byte h·P rounded down to 16 (a box's inner coordinate is 16-byte
aligned), so head h's bytes start (h·P mod 16) bytes into the row (0 or 8: P = 8·bits) and the pitch around
them holds the neighbouring heads' (or zeros); the item's read-back offsets add that shift.
The packed words of tile i + 1 are copied into shared memory while tile i is computed, in PTX the compiler
does not see: on sm_90+ (TMA) as boxes of one block piece and kv head each, issued by a few lanes of the warp
and completing on the warp's own mbarrier, the tokens in the slot order π (_tile_perm) that keeps the reads
of the boxes' native rows free of bank conflicts; else by cp.async, each thread copying and reading back only
its own pieces. Either way no warp waits for another. The norms of tile i + 1 and the block ids of tile i + 2
are loaded then too. Block ids are loaded once per block piece and broadcast to the tokens (the piece index
is a register dimension of every layout).
Each thread holds whole words of packed bytes; the coordinates a thread's words hold are relabelled (joins,
a permute and a reshape, checked trivial by the compiler) so that they are exactly its operand fragment.
The query is loaded in the matching order and the partial output stored in natural rotated order, so the
merge rotates back with Π.
Under programmatic dependent launch (PDL) the kernel starts while the query rotation still runs: it fills
its table and stages its first tile, then waits for the rotation's writes before it loads the query. Only
the rotated query may come from that kernel; everything else it reads was written before the rotation
started (launched without PDL, it starts after all earlier work).
The inline PTX addresses the table and the staging slots from `global_smem`, Triton's dynamic shared
memory; the kernel's one allocation is that buffer, and the launcher checks before the first launch of a
configuration that the compiled kernel uses exactly its size (so it sits at offset 0).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import constexpr_function
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from ._decode_lut_ptx import GRID_WAIT_ASM as _GRID_WAIT_ASM
from ._decode_lut_ptx import LUT_BYTES as _LUT_BYTES
from ._decode_lut_ptx import (
    box_pitch,
    fill_asm,
    k4_asm,
    k8_asm,
    shared_bytes,
    staging_asm,
    tma_init_asm,
    tma_stage_asm,
    tma_unstage_asm,
    v4_asm,
    v8_asm,
    warp_slot_bytes,
)
from ._decode_lut_reduce import combine_layout, combine_warps, per_thread

LUT_BYTES = gl.constexpr(_LUT_BYTES)
GRID_WAIT_ASM = gl.constexpr(_GRID_WAIT_ASM)
__all__ = [
    "LUT_BYTES", "PT_ASM", "fill_asm", "k4_asm", "k8_asm", "shared_bytes", "staging_asm", "tma_init_asm",
    "tma_stage_asm", "tma_unstage_asm", "v4_asm", "v8_asm",
]  # fmt: skip


# Probabilities of heads 2t ($2) and 2t+1 ($3) of token row g of an 8×8 block → the float16 Pᵀ fragment
# ($0: token 2t, head g; $1: token 2t+1, head g): pack, then transpose the 8×8 block across the warp.
PT_ASM = gl.constexpr(" ".join([
    "{", ".reg .b32 x, y;", "cvt.rn.f16x2.f32 x, $3, $2;", "movmatrix.sync.aligned.m8n8.trans.b16 y, x;",
    "mov.b32 {$0, $1}, y;", "}",
]))  # fmt: skip


@constexpr_function
def _key_piece_layout(W, KP):
    """Key pieces [W, T, 4·KP] (KP per thread and token, of 2 or 4 words): thread (g, t) holds pieces
    KP·t … KP·t + KP − 1 of tokens g + 8i, a quarter of their words (operand A's rows)."""
    return gl.BlockedLayout([1, 1, KP], [1, 8, 4], [W, 1, 1], [2, 1, 0])


@constexpr_function
def _value_piece_layout(W, T):
    """Value pieces [W, T, 8] of VW/8 words each (piece c: words c·VW/8 …): thread (g, t) holds piece g of
    tokens 2t, 2t+1 (+8i); joined with the piece's words, thread (g, t) holds an eighth of those tokens'
    words (operand A's pairs)."""
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 1, 0]] + [[0, 8 << i, 0] for i in range(T.bit_length() - 4)],
        lane_bases=[[0, 2, 0], [0, 4, 0], [0, 0, 1], [0, 0, 2], [0, 0, 4]],
        warp_bases=[[1 << i, 0, 0] for i in range(W.bit_length() - 1)], block_bases=[], shape=[W, T, 8],
    )  # fmt: skip


_shared_bytes = constexpr_function(shared_bytes)
_warp_slot_bytes = constexpr_function(warp_slot_bytes)
_box_pitch = constexpr_function(box_pitch)
_fill_asm = constexpr_function(fill_asm)


@constexpr_function
def _constraints(outputs, inputs, pack):
    """Operand constraints of a packed asm call: each output, then each input, `pack` times in a row."""
    return ",".join(
        [f"={c}" for c in outputs for _ in range(pack)] + [c for c in inputs for _ in range(pack)]
    )


@gluon.jit
def _join4(a, b, c, d):
    """Four tensors → one with two new minor axes: [..., i0, i1] = (a, b, c, d)[i0 + 2·i1]."""
    return gl.join(gl.join(a, b), gl.join(c, d))


@gluon.jit
def _join8(x0, x1, x2, x3, x4, x5, x6, x7):
    return gl.join(_join4(x0, x1, x2, x3), _join4(x4, x5, x6, x7))


@gluon.jit
def _k_phys(d, K_MODE: gl.constexpr, D: gl.constexpr):
    """Natural coordinate of logical key coordinate d (operand-A column order, see _k_operand; w: the word,
    nib, b: nibble and byte in it)."""
    if K_MODE == 4:
        nib = d & 1
        b = ((d >> 3) & 1) | (((d >> 4) & 1) << 1)
        if D == 128:  # d bits (low → high): nib, w2, w3, b0, b1, w0, w1; coordinate 8w + 2b + nib
            w = ((d >> 5) & 1) | (((d >> 6) & 1) << 1) | (((d >> 1) & 1) << 2) | (((d >> 2) & 1) << 3)
        else:  # d bits: nib, w1, w2, b0, b1, w0
            w = ((d >> 5) & 1) | (((d >> 1) & 1) << 1) | (((d >> 2) & 1) << 2)
        return 8 * w + 2 * b + nib
    else:
        b = (d & 1) | (((d >> 3) & 1) << 1)
        if D == 128:  # d bits: b0, w3, w4, b1, w0, w1, w2; coordinate 4w + b
            w = ((d >> 4) & 7) | (((d >> 1) & 1) << 3) | (((d >> 2) & 1) << 4)
        else:  # d bits: b0, w2, w3, b1, w0, w1
            w = ((d >> 4) & 3) | (((d >> 1) & 1) << 2) | (((d >> 2) & 1) << 3)
        return 4 * w + b


# The relabellings, by (key or value mode, D): the axes of the joined lookups, in the order of the operand's
# logical coordinate bits (high → low). _k_operand: from [W, T, word bits, field bits] (key mode 4: w…, nib,
# b0, b1; 8: w…, b0, b1) to [W, T, (w low bits) b1 (b0) (w two high bits: the lane's quarter) nib or b0];
# _v_operand: from [W, T/2, word bits, j, field bits] (n0 n1 n2 or b0 b1; token 2i + j) to [W, row bits
# (high → low), i, j], the row's three low bits the lane's eighth (_v_phys).
K_AXES = gl.constexpr({
    (4, 128): (0, 1, 4, 5, 8, 7, 2, 3, 6),  # [W, T, w3 w2 w1 w0, nib, b0, b1] → w1 w0 b1 b0 w3 w2 nib
    (8, 128): (0, 1, 4, 5, 6, 8, 2, 3, 7),  # [W, T, w4 … w0, b0, b1] → w2 w1 w0 b1 w4 w3 b0
    (4, 64): (0, 1, 4, 7, 6, 2, 3, 5),  # [W, T, w2 w1 w0, nib, b0, b1] → w0 b1 b0 w2 w1 nib
    (8, 64): (0, 1, 4, 5, 7, 2, 3, 6),  # [W, T, w3 … w0, b0, b1] → w1 w0 b1 w3 w2 b0
})  # fmt: skip
V_AXES = gl.constexpr({
    (4, 128): (0, 9, 8, 7, 5, 2, 3, 4, 1, 6),  # [W, T/2, w3 … w0, j, n0 n1 n2] → n2 n1 n0 w0 w3 w2 w1
    (8, 128): (0, 5, 6, 9, 8, 2, 3, 4, 1, 7),  # [W, T/2, w4 … w0, j, b0 b1] → w1 w0 b1 b0 w4 w3 w2
    (4, 64): (0, 8, 7, 6, 2, 3, 4, 1, 5),  # [W, T/2, w2 w1 w0, j, n0 n1 n2] → n2 n1 n0 w2 w1 w0
    (8, 64): (0, 5, 8, 7, 2, 3, 4, 1, 6),  # [W, T/2, w3 … w0, j, b0 b1] → w0 b1 b0 w3 w2 w1
})  # fmt: skip


@constexpr_function
def _k_axes(K_MODE, D):
    return K_AXES.value[(4 if K_MODE == 4 else 8, D)]


@constexpr_function
def _v_axes(V_MODE, D):
    return V_AXES.value[(V_MODE, D)]


@constexpr_function
def _bit_shape(A, B, N):
    """[A, B, 2, …, 2]: N (a power of two) as its bits, the highest first."""
    return [A, B] + [2] * (N.bit_length() - 1)


@gluon.jit
def _v_phys(r, V_MODE: gl.constexpr, D: gl.constexpr):
    """Natural coordinate of logical value coordinate r (operand-A row order, see _v_operand).
    D = 128, value mode 4: r bits (low → high) w1, w2, w3, w0, n0, n1, n2; coordinate 8w + n (nibble n of
    word w). Value mode 8: r bits w2, w3, w4, b0, b1, w0, w1; coordinate 4w + b (byte b of word w), which is
    16·(r & 7) + (r >> 3). D = 64: r bits w0, w1, w2, n0, n1, n2 (value mode 4: 8w + n) or w1, w2, w3, b0,
    b1, w0 (8: 4w + b), both 8·(r & 7) + (r >> 3)."""
    if D == 64:
        return 8 * (r & 7) + (r >> 3)
    elif V_MODE == 4:
        w = ((r >> 3) & 1) | ((r & 7) << 1)
        return 8 * w + (r >> 4)
    else:
        return 16 * (r & 7) + (r >> 3)


@gluon.jit
def _k_operand(
    words, probe, W: gl.constexpr, T: gl.constexpr, K_MODE: gl.constexpr, K_ASM: gl.constexpr, D: gl.constexpr
):  # fmt: skip
    """Packed key words [W, T, D/8 (key mode 4) or D/4] → K̂ [W, T, D] float16, columns in logical order
    (_k_phys)."""
    w = gl.reshape(words, _bit_shape(W, T, words.shape[2]).value)  # the word bits, highest first
    if K_MODE == 4:
        w = gl.join(w, w)  # the nibble axis: one packed float16 pair per byte
        o0, o1, o2, o3 = gl.inline_asm_elementwise(
            K_ASM, "=r,=r,=r,=r,r,r,r,r", [w, probe], dtype=(gl.float16,) * 4, is_pure=True, pack=2
        )
        x = _join4(o0, o1, o2, o3)  # [W, T, word bits, nib, b0, b1]
    else:
        w = gl.join(w, w)  # the axis b0: one packed float16 pair per two bytes
        o0, o1 = gl.inline_asm_elementwise(
            K_ASM, "=r,=r,r,r,r,r", [w, probe], dtype=(gl.float16,) * 2, is_pure=True, pack=2
        )
        x = gl.join(o0, o1)  # [W, T, word bits, b0, b1]
    return gl.reshape(gl.permute(x, _k_axes(K_MODE, D).value), [W, T, D])


@gluon.jit
def _v_operand(
    words, probe, W: gl.constexpr, T: gl.constexpr, V_MODE: gl.constexpr, V_ASM: gl.constexpr, D: gl.constexpr
):  # fmt: skip
    """Packed value words [W, T, VW] (VW = D/8 in value mode 4, D/4 in 8) → V̂ᵀ [W, D, T] float16, rows in
    logical order (_v_phys). Thread (g, t) holds an eighth of the words (VW/8 from word g·VW/8) of tokens 2t,
    2t+1 (+8i); the relabelling makes its rows g + 8h + 16a (h < 2, a < D/16), operand A's fragment."""
    VW: gl.constexpr = words.shape[2]
    pairs = gl.permute(gl.reshape(words, [W, T // 2, 2, VW]), [0, 1, 3, 2])
    wa, wb = gl.split(pairs)  # tokens 2i and 2i+1: [W, T/2, VW]
    wa = gl.reshape(wa, _bit_shape(W, T // 2, VW).value)  # the word bits, highest first
    wb = gl.reshape(wb, _bit_shape(W, T // 2, VW).value)
    if V_MODE == 4:
        # the token-pair axis j: one packed float16 pair (token 2i, 2i+1) per nibble
        o = gl.inline_asm_elementwise(
            V_ASM, "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r,r,r", [gl.join(wa, wa), gl.join(wb, wb), probe],
            dtype=(gl.float16,) * 8, is_pure=True, pack=2,
        )  # fmt: skip
        x = _join8(o[0], o[1], o[2], o[3], o[4], o[5], o[6], o[7])  # [W, T/2, word bits, j, n0, n1, n2]
    else:
        # the token-pair axis j: one packed float16 pair (token 2i, 2i+1) per byte
        o = gl.inline_asm_elementwise(
            V_ASM, "=r,=r,=r,=r,r,r,r,r,r,r", [gl.join(wa, wa), gl.join(wb, wb), probe],
            dtype=(gl.float16,) * 4, is_pure=True, pack=2,
        )  # fmt: skip
        x = _join4(o[0], o[1], o[2], o[3])  # [W, T/2, word bits, j, b0, b1]
    return gl.reshape(gl.permute(x, _v_axes(V_MODE, D).value), [W, D, T])


@gluon.jit
def _p_operand(p, W: gl.constexpr, T: gl.constexpr):
    """Probabilities [W, T, 8] f32 in the accumulator layout → Pᵀ [W, T, 8] float16 for operand B."""
    even, odd = gl.split(gl.reshape(p, [W, T, 4, 2]))
    lo, hi = gl.inline_asm_elementwise(
        PT_ASM, "=h,=h,r,r", [even, odd], dtype=(gl.float16, gl.float16), is_pure=True, pack=1
    )
    # label (token 8i + g, head pair t) now holds tokens 8i + 2t + c of head g
    x = gl.reshape(gl.join(lo, hi), [W, T // 8, 8, 4, 2])  # i g t c
    x = gl.permute(x, [0, 1, 3, 4, 2])
    return gl.reshape(x, [W, T, 8])


@gluon.jit
def _tile_blocks(t0, end, b_tok, bt_row, sbt_m, max_blocks, BS_SHIFT: gl.constexpr):
    """Block ids [W, NBT] of the tile's block pieces starting at tokens t0 + b_tok (0 at or past `end`)."""
    t = t0 + b_tok
    return gl.load(bt_row + gl.minimum(t >> BS_SHIFT, max_blocks - 1) * sbt_m, mask=t < end, other=0)


@gluon.jit
def _per_token(bid, tok, W: gl.constexpr, T: gl.constexpr, NBT: gl.constexpr):
    """Block id of each token of `tok` [W, T] (its layout), from the pieces' ids `bid` [W, NBT]: the piece
    index is a register dimension of every layout here, so this is a broadcast, not a gather."""
    tok3 = gl.reshape(tok, [W, NBT, T // NBT])
    bid3 = gl.convert_layout(bid, gl.SliceLayout(2, tok3.type.layout), assert_trivial=True)
    per_token = gl.reshape(gl.broadcast(bid3[:, :, None], tok3)[0], [W, T])
    return gl.convert_layout(per_token, tok.type.layout, assert_trivial=True)


@gluon.jit
def _in_block(t, tok, BLOCK_SIZE: gl.constexpr, STEP: gl.constexpr):
    """Offsets in their blocks of tokens t = t0 + tok of a tile (t0 a multiple of STEP): from tok alone, a
    constant, where the block size divides STEP."""
    if BLOCK_SIZE <= STEP:
        return tok & (BLOCK_SIZE - 1)
    else:
        return t & (BLOCK_SIZE - 1)


@gluon.jit
def _stage_tile(
    t0, end, h, bid, k_tok, k_word, v_tok, v_word, kp_ptr, skp_b, skp_o, skp_h, vp_ptr, svp_b, svp_o, svp_h,
    BLOCK_SIZE: gl.constexpr, W: gl.constexpr, T: gl.constexpr, NBT: gl.constexpr,
    K_STAGE: gl.constexpr, V_STAGE: gl.constexpr, KPT: gl.constexpr,
):  # fmt: skip
    """Start copying a tile's packed key words (pieces [W, T, 4·KP] of 16 or 8 bytes, KPT per thread) and
    value words (pieces [W, T, 8] of a token's eighth, T/4 per thread) into this thread's staging slots, as
    one commit group."""
    _stage_pieces(
        t0, end, h, bid, k_tok, k_word, kp_ptr, skp_b, skp_o, skp_h, BLOCK_SIZE, W, T, NBT, K_STAGE, KPT
    )
    _stage_pieces(
        t0, end, h, bid, v_tok, v_word, vp_ptr, svp_b, svp_o, svp_h, BLOCK_SIZE, W, T, NBT, V_STAGE, T // 4
    )


@gluon.jit
def _stage_pieces(
    t0, end, h, bid, tok, word, ptr, s_b, s_o, s_h,
    BLOCK_SIZE: gl.constexpr, W: gl.constexpr, T: gl.constexpr, NBT: gl.constexpr,
    STAGE: gl.constexpr, PIECES: gl.constexpr,
):  # fmt: skip
    """One cache's pieces of a tile (tokens t0 + tok [W, T], word offsets `word`), PIECES per thread, by the
    staging PTX STAGE. Tokens at or past `end` are skipped (their slots keep stale bytes, which are valid
    indices; their scores are masked)."""
    t = t0 + tok
    rows = _per_token(bid, tok, W, T, NBT) * s_b + _in_block(t, tok, BLOCK_SIZE, W * T) * s_o + h * s_h
    addr = (ptr + rows[:, :, None] + word).to(gl.int64)
    copy = gl.broadcast((t < end).to(gl.int32)[:, :, None], addr)[0]
    gl.inline_asm_elementwise(STAGE, _constraints("r", "lr", PIECES), [addr, copy], gl.int32, False, PIECES)


@gluon.jit
def _unstage_tile(
    k_any, v_any, W: gl.constexpr, T: gl.constexpr, KW: gl.constexpr, VW: gl.constexpr,
    K_UNSTAGE: gl.constexpr, V_UNSTAGE: gl.constexpr, KPT: gl.constexpr,
):  # fmt: skip
    """Wait for this thread's copies, then read them back: key words [W, T, KW], value words [W, T, VW]
    (k_any, v_any: any int32 tensors shaped and laid out as the key and value pieces)."""
    return _key_words(k_any, k_any, W, T, KW, K_UNSTAGE, KPT, False), _value_words(v_any, W, T, VW, V_UNSTAGE)


@gluon.jit
def _key_words(
    k_in, parity, W: gl.constexpr, T: gl.constexpr, KW: gl.constexpr, K_UNSTAGE: gl.constexpr,
    KPT: gl.constexpr, TMA: gl.constexpr,
):  # fmt: skip
    """Key words [W, T, KW] by the key read-back PTX, one operand per piece (k_in [W, T, 4·KP] int32, laid
    out as the key pieces; TMA: then the mbarrier parity, unused otherwise): a piece's 4 words (2 where
    KW = 8), word k of piece c → word 4c + k (2c + k)."""
    if KW == 8:
        if TMA:
            k_cons: gl.constexpr = _constraints("rr", "rr", KPT)
            k0, k1 = gl.inline_asm_elementwise(K_UNSTAGE, k_cons, [k_in, parity], (gl.int32,) * 2, False, KPT)
        else:
            k0, k1 = gl.inline_asm_elementwise(
                K_UNSTAGE, _constraints("rr", "r", KPT), [k_in], (gl.int32,) * 2, False, KPT
            )
        return gl.reshape(gl.join(k0, k1), [W, T, KW])
    else:
        if TMA:
            k_cons: gl.constexpr = _constraints("rrrr", "rr", KPT)
            k0, k1, k2, k3 = gl.inline_asm_elementwise(
                K_UNSTAGE, k_cons, [k_in, parity], (gl.int32,) * 4, False, KPT
            )
        else:
            k_cons: gl.constexpr = _constraints("rrrr", "r", KPT)
            k0, k1, k2, k3 = gl.inline_asm_elementwise(K_UNSTAGE, k_cons, [k_in], (gl.int32,) * 4, False, KPT)
        return gl.reshape(_join4(k0, k2, k1, k3), [W, T, KW])


@gluon.jit
def _value_words(v_in, W: gl.constexpr, T: gl.constexpr, VW: gl.constexpr, V_UNSTAGE: gl.constexpr):
    """Value words [W, T, VW] by the value read-back PTX, one operand per piece (v_in [W, T, 8] int32, laid
    out as the value pieces): a piece's VW/8 words (1, 2 or 4), word k of piece c → word (VW/8)·c + k."""
    if VW == 8:
        v_cons: gl.constexpr = _constraints("r", "r", T // 4)
        return gl.inline_asm_elementwise(V_UNSTAGE, v_cons, [v_in], gl.int32, False, T // 4)
    elif VW == 16:
        v_cons: gl.constexpr = _constraints("rr", "r", T // 4)
        v0, v1 = gl.inline_asm_elementwise(V_UNSTAGE, v_cons, [v_in], (gl.int32,) * 2, False, T // 4)
        return gl.reshape(gl.join(v0, v1), [W, T, 16])
    else:
        v_cons: gl.constexpr = _constraints("rrrr", "r", T // 4)
        v0, v1, v2, v3 = gl.inline_asm_elementwise(V_UNSTAGE, v_cons, [v_in], (gl.int32,) * 4, False, T // 4)
        return gl.reshape(_join4(v0, v2, v1, v3), [W, T, 32])


@gluon.jit
def _tile_perm(m, V_MODE: gl.constexpr, D: gl.constexpr):
    """Slot order of a tile's tokens: MMA token m (row of Sᵀ, column of V̂ᵀ) is token π(m) of the tile, so
    that the TMA path's reads of native slots meet distinct banks. D = 128: the two tokens a quarter warp
    reads for keys differ in parity; in value mode 4 (64-byte rows, 8-byte reads) the four a half warp reads
    differ in bits 0 and 2, π permuting each 8 as 0 3 1 2 4 7 5 6; in value mode 8 (128-byte rows, 16-byte
    reads) the four a quarter warp reads (tokens r, r+2, r+4, r+6) differ in bits 1 and 2, π the identity.
    D = 64 (32-byte rows not swizzled, 64-byte rows swizzled as at D = 128): π's bits (p0, p1, p2) =
    (m0 ^ m2, m1, m1 ^ m2) in each 8, so that the four tokens a half warp reads for keys of 32-byte rows
    (8-byte reads: π(g), g < 4 or ≥ 4) differ in bits 0 and 1, the two a quarter warp reads for keys of
    64-byte rows (16-byte reads) in parity, and the four a warp reads for values (tokens r, r+2, r+4, r+6)
    in bits 0 and 1 (value mode 4: 32-byte rows, 4-byte reads) and in bits 0 and 2 (value mode 8: 64-byte
    rows, 8-byte reads by half warps)."""
    if D == 64:
        return (m & ~7) | ((m ^ (m >> 2)) & 1) | (m & 2) | ((((m >> 1) ^ (m >> 2)) & 1) << 2)
    elif V_MODE == 4:
        return (m & ~3) | (((m >> 1) & 1) ^ ((m & 1) * 3))
    else:
        return m


@gluon.jit
def _native_read(row, c, m, ROW_BYTES: gl.constexpr, PIECE_BYTES: gl.constexpr):
    """Shared byte offset of piece c (PIECE_BYTES of native words) of slot row m (first byte `row`) as its TMA
    box writes it: 128-byte rows swizzled by 128 bytes (16-byte chunk k at k ^ (m & 7)), 64-byte rows by 64
    (at k ^ ((m >> 1) & 3); 8-byte pieces: half a chunk), 32-byte rows as they are."""
    if ROW_BYTES == 128:
        return row + (c ^ (m & 7)) * 16
    elif ROW_BYTES == 64:
        if PIECE_BYTES == 16:
            return row + (c ^ ((m >> 1) & 3)) * 16
        else:
            return row + ((c >> 1) ^ ((m >> 1) & 3)) * 16 + (c & 1) * 8
    else:
        return row + c * PIECE_BYTES


@gluon.jit
def _tma_stage(
    t0, end, h, bid, box_tok, box_key, box_dst, k_map, v_map,
    BLOCK_SIZE: gl.constexpr, STEP: gl.constexpr, ROWS: gl.constexpr, K_BYTES: gl.constexpr,
    V_BYTES: gl.constexpr, K_FLAT: gl.constexpr, V_FLAT: gl.constexpr, STAGE: gl.constexpr,
):  # fmt: skip
    """Issue a tile's TMA boxes [W, 32] (lane j: box j, of ROWS tokens from token t0 + box_tok, keys where
    box_key, each token's row K_BYTES or V_BYTES packed bytes at their box pitch; box_dst < 0: no box; bid:
    the boxes' block ids) and arrive on the warps' mbarriers."""
    t = t0 + box_tok
    offset = _in_block(t, box_tok, BLOCK_SIZE, STEP)
    pitch = gl.where(box_key, _box_pitch(K_BYTES), _box_pitch(V_BYTES))
    size = gl.where((t < end) & (box_dst >= 0), pitch * ROWS, 0)
    tmap = gl.where(box_key, k_map, v_map)
    x, y, z, w = _box_coords(h + box_tok * 0, offset, bid, box_key, K_BYTES, V_BYTES, K_FLAT, V_FLAT)
    gl.inline_asm_elementwise(
        STAGE, "=r,l,r,r,r,r,r,r", [tmap, x, y, z, w, box_dst, size], gl.int32, False, 1
    )


@gluon.jit
def _box_coords(
    h, offset, bid, box_key, K_BYTES: gl.constexpr, V_BYTES: gl.constexpr, K_FLAT: gl.constexpr,
    V_FLAT: gl.constexpr,
):  # fmt: skip
    """The four coordinates (innermost first) of each lane's box [W, 32] of kv head h, `offset` in block
    `bid`: {0, h, offset, block} in a native-form map (dims P, H, BS, NB), {h·P rounded down to 16, offset,
    block, 0} in a flat-form one (dims H·P, BS, NB, 1), P = K_BYTES for key boxes, V_BYTES for value boxes."""
    zero = offset * 0
    if K_FLAT or V_FLAT:
        flat = gl.where(box_key, K_FLAT, V_FLAT)
        x = gl.where(flat, h * gl.where(box_key, K_BYTES, V_BYTES) // 16 * 16, zero)
        return x, gl.where(flat, offset, h), gl.where(flat, bid, offset), gl.where(flat, zero, bid)
    else:
        return zero, h, offset, bid


@gluon.jit
def _tma_unstage_tile(
    k_read, parity, v_read, W: gl.constexpr, T: gl.constexpr, KW: gl.constexpr, VW: gl.constexpr,
    K_UNSTAGE: gl.constexpr, V_UNSTAGE: gl.constexpr, KPT: gl.constexpr,
):  # fmt: skip
    """Wait for the warp's boxes (mbarrier phase `parity`), then read its pieces at the shared offsets k_read
    [W, T, 4·KP] and v_read [W, T, 8]: key words [W, T, KW], value words [W, T, VW]."""
    keys = _key_words(k_read, parity, W, T, KW, K_UNSTAGE, KPT, True)
    return keys, _value_words(v_read, W, T, VW, V_UNSTAGE)


@gluon.jit
def _tile_norms(
    t0, end, h, bid, k_tok, kn_ptr, skn_b, skn_o, skn_h, vn_ptr, svn_b, svn_o, svn_h,
    BLOCK_SIZE: gl.constexpr, SCORE_ROWS: gl.constexpr, W: gl.constexpr, T: gl.constexpr, NBT: gl.constexpr,
):  # fmt: skip
    """A tile's key and value norms and token validity [W, T] in the score rows' layout (the score rows hold
    the key rows' tokens); norms of tokens at or past `end` read as 0."""
    t = gl.convert_layout(t0 + k_tok, SCORE_ROWS, assert_trivial=True)
    block = gl.convert_layout(_per_token(bid, k_tok, W, T, NBT), SCORE_ROWS, assert_trivial=True)
    valid = t < end
    offset = _in_block(t, gl.convert_layout(k_tok, SCORE_ROWS, assert_trivial=True), BLOCK_SIZE, W * T)
    kn = gl.load(kn_ptr + block * skn_b + offset * skn_o + h * skn_h, mask=valid, other=0.0)
    vn = gl.load(vn_ptr + block * svn_b + offset * svn_o + h * svn_h, mask=valid, other=0.0)
    return kn, vn, valid


@gluon.jit
def _item_query(
    q_row, qb_off, qb_mask, n_mask, k_step,
    K_MODE: gl.constexpr, W: gl.constexpr, D: gl.constexpr, MMA: gl.constexpr,
):  # fmt: skip
    """The item's rotated query rows (q_row: its first; n_mask [8]: the kv head's) as Q̂ᵀ [W, D, 8]
    (operand B at qb_off, where qb_mask), and for uniform 8-bit keys (K_MODE 9: Σ q·c[k] = step·(Σ q·(k − 128)
    + Σ q/2)) scaled by the step, with the score offset [W, 8] (else zeros)."""
    q = gl.load(q_row + qb_off, mask=qb_mask, other=0.0)
    q_half = gl.zeros([W, 8], gl.float32, gl.SliceLayout(1, MMA))
    if K_MODE == 9:
        q = (q.to(gl.float32) * k_step).to(gl.float16)
        m_n = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, MMA)))
        m_r = gl.arange(0, D, layout=gl.SliceLayout(0, gl.SliceLayout(2, MMA)))
        r_w = gl.arange(0, W, layout=gl.SliceLayout(1, gl.SliceLayout(2, MMA)))
        q_m = gl.load(
            q_row + m_r[None, :, None] + m_n[None, None, :] * D + r_w[:, None, None] * 0,
            mask=n_mask[None, None, :], other=0.0,
        )  # fmt: skip
        q_half = 0.5 * gl.sum((q_m.to(gl.float32) * k_step).to(gl.float16).to(gl.float32), axis=1)
    return q, q_half


@gluon.jit
def _decode_lut_kernel(
    qr_ptr,  # rotated query × scale·log2 e [B, Hq, D] float16, natural order, contiguous
    # keys and values as int32 words [NB, BS, H, Pk/4 or Pv/4] and their norms [NB, BS, H]; the token and
    # head strides are compile-time constants (the addresses of a tile's tokens fold into few operations)
    kp_ptr, skp_b, skp_o: gl.constexpr, skp_h: gl.constexpr,
    kn_ptr, skn_b, skn_o: gl.constexpr, skn_h: gl.constexpr,
    vp_ptr, svp_b, svp_o: gl.constexpr, svp_h: gl.constexpr,
    vn_ptr, svn_b, svn_o: gl.constexpr, svn_h: gl.constexpr,
    lut_ptr,  # [256, 2] int32: the two tables' entries (the key table and the value table)
    # TMA: global addresses of the caches' tensor maps, boxes of rows tokens of one block and kv head: native
    # form [1, rows, 1, Pk or Pv] bytes; flat form (K_FLAT, V_FLAT) [1, 1, rows, pitch] of a token's heads
    k_map, v_map,
    bt_ptr, sbt_b, sbt_m, ctx_ptr,  # block_tables [B, M], context_lens [B]
    po_ptr, pl_ptr,  # partial out [B, Hq, P, D] f32 (natural order), partial lse [B, Hq, P] f32
    H, Hq, G, S, P, split_tokens, num_items, max_blocks, k_step,  # P: room for partials per head
    BLOCK_SIZE: gl.constexpr, BS_SHIFT: gl.constexpr,
    K_MODE: gl.constexpr, K_ASM: gl.constexpr, V_MODE: gl.constexpr, V_ASM: gl.constexpr,
    K_BITS: gl.constexpr, V_BITS: gl.constexpr,  # packed widths (mode 4: 1–4 bits, 8 and 9: 5–8)
    D: gl.constexpr,  # head_dim: 128, or 64
    W: gl.constexpr, T: gl.constexpr,  # warps per program, tokens per warp and step
    K_STAGE: gl.constexpr, V_STAGE: gl.constexpr, K_UNSTAGE: gl.constexpr, V_UNSTAGE: gl.constexpr,
    TMA: gl.constexpr,  # TMA staging (sm_90+; K_STAGE: the boxes, V_STAGE: the mbarrier init)
    K_FLAT: gl.constexpr, V_FLAT: gl.constexpr,  # TMA: flat-form key, value maps (rows not a multiple of 16)
    COMBINE: gl.constexpr,  # one partial per item (P ≥ S), else one per item and warp (P ≥ S·W)
    PDL: gl.constexpr = False,  # launched dependent on the query rotation: wait for it before reading qr_ptr
):  # fmt: skip
    gl.static_assert((D == 64) or (D == 128))
    KW: gl.constexpr = D // 8 if K_MODE == 4 else D // 4  # key words per token
    VW: gl.constexpr = D * V_MODE // 32  # value words per token
    MMA: gl.constexpr = gl.NVMMADistributedLayout(
        version=[2, 0], warps_per_cta=[W, 1, 1], instr_shape=[1, 16, 8]
    )
    OPA: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    OPB: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
    STEP: gl.constexpr = W * T
    KPW: gl.constexpr = 4 if KW >= 16 else 2  # words of a key piece (16 or 8 bytes)
    KP: gl.constexpr = KW // (4 * KPW)  # key pieces per thread and token
    KPT: gl.constexpr = KP * (T // 8)  # ... per thread
    # staged pieces: keys [W, T, 4·KP], thread (g, t) holding MMA rows (tokens) g + 8i and pieces KP·t …;
    # values [W, T, 8] (VW/8 words each), thread (g, t) holding tokens 2t, 2t+1 (+8i) and piece g
    KC: gl.constexpr = _key_piece_layout(W, KP)
    VC: gl.constexpr = _value_piece_layout(W, T)
    FL: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [W, 1], [1, 0])  # table fill [64, 32]
    SCORE_ROWS: gl.constexpr = gl.SliceLayout(2, MMA)

    # Shared memory, one buffer of 8 KiB chunks: the table (entry e, lane l → word e·64 + 32·table + l) at
    # offset 0, then the staging slots, which only the staging PTX touches during an item and the combine
    # between items, then a last chunk (the mbarriers, the combine's log-sum-exps).
    SMEM: gl.constexpr = _shared_bytes(W, T, K_MODE, V_MODE, D)
    gl.static_assert(SMEM % 8192 == 0)
    buf = gl.allocate_shared_memory(
        gl.int32, [SMEM // 8192, 64, 32], gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    )
    threads = gl.arange(0, 32 * W, layout=gl.BlockedLayout([1], [32], [W], [0]))  # one element per thread
    # The fill: rows of 32 words, row r holding entry r >> 1 of table r & 1 (the [256, 2] table is row-major),
    # thread i writing rows i + 32·W·j in inline PTX; the compiler sees a second fill of the first 64 rows
    # (same values) and puts one CTA barrier between it and the read-back below, after every fill store.
    FR: gl.constexpr = LUT_BYTES // 128 // (32 * W)  # rows per thread
    gl.static_assert(FR * 32 * W == LUT_BYTES // 128)
    rows = gl.arange(0, LUT_BYTES // 128, layout=gl.BlockedLayout([1], [32], [W], [0]))
    words = gl.load(lut_ptr + rows)
    gl.inline_asm_elementwise(_fill_asm(FR), _constraints("r", "r", FR), [words], gl.int32, False, FR)
    fr = gl.arange(0, 64, layout=gl.SliceLayout(1, FL))
    buf.index(0).store(gl.broadcast(gl.load(lut_ptr + fr)[:, None], gl.full([64, 32], 0, gl.int32, FL))[0])
    # read back after that barrier: every lookup takes it as an operand, so none runs before (a one-row slice
    # that each warp reads whole: no cross-warp reduction)
    probe = gl.max(gl.max(buf.index(0).slice(0, 1).load(FL), axis=1), axis=0)

    # the pieces' token and word indices
    kc_w = gl.arange(0, W, layout=gl.SliceLayout(1, gl.SliceLayout(2, KC)))
    kc_m = gl.arange(0, T, layout=gl.SliceLayout(0, gl.SliceLayout(2, KC)))
    kc_c = gl.arange(0, 4 * KP, layout=gl.SliceLayout(0, gl.SliceLayout(1, KC)))
    k_tok = kc_w[:, None] * T + _tile_perm(kc_m, V_MODE, D)[None, :]  # [W, T]
    k_word = KPW * kc_c[None, None, :]
    k_any = gl.full([W, T, 4 * KP], 0, gl.int32, KC)
    vc_w = gl.arange(0, W, layout=gl.SliceLayout(1, gl.SliceLayout(2, VC)))
    vc_t = gl.arange(0, T, layout=gl.SliceLayout(0, gl.SliceLayout(2, VC)))
    vc_c = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, VC)))
    v_tok = vc_w[:, None] * T + _tile_perm(vc_t, V_MODE, D)[None, :]
    v_word = VW // 8 * vc_c[None, None, :]
    v_any = gl.full([W, T, 8], 0, gl.int32, VC)
    if TMA:
        # the boxes [W, 32] of ROWS tokens: lane j < R_BOX: key box j, R_BOX ≤ j < 2·R_BOX: value box j − R
        ROWS: gl.constexpr = BLOCK_SIZE if BLOCK_SIZE < T else T
        R_BOX: gl.constexpr = T // ROWS
        PK: gl.constexpr = 4 * KW  # a token's key slot (its value slots start at T·PK)
        PKR: gl.constexpr = K_BITS * D // 8  # a token's packed key bytes (place a piece's fields in its row)
        PVR: gl.constexpr = V_BITS * D // 8  # ... value bytes
        K_PITCH: gl.constexpr = _box_pitch(PKR)  # a token's row in the boxes and slots (sizes, row starts)
        V_PITCH: gl.constexpr = _box_pitch(PVR)
        # the rows fit the tokens' slots; flat-form maps are those of rows not a multiple of 16 bytes
        gl.static_assert((K_PITCH <= PK) and (V_PITCH <= 4 * VW))
        gl.static_assert(((K_PITCH != PKR) == K_FLAT) and ((V_PITCH != PVR) == V_FLAT))
        # flat rows of P ≡ 8 (mod 16) bytes: a head's shift in its box row (h·P mod 16) is 0 or 8 and its
        # bytes end within the pitch (P + 8)
        gl.static_assert((PKR % 8 == 0) and (PVR % 8 == 0))
        WARP_BYTES: gl.constexpr = _warp_slot_bytes(T, K_MODE, V_MODE, D)  # the PTX's too (mbarriers follow)
        BXL: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [W, 1], [1, 0])
        bx_w = gl.arange(0, W, layout=gl.SliceLayout(1, BXL))[:, None]
        bx_j = gl.arange(0, 32, layout=gl.SliceLayout(0, BXL))[None, :]
        box_key = bx_j < R_BOX
        box_row = (bx_j % R_BOX) * ROWS  # the box's first token in the warp's T
        box_tok = bx_w * T + box_row
        box_slot = gl.where(box_key, box_row * K_PITCH, T * PK + box_row * V_PITCH)
        box_dst = gl.where(bx_j < 2 * R_BOX, LUT_BYTES + bx_w * WARP_BYTES + box_slot, -1)
        # the read-back offsets of the pieces the threads hold: native rows as the TMA wrote them (64- and
        # 128-byte rows swizzled), or (other widths, rows not swizzled) the byte of a piece's first field
        # (rows at the pitch, fields packed as in the cache)
        k_pt = _tile_perm(kc_m, V_MODE, D)[None, :, None]
        k_row = LUT_BYTES + kc_w[:, None, None] * WARP_BYTES + k_pt * K_PITCH
        if PKR == PK:
            k_read = _native_read(k_row, kc_c[None, None, :], k_pt, PK, 4 * KPW)
        else:  # a piece: 4·KPW bytes of nibbles or bytes, 32·KPW / (4 or 8) fields
            k_read = k_row + kc_c[None, None, :] * (KPW * (8 if K_MODE == 4 else 4) * PKR // D)
        v_pt = _tile_perm(vc_t, V_MODE, D)[None, :, None]
        v_row = LUT_BYTES + vc_w[:, None, None] * WARP_BYTES + T * PK + v_pt * V_PITCH
        if V_BITS == V_MODE:
            v_read = _native_read(v_row, vc_c[None, None, :], v_pt, PVR, VW // 2)
        else:  # a piece: D/8 fields
            v_read = v_row + vc_c[None, None, :] * (PVR // 8)
        per_thread(V_STAGE, threads)
        staged = gl.program_id(0) * 0  # TMA stages issued (the mbarrier phase of the next one)
    # a warp's T tokens lie in NBT block pieces (first tokens b_tok)
    NBT: gl.constexpr = T // BLOCK_SIZE if BLOCK_SIZE < T else 1
    BL: gl.constexpr = gl.SliceLayout(2, gl.reshape(k_tok, [W, NBT, T // NBT]).type.layout)
    bl_w = gl.arange(0, W, layout=gl.SliceLayout(1, BL))
    bl_n = gl.arange(0, NBT, layout=gl.SliceLayout(0, BL))
    b_tok = bl_w[:, None] * T + bl_n[None, :] * (T // NBT)  # [W, NBT]
    qb_w = gl.arange(0, W, layout=gl.SliceLayout(1, gl.SliceLayout(2, OPB)))
    qb_d = gl.arange(0, D, layout=gl.SliceLayout(0, gl.SliceLayout(2, OPB)))
    qb_n = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, OPB)))
    qb_off = _k_phys(qb_d, K_MODE, D)[None, :, None] + qb_n[None, None, :] * D + qb_w[:, None, None] * 0
    m_w = gl.arange(0, W, layout=gl.SliceLayout(1, gl.SliceLayout(1, MMA)))
    m_n = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, MMA)))
    m_r = gl.arange(0, D, layout=gl.SliceLayout(0, gl.SliceLayout(2, MMA)))
    n_mask = m_n < G  # [8]
    qb_mask = (qb_n < G)[None, None, :]
    RL_OUT: gl.constexpr = gl.SliceLayout(0, combine_layout(W, D))
    o_r = gl.arange(0, D, layout=gl.SliceLayout(1, RL_OUT))[:, None]  # [D, 1] logical rows
    o_n = gl.arange(0, 8, layout=gl.SliceLayout(0, RL_OUT))[None, :]  # [1, 8] heads of the kv head

    for item in range(gl.program_id(0), num_items, gl.num_programs(0)):
        b = item // (H * S)
        h = (item // S) % H
        s = item % S
        ctx = gl.load(ctx_ptr + b)
        start = s * split_tokens
        end = gl.minimum(start + split_tokens, ctx)
        bt_row = bt_ptr + b.to(gl.int64) * sbt_b
        q_row = qr_ptr + (b * Hq + h * G).to(gl.int64) * D
        if not PDL:
            q, q_half = _item_query(q_row, qb_off, qb_mask, n_mask, k_step, K_MODE, W, D, MMA)
        m_i = gl.full([W, 8], float("-inf"), gl.float32, gl.SliceLayout(1, MMA))
        l_i = gl.zeros([W, 8], gl.float32, gl.SliceLayout(1, MMA))
        acc = gl.zeros([W, D, 8], gl.float32, MMA)
        # the pipeline: tile i's words are copied into the staging slots and its norms loaded during tile
        # i − 1, and the block ids of tile i + 1 during tile i − 1 too
        bid = _tile_blocks(start, end, b_tok, bt_row, sbt_m, max_blocks, BS_SHIFT)
        if TMA:
            box_bid = _tile_blocks(start, end, box_tok, bt_row, sbt_m, max_blocks, BS_SHIFT)
            _tma_stage(
                start, end, h, box_bid, box_tok, box_key, box_dst, k_map, v_map, BLOCK_SIZE, STEP, ROWS,
                PKR, PVR, K_FLAT, V_FLAT, K_STAGE,
            )  # fmt: skip
            staged += 1
            box_bid = _tile_blocks(start + STEP, end, box_tok, bt_row, sbt_m, max_blocks, BS_SHIFT)
        else:
            _stage_tile(
                start, end, h, bid, k_tok, k_word, v_tok, v_word,
                kp_ptr, skp_b, skp_o, skp_h, vp_ptr, svp_b, svp_o, svp_h, BLOCK_SIZE, W, T, NBT,
                K_STAGE, V_STAGE, KPT,
            )  # fmt: skip
        kn, vn, sv = _tile_norms(
            start, end, h, bid, k_tok, kn_ptr, skn_b, skn_o, skn_h, vn_ptr, svn_b, svn_o, svn_h,
            BLOCK_SIZE, SCORE_ROWS, W, T, NBT,
        )  # fmt: skip
        bid = _tile_blocks(start + STEP, end, b_tok, bt_row, sbt_m, max_blocks, BS_SHIFT)
        if TMA:  # flat-form rows: head h's bytes start (h·P mod 16) bytes into its box rows
            k_at = k_read + ((h * PKR) % 16 if K_FLAT else 0)
            v_at = v_read + ((h * PVR) % 16 if V_FLAT else 0)
        if PDL:  # the first tile is on its way; the rotated query may still be being written
            per_thread(GRID_WAIT_ASM, threads)
            q, q_half = _item_query(q_row, qb_off, qb_mask, n_mask, k_step, K_MODE, W, D, MMA)
        for t0 in range(start, end, STEP):
            if TMA:  # wait for the phase of the last stage
                kwords, vwords = _tma_unstage_tile(
                    k_at, k_at * 0 + ((staged - 1) & 1), v_at, W, T, KW, VW, K_UNSTAGE, V_UNSTAGE, KPT
                )
                _tma_stage(
                    t0 + STEP, end, h, box_bid, box_tok, box_key, box_dst, k_map, v_map,
                    BLOCK_SIZE, STEP, ROWS, PKR, PVR, K_FLAT, V_FLAT, K_STAGE,
                )  # fmt: skip
                staged += 1
                box_bid = _tile_blocks(t0 + 2 * STEP, end, box_tok, bt_row, sbt_m, max_blocks, BS_SHIFT)
            else:
                kwords, vwords = _unstage_tile(k_any, v_any, W, T, KW, VW, K_UNSTAGE, V_UNSTAGE, KPT)
                _stage_tile(
                    t0 + STEP, end, h, bid, k_tok, k_word, v_tok, v_word,
                    kp_ptr, skp_b, skp_o, skp_h, vp_ptr, svp_b, svp_o, svp_h, BLOCK_SIZE, W, T, NBT,
                    K_STAGE, V_STAGE, KPT,
                )  # fmt: skip
            kn_next, vn_next, sv_next = _tile_norms(
                t0 + STEP, end, h, bid, k_tok, kn_ptr, skn_b, skn_o, skn_h, vn_ptr, svn_b, svn_o, svn_h,
                BLOCK_SIZE, SCORE_ROWS, W, T, NBT,
            )  # fmt: skip
            bid = _tile_blocks(t0 + 2 * STEP, end, b_tok, bt_row, sbt_m, max_blocks, BS_SHIFT)

            k_hat = _k_operand(kwords, probe, W, T, K_MODE, K_ASM, D)
            k_op = gl.convert_layout(k_hat, OPA, assert_trivial=True)
            qk = mma_v2(k_op, q, gl.zeros([W, T, 8], gl.float32, MMA))
            if K_MODE == 9:
                qk = qk + gl.expand_dims(q_half, 1)
            qk = gl.where(gl.expand_dims(sv, 2), qk * gl.expand_dims(kn, 2), float("-inf"))
            m_new = gl.maximum(m_i, gl.max(qk, axis=1))
            m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = gl.exp2(m_i - m_use)
            p = gl.exp2(qk - gl.expand_dims(m_use, 1))
            l_i = l_i * alpha + gl.sum(p, axis=1)
            pw = gl.where(gl.expand_dims(sv, 2), p * gl.expand_dims(vn, 2), 0.0)
            p_op = gl.convert_layout(_p_operand(pw, W, T), OPB, assert_trivial=True)
            v_hat = _v_operand(vwords, probe, W, T, V_MODE, V_ASM, D)
            v_op = gl.convert_layout(v_hat, OPA, assert_trivial=True)
            acc = mma_v2(v_op, p_op, acc * gl.expand_dims(alpha, 1))
            m_i = m_new
            kn, vn, sv = kn_next, vn_next, sv_next

        has = l_i > 0
        inv = 1.0 / gl.where(has, l_i, 1.0)
        lse_w = gl.where(has, m_i + gl.log2(gl.where(has, l_i, 1.0)), float("-inf"))
        if COMBINE:  # the item's one partial
            lse, out = combine_warps(buf, lse_w, acc * gl.expand_dims(inv, 1), threads, W, D, SMEM, TMA)
            part = (b * Hq + h * G + o_n).to(gl.int64) * P + s  # [1, 8]
            gl.store(pl_ptr + part, lse, mask=o_n < G)
            gl.store(po_ptr + part * D + _v_phys(o_r, V_MODE, D), out, mask=(o_n < G) & (o_r < D))  # [D, 8]
        else:  # each warp's own
            part = (b * Hq + h * G + m_n[None, :]).to(gl.int64) * P + s * W + m_w[:, None]  # [W, 8]
            gl.store(pl_ptr + part, lse_w, mask=n_mask[None, :])
            o_ptrs = po_ptr + gl.expand_dims(part * D, 1) + _v_phys(m_r, V_MODE, D)[None, :, None]
            gl.store(o_ptrs, acc * gl.expand_dims(inv, 1), mask=n_mask[None, None, :])
