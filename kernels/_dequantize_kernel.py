"""Triton kernel: TurboQuant blocks → a float paged cache (the connector's load path).

Grid (programs,): each program loads the rotation once and walks work items (layer, listed block, tile of
ROWS (offset, head) rows) with a stride of the grid size. Listed block i of layer l (packed pages at layer
stride sp_l / sn_l) goes to out[i], or with OUT_IDS to out[out_ids[i]] (a scatter straight into a paged
cache); LAYERED: layer l's out at o_ptr + ooff[l] · ALIGN (paged_layers.py). CHECKED: a listed block whose
ok[i] is 0 is skipped (its destination keeps its bytes). Per item: unpack, codebook lookup, rotate back (one
dot in field-major order), scale by the norms, store.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._triton_common import dot16, unpack_field_major


@triton.jit
def _dequantize_kernel(
    p_ptr, sp_l, sp_b, sp_o, sp_h, sp_p,  # packed [L, NB, BS, H, P] uint8
    n_ptr, sn_l, sn_b, sn_o, sn_h,  # norms [L, NB, BS, H] f32
    ids_ptr, out_ids_ptr, ok_ptr, num_ids, H, L,  # block_ids [N]; OUT_IDS: out_ids [N]; CHECKED: ok [N]
    cb_ptr, rot_ptr,  # codebook [2**BITS], rotation Π[perm, :] [D, D] (f32 or f16)
    o_ptr, ooff_ptr, so_n, so_o, so_h, so_d,  # out [N, BS, H, D] (OUT_IDS: [NB, BS, H, D]) per layer
    BLOCK_SIZE: tl.constexpr, D: tl.constexpr, ROWS: tl.constexpr, IEEE: tl.constexpr,
    BITS: tl.constexpr, PG: tl.constexpr, BPG: tl.constexpr, NG: tl.constexpr, OUT_IDS: tl.constexpr,
    LAYERED: tl.constexpr, ALIGN: tl.constexpr, CHECKED: tl.constexpr,
):  # fmt: skip
    d = tl.arange(0, D)
    rot = tl.load(rot_ptr + d[:, None] * D + d[None, :])
    row_tiles = tl.cdiv(BLOCK_SIZE * H, ROWS)
    per_layer = num_ids * row_tiles
    for item in range(tl.program_id(0), L * per_layer, tl.num_programs(0)):
        layer = (item // per_layer).to(tl.int64)
        n = (item % per_layer) // row_tiles
        r = (item % row_tiles) * ROWS + tl.arange(0, ROWS)
        if CHECKED:  # noqa: SIM108 (constexpr branch); a refused block (ok 0) has no rows to write
            rmask = r < BLOCK_SIZE * H * tl.load(ok_ptr + n).to(tl.int32)
        else:
            rmask = r < BLOCK_SIZE * H
        offset = r // H
        h = r % H
        block = tl.load(ids_ptr + n).to(tl.int64)
        rows = p_ptr + layer * sp_l + block * sp_b + offset * sp_o + h * sp_h
        idx = unpack_field_major(rows, rmask, sp_p, BITS, PG, BPG, NG)
        vals = tl.load(cb_ptr + idx)
        if IEEE:  # float32 output: three TF32 products, ~float32 accuracy
            x = tl.dot(vals, rot, input_precision="tf32x3")
        else:
            x = dot16(vals, rot, tl.zeros([ROWS, D], dtype=tl.float32), False)
        norm = tl.load(n_ptr + layer * sn_l + block * sn_b + offset * sn_o + h * sn_h, mask=rmask, other=0.0)
        x = x * norm[:, None]
        if OUT_IDS:  # noqa: SIM108 (constexpr branch)
            dst = tl.load(out_ids_ptr + n).to(tl.int64)
        else:
            dst = n
        base = o_ptr
        if LAYERED:
            base += tl.load(ooff_ptr + layer) * ALIGN
        out = base + dst * so_n + offset[:, None] * so_o + h[:, None] * so_h + d[None, :] * so_d
        tl.store(out, x.to(o_ptr.dtype.element_ty), mask=rmask[:, None])
