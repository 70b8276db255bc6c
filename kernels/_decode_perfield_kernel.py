"""Triton kernel: the decode split kernel with one 2-D dot per packed field (no reshapes, no joins).

_decode_perfield_kernel, grid (B·H, S), for bit widths 2, 4 and 8 (one byte per group: PG = 8/bits fields,
NG = D·bits/8 groups, NG ≥ 16). Field k of a tile is the [TILE, NG] slice of index k of every byte; in
field-major order (see _tables.py) it is the contiguous column range k·NG … k·NG+NG−1 of the rotated
query and of the partial output. So scores are Σ_k q[:, field k] · c[field k]ᵀ and the output is PG
accumulators [GP, NG], one per field: every step from the byte load to the dot operand is elementwise,
which leaves Triton nothing to shuffle but the dot operands themselves.
Lookups with 16-bit operands (K_LUT / V_LUT): one per byte in a 256-entry table packing the byte's PG
bf16 centroids (mode 1); 4-bit centroids from register permutes (mode 2, inline PTX); for keys with a
symmetric uniform 8-bit codebook the exact integers k − 128 in float16 against the query times the step,
plus step·Σq/2 per score (mode 3, inline PTX); otherwise one codebook lookup per index (mode 0).
ROTATE_Q (16-bit queries): the split rotates its G query heads itself with tensor-core products against
Πᵀ[:, perm] split in three bf16 terms.
Writes the normalised partial output (field-major) and its base-2 log-sum-exp, like _decode_split_kernel.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._triton_common import dot16, pdl_launch_dependents, pdl_wait


@triton.jit
def _mma(a, b, acc, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    if IEEE:
        return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return dot16(a, b, acc, UPCAST)


@triton.jit
def _lookup(byte, tab_ptr, LUT: tl.constexpr):
    """Bytes [R, NG] uint8 → LUT entries (LUT 1: table gather) or int32 (LUT 0, 2)."""
    if LUT == 1:
        return tl.load(tab_ptr + byte.to(tl.int32))
    else:
        return byte.to(tl.int32)


@triton.jit
def _load_tile(
    t, end, bt_row, sbt_m, h,
    kp_ptr, skp_b, skp_o, skp_h, skp_p, kn_ptr, skn_b, skn_o, skn_h,
    vp_ptr, svp_b, svp_o, svp_h, svp_p, vn_ptr, svn_b, svn_o, svn_h,
    BLOCK_SIZE: tl.constexpr, K_NG: tl.constexpr, V_NG: tl.constexpr,
):  # fmt: skip
    """Raw packed bytes [TILE, NG] uint8 and norms [TILE] of K and V for tokens t (masked past `end`)."""
    tmask = t < end
    block = tl.load(bt_row + (t // BLOCK_SIZE) * sbt_m, mask=tmask, other=0).to(tl.int64)
    off = t % BLOCK_SIZE
    k_row = kp_ptr + block * skp_b + off * skp_o + h * skp_h
    kw = tl.load(k_row[:, None] + tl.arange(0, K_NG)[None, :] * skp_p, mask=tmask[:, None], other=0)
    kn = tl.load(kn_ptr + block * skn_b + off * skn_o + h * skn_h, mask=tmask, other=0.0)
    v_row = vp_ptr + block * svp_b + off * svp_o + h * svp_h
    vw = tl.load(v_row[:, None] + tl.arange(0, V_NG)[None, :] * svp_p, mask=tmask[:, None], other=0)
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
def _field(w, k: tl.constexpr, tab_ptr, BITS: tl.constexpr, LUT: tl.constexpr, dtype: tl.constexpr):
    """Centroids of field k [R, NG] in `dtype` from LUT entries (LUT) or byte words."""
    if LUT == 1:
        return ((w >> (16 * k)) & 0xFFFF).to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        return tl.load(tab_ptr + ((w >> (k * BITS)) & ((1 << BITS) - 1))).to(dtype)


@triton.jit
def _query_field(
    qr_ptr, q_ptr, sq_b, sq_h, rq_ptr, qk_scale, b, heads, gmask, Hq,
    k: tl.constexpr, NG: tl.constexpr, D: tl.constexpr, ROTATE_Q: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """Rotated, scaled query columns k·NG … k·NG+NG−1 (field-major) [GP, NG] in the operand dtype."""
    n = k * NG + tl.arange(0, NG)
    if ROTATE_Q:  # q (hi + lo in bf16) @ Πᵀ[:, perm] (three bf16 terms), f32 accumulation
        d = tl.arange(0, D)
        q = tl.load(q_ptr + b * sq_b + heads[:, None] * sq_h + d[None, :], mask=gmask[:, None], other=0.0)
        q = q.to(tl.float32)
        q_hi = q.to(tl.bfloat16)
        q_lo = (q - q_hi.to(tl.float32)).to(tl.bfloat16)
        r_ptrs = rq_ptr + d[:, None] * D + n[None, :]
        r0 = tl.load(r_ptrs)
        acc = dot16(q_hi, r0, tl.zeros([q.shape[0], NG], dtype=tl.float32), UPCAST)
        acc = dot16(q_lo, r0, acc, UPCAST)
        acc = dot16(q_hi, tl.load(r_ptrs + D * D), acc, UPCAST)
        acc = dot16(q_hi, tl.load(r_ptrs + 2 * D * D), acc, UPCAST)
        return (acc * qk_scale).to(qr_ptr.dtype.element_ty)
    else:
        rows = (b * Hq + heads).to(tl.int64) * D
        return tl.load(qr_ptr + rows[:, None] + n[None, :], mask=gmask[:, None], other=0.0)


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
    K_BITS: tl.constexpr, K_PG: tl.constexpr, K_NG: tl.constexpr, K_LUT: tl.constexpr, K_ASM: tl.constexpr,
    V_BITS: tl.constexpr, V_PG: tl.constexpr, V_NG: tl.constexpr, V_LUT: tl.constexpr, V_ASM: tl.constexpr,
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
    q0 = _query_field(
        qr_ptr, q_ptr, sq_b, sq_h, rq_ptr, qk_scale, b, heads, gmask, Hq, 0, K_NG, D, ROTATE_Q, UPCAST
    )
    q1 = q0
    q2 = q0
    q3 = q0
    if K_PG > 1:
        q1 = _query_field(
            qr_ptr, q_ptr, sq_b, sq_h, rq_ptr, qk_scale, b, heads, gmask, Hq, 1, K_NG, D, ROTATE_Q, UPCAST
        )
    if K_PG > 2:
        q2 = _query_field(
            qr_ptr, q_ptr, sq_b, sq_h, rq_ptr, qk_scale, b, heads, gmask, Hq, 2, K_NG, D, ROTATE_Q, UPCAST
        )
        q3 = _query_field(
            qr_ptr, q_ptr, sq_b, sq_h, rq_ptr, qk_scale, b, heads, gmask, Hq, 3, K_NG, D, ROTATE_Q, UPCAST
        )
    cdt = q0.dtype
    if K_LUT == 3:  # uniform 8-bit keys: float16 query scaled by the codebook step, and the score offset
        q_step = (q0.to(tl.float32) * k_step).to(tl.float16)
        q_half_sum = 0.5 * tl.sum(q_step.to(tl.float32), axis=1)
    m_i = tl.full([GP], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GP], dtype=tl.float32)
    acc0 = tl.zeros([GP, V_NG], dtype=tl.float32)
    acc1 = tl.zeros([GP, V_NG], dtype=tl.float32)
    acc2 = tl.zeros([GP, V_NG], dtype=tl.float32)
    acc3 = tl.zeros([GP, V_NG], dtype=tl.float32)
    bt_row = bt_ptr + b.to(tl.int64) * sbt_b
    ar = tl.arange(0, TILE)
    for t0 in range(start, end, TILE):
        tmask = (t0 + ar) < end
        kw_c, kn_c, vw_c, vn_c = _load_tile(
            t0 + ar, end, bt_row, sbt_m, h,
            kp_ptr, skp_b, skp_o, skp_h, skp_p, kn_ptr, skn_b, skn_o, skn_h,
            vp_ptr, svp_b, svp_o, svp_h, svp_p, vn_ptr, svn_b, svn_o, svn_h,
            BLOCK_SIZE, K_NG, V_NG,
        )  # fmt: skip
        if K_LUT == 2:
            k0, k1 = _prmt_fields(kw_c, K_ASM)
            qk = _mma(q0, tl.trans(k0), tl.zeros([GP, TILE], dtype=tl.float32), IEEE, UPCAST)
            qk = _mma(q1, tl.trans(k1), qk, IEEE, UPCAST)
        elif K_LUT == 3:  # Σ q·c[k] = Σ (step·q)·(k − 128) + Σ (step·q)/2
            qk = tl.dot(q_step, tl.trans(_uniform_field(kw_c, K_ASM)), tl.zeros([GP, TILE], dtype=tl.float32))
            qk += q_half_sum[:, None]
        else:
            kl = _lookup(kw_c, ktab_ptr, K_LUT)
            qk = _mma(q0, tl.trans(_field(kl, 0, ktab_ptr, K_BITS, K_LUT, cdt)),
                      tl.zeros([GP, TILE], dtype=tl.float32), IEEE, UPCAST)  # fmt: skip
            if K_PG > 1:
                qk = _mma(q1, tl.trans(_field(kl, 1, ktab_ptr, K_BITS, K_LUT, cdt)), qk, IEEE, UPCAST)
            if K_PG > 2:
                qk = _mma(q2, tl.trans(_field(kl, 2, ktab_ptr, K_BITS, K_LUT, cdt)), qk, IEEE, UPCAST)
                qk = _mma(q3, tl.trans(_field(kl, 3, ktab_ptr, K_BITS, K_LUT, cdt)), qk, IEEE, UPCAST)
        qk = tl.where(tmask[None, :], qk * kn_c[None, :], float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        pv = (p * vn_c[None, :]).to(cdt)
        if V_LUT == 2:
            v0, v1 = _prmt_fields(vw_c, V_ASM)
            acc0 = _mma(pv, v0, acc0 * alpha[:, None], IEEE, UPCAST)
            acc1 = _mma(pv, v1, acc1 * alpha[:, None], IEEE, UPCAST)

        else:
            vl = _lookup(vw_c, vtab_ptr, V_LUT)
            acc0 = _mma(pv, _field(vl, 0, vtab_ptr, V_BITS, V_LUT, cdt), acc0 * alpha[:, None], IEEE, UPCAST)
            if V_PG > 1:
                acc1 = _mma(
                    pv, _field(vl, 1, vtab_ptr, V_BITS, V_LUT, cdt), acc1 * alpha[:, None], IEEE, UPCAST
                )
            if V_PG > 2:
                acc2 = _mma(
                    pv, _field(vl, 2, vtab_ptr, V_BITS, V_LUT, cdt), acc2 * alpha[:, None], IEEE, UPCAST
                )
                acc3 = _mma(
                    pv, _field(vl, 3, vtab_ptr, V_BITS, V_LUT, cdt), acc3 * alpha[:, None], IEEE, UPCAST
                )
        m_i = m_new
    pdl_launch_dependents(PDL)  # the merge may launch; it waits for these partials
    has = l_i > 0
    inv = 1.0 / tl.where(has, l_i, 1.0)
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    row = (b * Hq + heads).to(tl.int64) * S + s
    out_ptrs = po_ptr + row[:, None] * D + tl.arange(0, V_NG)[None, :]
    tl.store(out_ptrs, acc0 * inv[:, None], mask=gmask[:, None])
    if V_PG > 1:
        tl.store(out_ptrs + V_NG, acc1 * inv[:, None], mask=gmask[:, None])
    if V_PG > 2:
        tl.store(out_ptrs + 2 * V_NG, acc2 * inv[:, None], mask=gmask[:, None])
        tl.store(out_ptrs + 3 * V_NG, acc3 * inv[:, None], mask=gmask[:, None])
    tl.store(pl_ptr + row, lse, mask=gmask)
