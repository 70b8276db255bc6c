"""Triton kernel: the log-sum-exp merge of decode split partials and the one rotation back.

_decode_merge_kernel, grid (B·Hq,): one program per (sequence, query head). It reads the head's S partial
log-sum-exps as one vector, weights the S partial outputs (rotated domain, any coordinate order) in chunks
of SC splits (all at once, loaded with the log-sum-exps, where S ≤ SC), and multiplies the merged row by the
rotation back (Π, or Π[perm, :] for field-major partials) in column chunks of JC, or (PRELOAD) whole, loaded
before anything else; all in float32 FMAs (IEEE). Splits that saw no token (lse = −inf) weigh 0.
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
