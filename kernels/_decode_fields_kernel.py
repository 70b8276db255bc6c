"""Triton kernel: the decode split kernel in field-major form (batched per-field dots, no reshapes).

A packed row is NG groups of PG indices; field k of every group forms a [TILE, NG] slice. The K and V tiles
are kept as [PG, TILE, NGP] (NGP = NG padded to ≥ 16 for the tensor cores) and scored / accumulated with
batched dots against the query and output in the same field-major order, so no register tensor is ever
reshaped. The launcher rotates the query with Πᵀ[:, perm] and the merge kernel rotates back with Π[perm, :].
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._triton_common import dot16


@triton.jit
def _load_words(row_ptrs, row_mask, byte_stride, BPG: tl.constexpr, NG: tl.constexpr, NGP: tl.constexpr):
    """Group words [R, NGP] int32 (groups ≥ NG read as 0)."""
    g = tl.arange(0, NGP)
    ptrs = row_ptrs[:, None] + (g * BPG)[None, :] * byte_stride
    mask = row_mask[:, None] & (g < NG)[None, :]
    word = tl.load(ptrs, mask=mask, other=0).to(tl.int32)
    for m in tl.static_range(1, BPG):
        word = word | (tl.load(ptrs + m * byte_stride, mask=mask, other=0).to(tl.int32) << (8 * m))
    return word


@triton.jit
def _dequant_fields(word, tab_ptr, BITS: tl.constexpr, PG: tl.constexpr, LUT: tl.constexpr):
    """Group words [R, NGP] → centroids [PG, R, NGP]; out[k, r, g] = c[index g·PG + k of row r].

    LUT (2- and 4-bit, bf16): one lookup per byte in a table packing the byte's PG bf16 centroids."""
    k = tl.arange(0, PG)
    if LUT:
        w = tl.load(tab_ptr + word)
        bits = (w[None, :, :] >> (16 * k)[:, None, None]) & 0xFFFF
        out = bits.to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        idx = (word[None, :, :] >> (BITS * k)[:, None, None]) & ((1 << BITS) - 1)
        out = tl.load(tab_ptr + idx)
    return out


@triton.jit
def _load_tile_words(
    t, end, bt_row, sbt_m, h,
    kp_ptr, skp_b, skp_o, skp_h, skp_p, kn_ptr, skn_b, skn_o, skn_h,
    vp_ptr, svp_b, svp_o, svp_h, svp_p, vn_ptr, svn_b, svn_o, svn_h,
    BLOCK_SIZE: tl.constexpr,
    K_BPG: tl.constexpr, K_NG: tl.constexpr, K_NGP: tl.constexpr,
    V_BPG: tl.constexpr, V_NG: tl.constexpr, V_NGP: tl.constexpr,
):  # fmt: skip
    tmask = t < end
    block = tl.load(bt_row + (t // BLOCK_SIZE) * sbt_m, mask=tmask, other=0).to(tl.int64)
    off = t % BLOCK_SIZE
    kw = _load_words(kp_ptr + block * skp_b + off * skp_o + h * skp_h, tmask, skp_p, K_BPG, K_NG, K_NGP)
    kn = tl.load(kn_ptr + block * skn_b + off * skn_o + h * skn_h, mask=tmask, other=0.0)
    vw = _load_words(vp_ptr + block * svp_b + off * svp_o + h * svp_h, tmask, svp_p, V_BPG, V_NG, V_NGP)
    vn = tl.load(vn_ptr + block * svn_b + off * svn_o + h * svn_h, mask=tmask, other=0.0)
    return kw, kn, vw, vn


@triton.jit
def _decode_fields_kernel(
    qr_ptr,  # rotated, scaled query [B, Hq, D] field-major, operand dtype (contiguous)
    kp_ptr, skp_b, skp_o, skp_h, skp_p, kn_ptr, skn_b, skn_o, skn_h,
    vp_ptr, svp_b, svp_o, svp_h, svp_p, vn_ptr, svn_b, svn_o, svn_h,
    ktab_ptr, vtab_ptr,  # byte LUTs (K_LUT / V_LUT) or codebooks in the operand dtype
    bt_ptr, sbt_b, sbt_m, ctx_ptr,  # block_tables [B, M], context_lens [B]
    po_ptr, pl_ptr,  # partial out [B, Hq, S, D] f32 (field-major), partial lse [B, Hq, S] f32
    H, Hq, G, S, split_tokens,
    BLOCK_SIZE: tl.constexpr, D: tl.constexpr, GP: tl.constexpr, TILE: tl.constexpr,
    IEEE: tl.constexpr, UPCAST: tl.constexpr,
    K_BITS: tl.constexpr, K_PG: tl.constexpr, K_BPG: tl.constexpr, K_NG: tl.constexpr, K_NGP: tl.constexpr,
    K_LUT: tl.constexpr,
    V_BITS: tl.constexpr, V_PG: tl.constexpr, V_BPG: tl.constexpr, V_NG: tl.constexpr, V_NGP: tl.constexpr,
    V_LUT: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0) // H
    h = tl.program_id(0) % H
    s = tl.program_id(1)
    ctx = tl.load(ctx_ptr + b)
    start = s * split_tokens
    end = tl.minimum(start + split_tokens, ctx)
    g = tl.arange(0, GP)
    gmask = g < G
    rows = (b * Hq + h * G + g).to(tl.int64)
    # q3[k, g, n] = q_perm[g, k·NG + n]
    kf = tl.arange(0, K_PG)[:, None, None]
    kn_ = tl.arange(0, K_NGP)[None, None, :]
    q_ptrs = qr_ptr + rows[None, :, None] * D + kf * K_NG + kn_
    q3 = tl.load(q_ptrs, mask=gmask[None, :, None] & (kn_ < K_NG), other=0.0)
    m_i = tl.full([GP], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GP], dtype=tl.float32)
    acc = tl.zeros([V_PG, GP, V_NGP], dtype=tl.float32)
    bt_row = bt_ptr + b.to(tl.int64) * sbt_b
    ar = tl.arange(0, TILE)
    kw, kn, vw, vn = _load_tile_words(
        start + ar, end, bt_row, sbt_m, h,
        kp_ptr, skp_b, skp_o, skp_h, skp_p, kn_ptr, skn_b, skn_o, skn_h,
        vp_ptr, svp_b, svp_o, svp_h, svp_p, vn_ptr, svn_b, svn_o, svn_h,
        BLOCK_SIZE, K_BPG, K_NG, K_NGP, V_BPG, V_NG, V_NGP,
    )  # fmt: skip
    for t0 in range(start, end, TILE):
        tmask = (t0 + ar) < end
        kw_c, kn_c, vw_c, vn_c = kw, kn, vw, vn
        # the next tile's bytes are in flight while this one is computed
        kw, kn, vw, vn = _load_tile_words(
            t0 + TILE + ar, end, bt_row, sbt_m, h,
            kp_ptr, skp_b, skp_o, skp_h, skp_p, kn_ptr, skn_b, skn_o, skn_h,
            vp_ptr, svp_b, svp_o, svp_h, svp_p, vn_ptr, svn_b, svn_o, svn_h,
            BLOCK_SIZE, K_BPG, K_NG, K_NGP, V_BPG, V_NG, V_NGP,
        )  # fmt: skip
        k3 = tl.permute(_dequant_fields(kw_c, ktab_ptr, K_BITS, K_PG, K_LUT).to(q3.dtype), (0, 2, 1))
        if IEEE:
            s3 = tl.dot(q3, k3, input_precision="ieee")
        else:
            s3 = dot16(q3, k3, tl.zeros([K_PG, GP, TILE], dtype=tl.float32), UPCAST)
        qk = tl.sum(s3, axis=0)
        qk = tl.where(tmask[None, :], qk * kn_c[None, :], float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v3 = _dequant_fields(vw_c, vtab_ptr, V_BITS, V_PG, V_LUT).to(q3.dtype)
        pv = tl.broadcast_to(((p * vn_c[None, :]).to(q3.dtype))[None, :, :], [V_PG, GP, TILE])
        acc = acc * alpha[None, :, None]
        if IEEE:  # noqa: SIM108 (constexpr branch)
            acc = tl.dot(pv, v3, acc, input_precision="ieee")
        else:
            acc = dot16(pv, v3, acc, UPCAST)
        m_i = m_new
    has = l_i > 0
    out = acc / tl.where(has, l_i, 1.0)[None, :, None]
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    part = rows * S + s
    vf = tl.arange(0, V_PG)[:, None, None]
    vn_ = tl.arange(0, V_NGP)[None, None, :]
    out_ptrs = po_ptr + part[None, :, None] * D + vf * V_NG + vn_
    tl.store(out_ptrs, out, mask=gmask[None, :, None] & (vn_ < V_NG))
    tl.store(pl_ptr + part, lse, mask=gmask)
