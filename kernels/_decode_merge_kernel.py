"""Triton kernels: the log-sum-exp merge of decode split partials and the one rotation back.

Splits that saw no token (lse = −inf) weigh 0; the rotation back is Π, or Π[perm, :] for field-major partials.

_decode_merge_kernel, grid (B·Hq,): one program per (sequence, query head). It reads the head's S partial
log-sum-exps as one vector, weights the S partial outputs (rotated domain, any coordinate order) in chunks
of SC splits (all at once, loaded with the log-sum-exps, where S ≤ SC), and multiplies the merged row by the
rotation back in column chunks of JC, or (PRELOAD) whole, loaded before anything else; all in float32 FMAs
(IEEE). Each program reads all of Π (64 KiB at head_dim 128): for few rows.

_decode_merge_rows_kernel, grid (⌈R / BM⌉,) over the R = B·Hq rows, BM ≥ 16 rows a program: the same merge
for BM rows at once, SC splits a chunk, and the rotation back through tensor cores (tl.dot at tf32x3,
float32's accuracy; IEEE FMA dots spill at head_dim 128). A program reads Π once for its BM rows: for many
rows.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._triton_common import pdl_wait


@triton.jit
def _decode_merge_kernel(
    po_ptr, pl_ptr,  # partial out [B, Hq, SS, D] f32, partial lse [B, Hq, SS] f32 (base 2)
    rot_ptr,  # [D, D] f32: merged row @ rot = output row
    o_ptr, so_b, so_h,  # out [B, Hq, D] (last stride 1)
    Hq, S, SS,  # S partials per row, SS ≥ S apart
    D: tl.constexpr, SP: tl.constexpr, SC: tl.constexpr, JC: tl.constexpr, PDL: tl.constexpr = False,
    PRELOAD: tl.constexpr = False,  # load the rotation back whole first (while the split kernel finishes)
):  # fmt: skip
    d = tl.arange(0, D)
    if PRELOAD:
        rot = tl.load(rot_ptr + d[:, None] * D + d[None, :])  # [D, D]
    pdl_wait(PDL)  # the partials come from the split kernel
    pid = tl.program_id(0)
    b = pid // Hq
    hq = pid % Hq
    row = pid.to(tl.int64) * SS
    s = tl.arange(0, SP)
    lse = tl.load(pl_ptr + row + s, mask=s < S, other=float("-inf"))
    if SP <= SC:  # one chunk: the partials load together with their log-sum-exps
        part = tl.load(po_ptr + (row + s)[:, None] * D + d[None, :], mask=(s < S)[:, None], other=0.0)
    m = tl.max(lse, axis=0)
    m = tl.where(m == float("-inf"), 0.0, m)
    if SP <= SC:
        w = tl.exp2(lse - m)
        wsum = tl.sum(w, axis=0)
        acc = tl.sum(w[:, None] * part, axis=0)
    else:
        wsum = tl.sum(tl.exp2(lse - m), axis=0)
        sc = tl.arange(0, SC)
        acc = tl.zeros([D], dtype=tl.float32)
        for c0 in range(0, S, SC):
            cmask = c0 + sc < S
            w = tl.exp2(tl.load(pl_ptr + row + c0 + sc, mask=cmask, other=float("-inf")) - m)
            part = tl.load(po_ptr + (row + c0 + sc)[:, None] * D + d[None, :], mask=cmask[:, None], other=0.0)
            acc += tl.sum(w[:, None] * part, axis=0)
    acc = acc / tl.where(wsum > 0, wsum, 1.0)
    out_row = o_ptr + b.to(tl.int64) * so_b + hq * so_h
    if PRELOAD:
        tl.store(out_row + d, tl.sum(acc[:, None] * rot, axis=0).to(o_ptr.dtype.element_ty))
    else:
        jc = tl.arange(0, JC)
        for j0 in tl.static_range(0, D, JC):
            r = tl.load(rot_ptr + d[:, None] * D + (j0 + jc)[None, :])  # [D, JC]
            out = tl.sum(acc[:, None] * r, axis=0)
            tl.store(out_row + j0 + jc, out.to(o_ptr.dtype.element_ty))


@triton.jit
def _decode_merge_rows_kernel(
    po_ptr, pl_ptr,  # partial out [B, Hq, SS, D] f32, partial lse [B, Hq, SS] f32 (base 2)
    rot_ptr,  # [D, D] f32: merged row @ rot = output row
    o_ptr, so_b, so_h,  # out [B, Hq, D] (last stride 1)
    R, Hq, S, SS,  # R = B·Hq rows, S partials per row, SS ≥ S apart
    D: tl.constexpr, BM: tl.constexpr, SC: tl.constexpr, JC: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    pdl_wait(PDL)  # the partials come from the split kernel
    d = tl.arange(0, D)
    rows = tl.program_id(0) * BM + tl.arange(0, BM)  # [BM]
    live = rows < R
    base = rows.to(tl.int64) * SS  # [BM]: each row's first partial
    sc = tl.arange(0, SC)
    m = tl.full([BM], float("-inf"), tl.float32)
    for c0 in range(0, S, SC):  # the row maxima first
        cmask = live[:, None] & (c0 + sc < S)[None, :]
        lse = tl.load(pl_ptr + base[:, None] + c0 + sc[None, :], mask=cmask, other=float("-inf"))
        m = tl.maximum(m, tl.max(lse, axis=1))
    m = tl.where(m == float("-inf"), 0.0, m)
    wsum = tl.zeros([BM], dtype=tl.float32)
    acc = tl.zeros([BM, D], dtype=tl.float32)
    for c0 in range(0, S, SC):  # then the weighted partials, SC splits at a time
        cmask = live[:, None] & (c0 + sc < S)[None, :]  # [BM, SC]
        at = base[:, None] + c0 + sc[None, :]
        w = tl.exp2(tl.load(pl_ptr + at, mask=cmask, other=float("-inf")) - m[:, None])
        part = tl.load(po_ptr + at[:, :, None] * D + d[None, None, :], mask=cmask[:, :, None], other=0.0)
        wsum += tl.sum(w, axis=1)
        acc += tl.sum(w[:, :, None] * part, axis=1)
    acc = acc / tl.where(wsum > 0, wsum, 1.0)[:, None]  # [BM, D]
    out_rows = o_ptr + (rows // Hq).to(tl.int64) * so_b + (rows % Hq) * so_h  # [BM]
    jc = tl.arange(0, JC)
    for j0 in tl.static_range(0, D, JC):
        r = tl.load(rot_ptr + d[:, None] * D + (j0 + jc)[None, :])  # [D, JC]
        out = tl.dot(acc, r, input_precision="tf32x3")  # [BM, JC]
        tl.store(out_rows[:, None] + j0 + jc[None, :], out.to(o_ptr.dtype.element_ty), mask=live[:, None])
