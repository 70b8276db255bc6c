"""Triton kernels: fused paged decode attention over TurboQuant K/V, in the rotated domain.

_rotate_query_kernel, grid (⌈B·Hq / BM⌉, D/DC): q·Πᵀ·scale·log2 e once per query head, BM query rows
(any sequences and heads: the rotation is one matrix) and DC output columns per program (IEEE f32, or
SPLIT16: tensor-core products of bf16 terms, for 16-bit operands), stored in the operand dtype (used when
the split kernel does not rotate its queries itself, ROTATE_Q=False).
_decode_split_kernel, grid (B·H, S): one program per (sequence, kv head, split) walks its share of the
context in tiles of TILE tokens: each K/V byte is read once for all G query heads, which form the M
dimension of the dots. Scores are γᵏ·⟨Πq, c[idx]⟩; values enter as c[idx] with γᵛ folded into the
probabilities. The raw bytes of the next tile are loaded while the current one is computed (PREFETCH).
Tiles are dequantized either in field-major order (FIELD_MAJOR: shifts, one codebook lookup per index,
[TILE, PG, NG] → [TILE, D]; the permutation is folded into the rotations) or in natural order (byte LUTs
for 2/4/8-bit, fields interleaved with joins). Writes the normalised partial output and its base-2
log-sum-exp.
The partials are merged by _decode_merge_kernel (its own module).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._triton_common import (
    dequant_natural,
    dot16,
    load_packed_words,
    pdl_launch_dependents,
    words_to_field_major,
)


@triton.jit
def _rotate_query_kernel(
    q_ptr, sq_b, sq_h,  # query [B, Hq, D] (last stride 1)
    rq_ptr,  # Πᵀ [D, D] f32, or (SPLIT16) as three bf16 terms [3, D, D]
    qr_ptr,  # out: rotated query [B, Hq, D] in the operand dtype (contiguous)
    rows, Hq, qk_scale,  # rows = B·Hq
    D: tl.constexpr, BM: tl.constexpr, DC: tl.constexpr, SPLIT16: tl.constexpr = False,
    UPCAST: tl.constexpr = False, PDL: tl.constexpr = False,
):  # fmt: skip
    pdl_launch_dependents(PDL)  # the split kernel may launch now; it waits before reading the rotated query
    r = tl.program_id(0) * BM + tl.arange(0, BM)  # this program's query rows (sequence, head)
    rmask = r < rows
    d = tl.arange(0, D)
    n = tl.program_id(1) * DC + tl.arange(0, DC)  # this program's output columns
    q_rows = (r // Hq).to(tl.int64) * sq_b + (r % Hq) * sq_h
    q = tl.load(q_ptr + q_rows[:, None] + d[None, :], mask=rmask[:, None], other=0.0)
    q = q.to(tl.float32)
    r_ptrs = rq_ptr + d[:, None] * D + n[None, :]
    if SPLIT16:  # tensor-core products: (q_hi + q_lo) · (R0 + R1 + R2), f32 accumulation
        q_hi = q.to(tl.bfloat16)
        q_lo = (q - q_hi.to(tl.float32)).to(tl.bfloat16)
        r0 = tl.load(r_ptrs)
        acc = dot16(q_hi, r0, tl.zeros([BM, DC], dtype=tl.float32), UPCAST)
        acc = dot16(q_lo, r0, acc, UPCAST)
        acc = dot16(q_hi, tl.load(r_ptrs + D * D), acc, UPCAST)
        q = dot16(q_hi, tl.load(r_ptrs + 2 * D * D), acc, UPCAST) * qk_scale
    else:
        q = tl.dot(q, tl.load(r_ptrs), input_precision="ieee") * qk_scale
    out_rows = r.to(tl.int64) * D
    tl.store(qr_ptr + out_rows[:, None] + n[None, :], q.to(qr_ptr.dtype.element_ty), mask=rmask[:, None])


@triton.jit
def _decode_split_kernel(
    qr_ptr,  # rotated, scaled query [B, Hq, D] in the operand dtype (contiguous), unless ROTATE_Q
    q_ptr, sq_b, sq_h, rq_ptr, qk_scale,  # ROTATE_Q: raw query [B, Hq, D] and Πᵀ[:, perm] [D, D] f32
    kp_ptr, skp_b, skp_o, skp_h, skp_p, kn_ptr, skn_b, skn_o, skn_h,
    vp_ptr, svp_b, svp_o, svp_h, svp_p, vn_ptr, svn_b, svn_o, svn_h,
    ktab_ptr, vtab_ptr,  # byte LUTs (K_LUT / V_LUT) or codebooks in the operand dtype
    bt_ptr, sbt_b, sbt_m, ctx_ptr,  # block_tables [B, M], context_lens [B]
    po_ptr, pl_ptr,  # partial out [B, Hq, S, D] f32, partial lse [B, Hq, S] f32 (S: room per row ≥ splits)
    H, Hq, G, S, split_tokens,
    BLOCK_SIZE: tl.constexpr, D: tl.constexpr, GP: tl.constexpr, TILE: tl.constexpr,
    IEEE: tl.constexpr, UPCAST: tl.constexpr, PREFETCH: tl.constexpr, FIELD_MAJOR: tl.constexpr,
    ROTATE_Q: tl.constexpr,
    K_BITS: tl.constexpr, K_PG: tl.constexpr, K_BPG: tl.constexpr, K_NG: tl.constexpr, K_LUT: tl.constexpr,
    V_BITS: tl.constexpr, V_PG: tl.constexpr, V_BPG: tl.constexpr, V_NG: tl.constexpr, V_LUT: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0) // H
    h = tl.program_id(0) % H
    s = tl.program_id(1)
    ctx = tl.load(ctx_ptr + b)
    start = s * split_tokens
    end = tl.minimum(start + split_tokens, ctx)
    g = tl.arange(0, GP)
    gmask = g < G
    d = tl.arange(0, D)
    heads = h * G + g
    if ROTATE_Q:  # every split rotates its G query heads itself (saves a launch)
        q = tl.load(q_ptr + b * sq_b + heads[:, None] * sq_h + d[None, :], mask=gmask[:, None], other=0.0)
        rq = tl.load(rq_ptr + d[:, None] * D + d[None, :])
        q = tl.dot(q.to(tl.float32), rq, input_precision="ieee") * qk_scale
        q = q.to(qr_ptr.dtype.element_ty)
    else:
        q_rows = (b * Hq + heads).to(tl.int64) * D
        q = tl.load(qr_ptr + q_rows[:, None] + d[None, :], mask=gmask[:, None], other=0.0)  # [GP, D]
    m_i = tl.full([GP], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GP], dtype=tl.float32)
    acc = tl.zeros([GP, D], dtype=tl.float32)
    bt_row = bt_ptr + b.to(tl.int64) * sbt_b
    ar = tl.arange(0, TILE)
    if PREFETCH:  # raw bytes of the next tile are in flight while this one is computed
        kw, kn, vw, vn = _load_tile(
            start + ar, end, bt_row, sbt_m, h,
            kp_ptr, skp_b, skp_o, skp_h, skp_p, kn_ptr, skn_b, skn_o, skn_h,
            vp_ptr, svp_b, svp_o, svp_h, svp_p, vn_ptr, svn_b, svn_o, svn_h,
            BLOCK_SIZE, K_BPG, K_NG, V_BPG, V_NG,
        )  # fmt: skip
    for t0 in range(start, end, TILE):
        tmask = (t0 + ar) < end
        if PREFETCH:
            kw_c, kn_c, vw_c, vn_c = kw, kn, vw, vn
            kw, kn, vw, vn = _load_tile(
                t0 + TILE + ar, end, bt_row, sbt_m, h,
                kp_ptr, skp_b, skp_o, skp_h, skp_p, kn_ptr, skn_b, skn_o, skn_h,
                vp_ptr, svp_b, svp_o, svp_h, svp_p, vn_ptr, svn_b, svn_o, svn_h,
                BLOCK_SIZE, K_BPG, K_NG, V_BPG, V_NG,
            )  # fmt: skip
        else:
            kw_c, kn_c, vw_c, vn_c = _load_tile(
                t0 + ar, end, bt_row, sbt_m, h,
                kp_ptr, skp_b, skp_o, skp_h, skp_p, kn_ptr, skn_b, skn_o, skn_h,
                vp_ptr, svp_b, svp_o, svp_h, svp_p, vn_ptr, svn_b, svn_o, svn_h,
                BLOCK_SIZE, K_BPG, K_NG, V_BPG, V_NG,
            )  # fmt: skip
        if FIELD_MAJOR:  # one codebook lookup per index, reshaped [TILE, PG, NG] → [TILE, D]
            kval = tl.load(ktab_ptr + words_to_field_major(kw_c, K_BITS, K_PG, K_NG))
        else:
            kval = dequant_natural(kw_c, ktab_ptr, K_BITS, K_PG, K_LUT)
        kval = kval.to(q.dtype)  # [TILE, D]
        if IEEE:
            qk = tl.dot(q, tl.trans(kval), input_precision="ieee")
        else:
            qk = dot16(q, tl.trans(kval), tl.zeros([GP, TILE], dtype=tl.float32), UPCAST)
        qk = tl.where(tmask[None, :], qk * kn_c[None, :], float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if FIELD_MAJOR:
            vval = tl.load(vtab_ptr + words_to_field_major(vw_c, V_BITS, V_PG, V_NG))
        else:
            vval = dequant_natural(vw_c, vtab_ptr, V_BITS, V_PG, V_LUT)
        vval = vval.to(q.dtype)  # [TILE, D]
        pv = (p * vn_c[None, :]).to(q.dtype)
        acc = acc * alpha[:, None]
        if IEEE:  # noqa: SIM108 (constexpr branch)
            acc = tl.dot(pv, vval, acc, input_precision="ieee")
        else:
            acc = dot16(pv, vval, acc, UPCAST)
        m_i = m_new
    has = l_i > 0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    row = (b * Hq + heads).to(tl.int64) * S + s
    tl.store(po_ptr + row[:, None] * D + d[None, :], out, mask=gmask[:, None])
    tl.store(pl_ptr + row, lse, mask=gmask)


@triton.jit
def _load_tile(
    t, end, bt_row, sbt_m, h,
    kp_ptr, skp_b, skp_o, skp_h, skp_p, kn_ptr, skn_b, skn_o, skn_h,
    vp_ptr, svp_b, svp_o, svp_h, svp_p, vn_ptr, svn_b, svn_o, svn_h,
    BLOCK_SIZE: tl.constexpr,
    K_BPG: tl.constexpr, K_NG: tl.constexpr, V_BPG: tl.constexpr, V_NG: tl.constexpr,
):  # fmt: skip
    """Raw packed words [TILE, NG] and norms [TILE] of K and V for tokens t (masked past `end`)."""
    tmask = t < end
    block = tl.load(bt_row + (t // BLOCK_SIZE) * sbt_m, mask=tmask, other=0).to(tl.int64)
    off = t % BLOCK_SIZE
    kw = load_packed_words(kp_ptr + block * skp_b + off * skp_o + h * skp_h, tmask, skp_p, K_BPG, K_NG)
    kn = tl.load(kn_ptr + block * skn_b + off * skn_o + h * skn_h, mask=tmask, other=0.0)
    vw = load_packed_words(vp_ptr + block * svp_b + off * svp_o + h * svp_h, tmask, svp_p, V_BPG, V_NG)
    vn = tl.load(vn_ptr + block * svn_b + off * svn_o + h * svn_h, mask=tmask, other=0.0)
    return kw, kn, vw, vn
