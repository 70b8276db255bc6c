"""Triton kernel: the decode split kernel with one 2-D dot per packed field, for every bit width 1–8.

_decode_perfield_kernel, grid (B·H, S). A packed row is NG groups of PG indices in BPG bytes (packing.py:
1 → 8 per byte, 2 → 4, 4 → 2, 8 → 1; 3, 5, 7 → 8 in BPG = bits bytes; 6 → 4 in 3 bytes). Field k of a tile
is the [TILE, NG] slice of index k of every group; in field-major order (see _tables.py) it is the
contiguous column range k·NG … k·NG+NG−1 of the rotated query and of the partial output. So scores are
Σ_k q[:, field k] · c[field k]ᵀ and the output is PG accumulators [GP, NG], one per field: every step from
the load to the dot operand is elementwise, which leaves Triton nothing to shuffle but the dot operands.
A field narrower than 16 columns (head_dim 64 at PG = 8) is padded to NGP = 16 with zero query columns.
Groups of one byte are loaded as bytes; wider groups as one word (int32, or int64 for 5 and 7 bytes).
Lookups with 16-bit operands (K_LUT / V_LUT): one per byte in a 256-entry table packing the byte's PG
bf16 centroids (mode 1, widths 2 and 4); 4-bit centroids from register permutes (mode 2, inline PTX); for
keys with a symmetric uniform 8-bit codebook the exact integers k − 128 in float16 against the query times
the step, plus step·Σq/2 per score (mode 3, inline PTX); otherwise one codebook lookup per index (mode 0).
ROTATE_Q (16-bit queries): the split rotates its G query heads itself with tensor-core products against
Πᵀ[:, perm] split in three bf16 terms.
Writes the normalised partial output (field-major) and its base-2 log-sum-exp; _decode_merge_kernel merges.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._triton_common import dot16, load_packed_words, pdl_launch_dependents, pdl_wait


@triton.jit
def _mma(a, b, acc, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    if IEEE:
        return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return dot16(a, b, acc, UPCAST)


@triton.jit
def _load_tile(
    t, end, bt_row, sbt_m, h,
    kp_ptr, skp_b, skp_o, skp_h, skp_p, kn_ptr, skn_b, skn_o, skn_h,
    vp_ptr, svp_b, svp_o, svp_h, svp_p, vn_ptr, svn_b, svn_o, svn_h,
    BLOCK_SIZE: tl.constexpr, K_BPG: tl.constexpr, K_NG: tl.constexpr, K_NGP: tl.constexpr,
    V_BPG: tl.constexpr, V_NG: tl.constexpr, V_NGP: tl.constexpr,
):  # fmt: skip
    """Packed groups [TILE, NGP] and norms [TILE] of K and V for tokens t (masked past `end`)."""
    tmask = t < end
    block = tl.load(bt_row + (t // BLOCK_SIZE) * sbt_m, mask=tmask, other=0).to(tl.int64)
    off = t % BLOCK_SIZE
    kw = load_packed_words(kp_ptr + block * skp_b + off * skp_o + h * skp_h, tmask, skp_p, K_BPG, K_NG, K_NGP)
    kn = tl.load(kn_ptr + block * skn_b + off * skn_o + h * skn_h, mask=tmask, other=0.0)
    vw = load_packed_words(vp_ptr + block * svp_b + off * svp_o + h * svp_h, tmask, svp_p, V_BPG, V_NG, V_NGP)
    vn = tl.load(vn_ptr + block * svn_b + off * svn_o + h * svn_h, mask=tmask, other=0.0)
    return kw, kn, vw, vn


@triton.jit
def _prmt_fields(byte, ASM: tl.constexpr):
    """4-bit bytes [R, NG] uint8 → bf16 centroids of the low and high nibbles, by register permutes."""
    return tl.inline_asm_elementwise(
        ASM, "=r,=r,=r,=r,r", [byte], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4
    )


@triton.jit
def _uniform_field(byte, ASM: tl.constexpr):
    """8-bit indices [R, NG] uint8 → k − 128 as float16 (exact), by register permutes (UNIFORM8_ASM)."""
    return tl.inline_asm_elementwise(ASM, "=r,=r,r", [byte], dtype=tl.float16, is_pure=True, pack=4)


@triton.jit
def _lookup(word, tab_ptr, LUT: tl.constexpr):
    """Groups [R, NGP] → LUT entries (LUT 1: one table gather per byte) or the groups as they are."""
    if LUT == 1:
        return tl.load(tab_ptr + word.to(tl.int32))
    else:
        return word


@triton.jit
def _field(w, k: tl.constexpr, tab_ptr, BITS: tl.constexpr, LUT: tl.constexpr, dtype: tl.constexpr):
    """Centroids of field k [R, NGP] in `dtype` from LUT entries (LUT 1) or groups (one codebook lookup)."""
    if LUT == 1:
        return ((w >> (16 * k)) & 0xFFFF).to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        return tl.load(tab_ptr + ((w >> (k * BITS)) & ((1 << BITS) - 1)).to(tl.int32)).to(dtype)


@triton.jit
def _score(qk, q, w, k: tl.constexpr, tab_ptr, BITS: tl.constexpr, LUT: tl.constexpr, IEEE: tl.constexpr,
           UPCAST: tl.constexpr):  # fmt: skip
    """qk [GP, TILE] + q [GP, NGP] · (field k's centroids)ᵀ."""
    return _mma(q, tl.trans(_field(w, k, tab_ptr, BITS, LUT, q.dtype)), qk, IEEE, UPCAST)


@triton.jit
def _accumulate(acc, alpha, pv, w, k: tl.constexpr, tab_ptr, BITS: tl.constexpr, LUT: tl.constexpr,
                IEEE: tl.constexpr, UPCAST: tl.constexpr):  # fmt: skip
    """acc [GP, NGP] · alpha + pv [GP, TILE] · field k's centroids [TILE, NGP]."""
    return _mma(pv, _field(w, k, tab_ptr, BITS, LUT, pv.dtype), acc * alpha[:, None], IEEE, UPCAST)


@triton.jit
def _query_field(
    qr_ptr, q_ptr, sq_b, sq_h, rq_ptr, qk_scale, b, heads, gmask, Hq,
    k: tl.constexpr, NG: tl.constexpr, NGP: tl.constexpr, D: tl.constexpr, ROTATE_Q: tl.constexpr,
    UPCAST: tl.constexpr,
):  # fmt: skip
    """Rotated, scaled query columns k·NG … k·NG+NG−1 (field-major) [GP, NGP] in the operand dtype, zero
    past NG."""
    j = tl.arange(0, NGP)
    n = k * NG + j
    inside = j < NG
    if ROTATE_Q:  # q (hi + lo in bf16) @ Πᵀ[:, perm] (three bf16 terms), f32 accumulation
        d = tl.arange(0, D)
        q = tl.load(q_ptr + b * sq_b + heads[:, None] * sq_h + d[None, :], mask=gmask[:, None], other=0.0)
        q = q.to(tl.float32)
        q_hi = q.to(tl.bfloat16)
        q_lo = (q - q_hi.to(tl.float32)).to(tl.bfloat16)
        r_ptrs = rq_ptr + d[:, None] * D + n[None, :]
        r_mask = inside[None, :]
        r0 = tl.load(r_ptrs, mask=r_mask, other=0.0)
        acc = dot16(q_hi, r0, tl.zeros([q.shape[0], NGP], dtype=tl.float32), UPCAST)
        acc = dot16(q_lo, r0, acc, UPCAST)
        acc = dot16(q_hi, tl.load(r_ptrs + D * D, mask=r_mask, other=0.0), acc, UPCAST)
        acc = dot16(q_hi, tl.load(r_ptrs + 2 * D * D, mask=r_mask, other=0.0), acc, UPCAST)
        return (acc * qk_scale).to(qr_ptr.dtype.element_ty)
    else:
        rows = (b * Hq + heads).to(tl.int64) * D
        return tl.load(qr_ptr + rows[:, None] + n[None, :], mask=gmask[:, None] & inside[None, :], other=0.0)


@triton.jit
def _store_field(out_ptrs, acc, inv, gmask, k: tl.constexpr, NG: tl.constexpr, NGP: tl.constexpr):
    inside = tl.arange(0, NGP) < NG
    tl.store(out_ptrs + k * NG, acc * inv[:, None], mask=gmask[:, None] & inside[None, :])


@triton.jit
def _decode_perfield_kernel(
    qr_ptr,  # rotated, scaled query [B, Hq, D] field-major, operand dtype (contiguous), unless ROTATE_Q
    q_ptr, sq_b, sq_h, rq_ptr, qk_scale,  # ROTATE_Q: raw query [B, Hq, D], Πᵀ[:, perm] as [3, D, D] bf16
    kp_ptr, skp_b, skp_o, skp_h, skp_p, kn_ptr, skn_b, skn_o, skn_h,
    vp_ptr, svp_b, svp_o, svp_h, svp_p, vn_ptr, svn_b, svn_o, svn_h,
    ktab_ptr, vtab_ptr,  # byte LUTs (K_LUT / V_LUT) or codebooks in the operand dtype
    bt_ptr, sbt_b, sbt_m, ctx_ptr,  # block_tables [B, M], context_lens [B]
    po_ptr, pl_ptr,  # partial out [B, Hq, S, D] f32 (field-major), partial lse [B, Hq, S] f32 (S ≥ splits)
    H, Hq, G, S, split_tokens,
    BLOCK_SIZE: tl.constexpr, D: tl.constexpr, GP: tl.constexpr, TILE: tl.constexpr,
    IEEE: tl.constexpr, UPCAST: tl.constexpr, ROTATE_Q: tl.constexpr,
    K_BITS: tl.constexpr, K_PG: tl.constexpr, K_BPG: tl.constexpr, K_NG: tl.constexpr, K_NGP: tl.constexpr,
    K_LUT: tl.constexpr, K_ASM: tl.constexpr,
    V_BITS: tl.constexpr, V_PG: tl.constexpr, V_BPG: tl.constexpr, V_NG: tl.constexpr, V_NGP: tl.constexpr,
    V_LUT: tl.constexpr, V_ASM: tl.constexpr,
    PDL: tl.constexpr = False, k_step=1.0,  # k_step: the key codebook step (K_LUT 3)
):  # fmt: skip
    b = tl.program_id(0) // H
    h = tl.program_id(0) % H
    s = tl.program_id(1)
    pdl_wait(PDL)  # every input may come from the previous kernel (the rotated query does)
    ctx = tl.load(ctx_ptr + b)
    start = s * split_tokens
    end = tl.minimum(start + split_tokens, ctx)
    g = tl.arange(0, GP)
    gmask = g < G
    heads = h * G + g
    q0 = _query_field(qr_ptr, q_ptr, sq_b, sq_h, rq_ptr, qk_scale, b, heads, gmask, Hq, 0, K_NG, K_NGP, D,
                      ROTATE_Q, UPCAST)  # fmt: skip
    q1 = q0
    q2 = q0
    q3 = q0
    q4 = q0
    q5 = q0
    q6 = q0
    q7 = q0
    if K_PG > 1:
        q1 = _query_field(qr_ptr, q_ptr, sq_b, sq_h, rq_ptr, qk_scale, b, heads, gmask, Hq, 1, K_NG, K_NGP,
                          D, ROTATE_Q, UPCAST)  # fmt: skip
    if K_PG > 2:
        q2 = _query_field(qr_ptr, q_ptr, sq_b, sq_h, rq_ptr, qk_scale, b, heads, gmask, Hq, 2, K_NG, K_NGP,
                          D, ROTATE_Q, UPCAST)  # fmt: skip
        q3 = _query_field(qr_ptr, q_ptr, sq_b, sq_h, rq_ptr, qk_scale, b, heads, gmask, Hq, 3, K_NG, K_NGP,
                          D, ROTATE_Q, UPCAST)  # fmt: skip
    if K_PG > 4:
        q4 = _query_field(qr_ptr, q_ptr, sq_b, sq_h, rq_ptr, qk_scale, b, heads, gmask, Hq, 4, K_NG, K_NGP,
                          D, ROTATE_Q, UPCAST)  # fmt: skip
        q5 = _query_field(qr_ptr, q_ptr, sq_b, sq_h, rq_ptr, qk_scale, b, heads, gmask, Hq, 5, K_NG, K_NGP,
                          D, ROTATE_Q, UPCAST)  # fmt: skip
        q6 = _query_field(qr_ptr, q_ptr, sq_b, sq_h, rq_ptr, qk_scale, b, heads, gmask, Hq, 6, K_NG, K_NGP,
                          D, ROTATE_Q, UPCAST)  # fmt: skip
        q7 = _query_field(qr_ptr, q_ptr, sq_b, sq_h, rq_ptr, qk_scale, b, heads, gmask, Hq, 7, K_NG, K_NGP,
                          D, ROTATE_Q, UPCAST)  # fmt: skip
    if K_LUT == 3:  # uniform 8-bit keys: float16 query scaled by the codebook step, and the score offset
        q_step = (q0.to(tl.float32) * k_step).to(tl.float16)
        q_half_sum = 0.5 * tl.sum(q_step.to(tl.float32), axis=1)
    m_i = tl.full([GP], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GP], dtype=tl.float32)
    acc0 = tl.zeros([GP, V_NGP], dtype=tl.float32)
    acc1 = acc0
    acc2 = acc0
    acc3 = acc0
    acc4 = acc0
    acc5 = acc0
    acc6 = acc0
    acc7 = acc0
    bt_row = bt_ptr + b.to(tl.int64) * sbt_b
    ar = tl.arange(0, TILE)
    for t0 in range(start, end, TILE):
        tmask = (t0 + ar) < end
        kw_c, kn_c, vw_c, vn_c = _load_tile(
            t0 + ar, end, bt_row, sbt_m, h,
            kp_ptr, skp_b, skp_o, skp_h, skp_p, kn_ptr, skn_b, skn_o, skn_h,
            vp_ptr, svp_b, svp_o, svp_h, svp_p, vn_ptr, svn_b, svn_o, svn_h,
            BLOCK_SIZE, K_BPG, K_NG, K_NGP, V_BPG, V_NG, V_NGP,
        )  # fmt: skip
        qk = tl.zeros([GP, TILE], dtype=tl.float32)
        if K_LUT == 2:
            k0, k1 = _prmt_fields(kw_c, K_ASM)
            qk = _mma(q0, tl.trans(k0), qk, IEEE, UPCAST)
            qk = _mma(q1, tl.trans(k1), qk, IEEE, UPCAST)
        elif K_LUT == 3:  # Σ q·c[k] = Σ (step·q)·(k − 128) + Σ (step·q)/2
            qk = tl.dot(q_step, tl.trans(_uniform_field(kw_c, K_ASM)), qk)
            qk += q_half_sum[:, None]
        else:
            kl = _lookup(kw_c, ktab_ptr, K_LUT)
            qk = _score(qk, q0, kl, 0, ktab_ptr, K_BITS, K_LUT, IEEE, UPCAST)
            if K_PG > 1:
                qk = _score(qk, q1, kl, 1, ktab_ptr, K_BITS, K_LUT, IEEE, UPCAST)
            if K_PG > 2:
                qk = _score(qk, q2, kl, 2, ktab_ptr, K_BITS, K_LUT, IEEE, UPCAST)
                qk = _score(qk, q3, kl, 3, ktab_ptr, K_BITS, K_LUT, IEEE, UPCAST)
            if K_PG > 4:
                qk = _score(qk, q4, kl, 4, ktab_ptr, K_BITS, K_LUT, IEEE, UPCAST)
                qk = _score(qk, q5, kl, 5, ktab_ptr, K_BITS, K_LUT, IEEE, UPCAST)
                qk = _score(qk, q6, kl, 6, ktab_ptr, K_BITS, K_LUT, IEEE, UPCAST)
                qk = _score(qk, q7, kl, 7, ktab_ptr, K_BITS, K_LUT, IEEE, UPCAST)
        qk = tl.where(tmask[None, :], qk * kn_c[None, :], float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        pv = (p * vn_c[None, :]).to(q0.dtype)
        if V_LUT == 2:
            v0, v1 = _prmt_fields(vw_c, V_ASM)
            acc0 = _mma(pv, v0, acc0 * alpha[:, None], IEEE, UPCAST)
            acc1 = _mma(pv, v1, acc1 * alpha[:, None], IEEE, UPCAST)
        else:
            vl = _lookup(vw_c, vtab_ptr, V_LUT)
            acc0 = _accumulate(acc0, alpha, pv, vl, 0, vtab_ptr, V_BITS, V_LUT, IEEE, UPCAST)
            if V_PG > 1:
                acc1 = _accumulate(acc1, alpha, pv, vl, 1, vtab_ptr, V_BITS, V_LUT, IEEE, UPCAST)
            if V_PG > 2:
                acc2 = _accumulate(acc2, alpha, pv, vl, 2, vtab_ptr, V_BITS, V_LUT, IEEE, UPCAST)
                acc3 = _accumulate(acc3, alpha, pv, vl, 3, vtab_ptr, V_BITS, V_LUT, IEEE, UPCAST)
            if V_PG > 4:
                acc4 = _accumulate(acc4, alpha, pv, vl, 4, vtab_ptr, V_BITS, V_LUT, IEEE, UPCAST)
                acc5 = _accumulate(acc5, alpha, pv, vl, 5, vtab_ptr, V_BITS, V_LUT, IEEE, UPCAST)
                acc6 = _accumulate(acc6, alpha, pv, vl, 6, vtab_ptr, V_BITS, V_LUT, IEEE, UPCAST)
                acc7 = _accumulate(acc7, alpha, pv, vl, 7, vtab_ptr, V_BITS, V_LUT, IEEE, UPCAST)
        m_i = m_new
    pdl_launch_dependents(PDL)  # the merge may launch; it waits for these partials
    has = l_i > 0
    inv = 1.0 / tl.where(has, l_i, 1.0)
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    row = (b * Hq + heads).to(tl.int64) * S + s
    out_ptrs = po_ptr + row[:, None] * D + tl.arange(0, V_NGP)[None, :]
    _store_field(out_ptrs, acc0, inv, gmask, 0, V_NG, V_NGP)
    if V_PG > 1:
        _store_field(out_ptrs, acc1, inv, gmask, 1, V_NG, V_NGP)
    if V_PG > 2:
        _store_field(out_ptrs, acc2, inv, gmask, 2, V_NG, V_NGP)
        _store_field(out_ptrs, acc3, inv, gmask, 3, V_NG, V_NGP)
    if V_PG > 4:
        _store_field(out_ptrs, acc4, inv, gmask, 4, V_NG, V_NGP)
        _store_field(out_ptrs, acc5, inv, gmask, 5, V_NG, V_NGP)
        _store_field(out_ptrs, acc6, inv, gmask, 6, V_NG, V_NGP)
        _store_field(out_ptrs, acc7, inv, gmask, 7, V_NG, V_NGP)
    tl.store(pl_ptr + row, lse, mask=gmask)
