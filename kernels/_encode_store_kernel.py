"""Triton kernel: fused TurboQuant encode + scatter into the paged VRAM tier (keys and values, one launch).

Grid (programs, 2): axis 1 picks keys (0) or values (1); each program loads its rotation once and walks
work items (layer, token tile, kv head) with a stride of the grid size. Token t's input row and destination
slot:
    GATHER=False   x[t] ([T, H, D]: strides sx_t, sx_h, sx_d), slot slot_ptr[t] (−1: skipped); one layer
    GATHER=True    x[src_ptr[t // BLOCK_SIZE], t % BLOCK_SIZE] ([NB, BS, H, D]: strides sx_b, sx_t, sx_h,
                   sx_d: one side of a paged cache), slot slot_ptr[t // BLOCK_SIZE] · BLOCK_SIZE + t % BS
                   (slot_ptr holds destination block ids): whole blocks copied from cache to tier, no
                   gathered copy in between. LAYERED: L layers, layer l's cache at x_ptr + xoff[l] · ALIGN
                   (paged_layers.py) and its packed pages at layer stride sp_l / sn_l.
Per item: rotate (16-bit inputs: tensor-core
products against the rotation split in 16-bit terms of the input's type, three for bfloat16 and two for
float16, so the products are f32-accurate; f32: IEEE dot), the norm from the rotated rows, the nearest
centroid of each coordinate, pack, store to the token's slot with the unbiased scale γ/⟨u, ŷ⟩ (codec.py).
The input rows only pass through registers on their way to shared memory.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._triton_common import centroid_at, dot16, nearest_centroid, pack_field_major


@triton.jit
def _encode_heads(
    x_ptr, xoff_ptr, sx_b, sx_t, sx_h, sx_d,  # x [T, H, D] (sx_b unused) or, GATHER, [NB, BS, H, D] per layer
    src_ptr, slot_ptr, T, H, L,  # GATHER: src_ptr [T / BS] source blocks, slot_ptr destination blocks
    p_ptr, sp_l, sp_b, sp_o, sp_h, sp_p,  # packed [L, NB, BS, H, P] uint8
    n_ptr, sn_l, sn_b, sn_o, sn_h,  # norms [L, NB, BS, H] f32
    rot_ptr,  # rotation pieces [NPIECE, D, D] (16-bit: the input's dtype; f32: one piece)
    grid_ptr, grid_scale, grid_origin, grid_last,  # the codec's nearest-centroid search (_tables.search_line)
    cb_ptr,  # codebook [2**BITS] f32
    BLOCK_SIZE: tl.constexpr, D: tl.constexpr, BT: tl.constexpr, NPIECE: tl.constexpr,
    BITS: tl.constexpr, PG: tl.constexpr, BPG: tl.constexpr, NG: tl.constexpr, UPCAST: tl.constexpr,
    GATHER: tl.constexpr, LAYERED: tl.constexpr, ALIGN: tl.constexpr,
):  # fmt: skip
    d = tl.arange(0, D)
    rot_offs = d[:, None] * D + d[None, :]
    rot0 = tl.load(rot_ptr + rot_offs)
    if NPIECE > 1:
        rot1 = tl.load(rot_ptr + D * D + rot_offs)
    if NPIECE > 2:
        rot2 = tl.load(rot_ptr + 2 * D * D + rot_offs)
    per_layer = tl.cdiv(T, BT) * H
    num_items = L * per_layer
    # The next item's input is loaded while this one is computed.
    x_next, slot_next = _load_item(
        x_ptr, xoff_ptr, sx_b, sx_t, sx_h, sx_d, src_ptr, slot_ptr, T, H, L, tl.program_id(0), D, BT,
        BLOCK_SIZE, GATHER, LAYERED, ALIGN,
    )  # fmt: skip
    for item in range(tl.program_id(0), num_items, tl.num_programs(0)):
        h = item % H
        layer = (item // per_layer).to(tl.int64)
        x, slot = x_next, slot_next
        x_next, slot_next = _load_item(
            x_ptr, xoff_ptr, sx_b, sx_t, sx_h, sx_d, src_ptr, slot_ptr, T, H, L, item + tl.num_programs(0),
            D, BT, BLOCK_SIZE, GATHER, LAYERED, ALIGN,
        )  # fmt: skip
        valid = slot >= 0
        if NPIECE == 1:
            y = tl.dot(x.to(tl.float32), rot0, input_precision="ieee")
        else:
            y = tl.zeros([BT, D], dtype=tl.float32)
            if NPIECE > 2:
                y = dot16(x, rot2, y, UPCAST)
            y = dot16(x, rot1, y, UPCAST)
            y = dot16(x, rot0, y, UPCAST)
        # ‖x‖ = ‖x·Πᵀ‖ (orthogonal); positions of u = x / max(‖x‖, tiny) on the search line, as codec.encode:
        # an underflowed norm keeps the direction, an overflowed one gives u = 0 (y itself may be ±inf then)
        norm = tl.sqrt(tl.sum(y * y, axis=1))
        safe_norm = tl.maximum(norm, 1.1754943508222875e-38)
        finite = safe_norm < float("inf")
        to_line = tl.where(finite, grid_scale / safe_norm, 0.0)
        pos = tl.where(finite[:, None], y * to_line[:, None] + grid_origin, grid_origin)
        idx = nearest_centroid(pos, grid_ptr, grid_last, not UPCAST)
        u = tl.where(finite[:, None], y / safe_norm[:, None], 0.0)
        dot = tl.sum(u * centroid_at(idx, cb_ptr, not UPCAST), axis=1)  # ⟨u, ŷ⟩: > 0 unless u = 0
        scale = tl.where(norm > 0, norm / tl.maximum(dot, 1.1754943508222875e-38), norm)
        block = slot // BLOCK_SIZE
        offset = slot % BLOCK_SIZE
        rows = p_ptr + layer * sp_l + block * sp_b + offset * sp_o + h * sp_h
        pack_field_major(idx, rows, valid, sp_p, BITS, PG, BPG, NG)
        tl.store(n_ptr + layer * sn_l + block * sn_b + offset * sn_o + h * sn_h, scale, mask=valid)


@triton.jit
def _load_item(
    x_ptr, xoff_ptr, sx_b, sx_t, sx_h, sx_d, src_ptr, slot_ptr, T, H, L, item,
    D: tl.constexpr, BT: tl.constexpr, BLOCK_SIZE: tl.constexpr, GATHER: tl.constexpr, LAYERED: tl.constexpr,
    ALIGN: tl.constexpr,
):  # fmt: skip
    """Input rows [BT, D] and slots [BT] of work item (layer item // per_layer, token tile, head item % H)."""
    per_layer = tl.cdiv(T, BT) * H
    t = ((item % per_layer) // H) * BT + tl.arange(0, BT)
    t_end = tl.where(item < L * per_layer, T, 0)  # items past the end load nothing
    inside = t < t_end
    if LAYERED:
        layer = tl.minimum(item // per_layer, L - 1)
        x_ptr += tl.load(xoff_ptr + layer) * ALIGN
    if GATHER:
        n = t // BLOCK_SIZE
        offset = t % BLOCK_SIZE
        src = tl.load(src_ptr + n, mask=inside, other=0).to(tl.int64)
        dst = tl.load(slot_ptr + n, mask=inside, other=0).to(tl.int64)
        slot = tl.where(inside, dst * BLOCK_SIZE + offset, -1)
        row = src * sx_b + offset * sx_t
    else:
        slot = tl.load(slot_ptr + t, mask=inside, other=-1).to(tl.int64)
        row = t * sx_t
    d = tl.arange(0, D)
    rows = x_ptr + row[:, None] + (item % H) * sx_h + d[None, :] * sx_d
    x = tl.load(rows, mask=(slot >= 0)[:, None], other=0.0)
    return x, slot


@triton.jit
def _encode_store_kernel(
    k_ptr, koff_ptr, skb, skt, skh, skd, v_ptr, voff_ptr, svb, svt, svh, svd,
    src_ptr, slot_ptr, T, H, L,
    kp_ptr, skp_l, skp_b, skp_o, skp_h, skp_p, kn_ptr, skn_l, skn_b, skn_o, skn_h,
    vp_ptr, svp_l, svp_b, svp_o, svp_h, svp_p, vn_ptr, svn_l, svn_b, svn_o, svn_h,
    krot_ptr, kgrid_ptr, kgrid_scale, kgrid_origin, kgrid_last, kcb_ptr,
    vrot_ptr, vgrid_ptr, vgrid_scale, vgrid_origin, vgrid_last, vcb_ptr,
    BLOCK_SIZE: tl.constexpr, D: tl.constexpr, BT: tl.constexpr, NPIECE: tl.constexpr,
    K_BITS: tl.constexpr, K_PG: tl.constexpr, K_BPG: tl.constexpr, K_NG: tl.constexpr,
    V_BITS: tl.constexpr, V_PG: tl.constexpr, V_BPG: tl.constexpr, V_NG: tl.constexpr,
    UPCAST: tl.constexpr, GATHER: tl.constexpr, LAYERED: tl.constexpr, K_ALIGN: tl.constexpr,
    V_ALIGN: tl.constexpr,
):  # fmt: skip
    if tl.program_id(1) == 0:
        _encode_heads(
            k_ptr, koff_ptr, skb, skt, skh, skd, src_ptr, slot_ptr, T, H, L,
            kp_ptr, skp_l, skp_b, skp_o, skp_h, skp_p, kn_ptr, skn_l, skn_b, skn_o, skn_h,
            krot_ptr, kgrid_ptr, kgrid_scale, kgrid_origin, kgrid_last, kcb_ptr,
            BLOCK_SIZE, D, BT, NPIECE, K_BITS, K_PG, K_BPG, K_NG, UPCAST, GATHER, LAYERED, K_ALIGN,
        )  # fmt: skip
    else:
        _encode_heads(
            v_ptr, voff_ptr, svb, svt, svh, svd, src_ptr, slot_ptr, T, H, L,
            vp_ptr, svp_l, svp_b, svp_o, svp_h, svp_p, vn_ptr, svn_l, svn_b, svn_o, svn_h,
            vrot_ptr, vgrid_ptr, vgrid_scale, vgrid_origin, vgrid_last, vcb_ptr,
            BLOCK_SIZE, D, BT, NPIECE, V_BITS, V_PG, V_BPG, V_NG, UPCAST, GATHER, LAYERED, V_ALIGN,
        )  # fmt: skip
