"""Triton kernel: the decode's query rotation (the split kernels are _decode_perfield_kernel and, on GPUs,
the Gluon _decode_lut_kernel; _decode_merge_kernel and _decode_merge_rows_kernel merge their partials).

_rotate_query_kernel, grid (⌈B·Hq / BM⌉, D/DC): q·Πᵀ·scale·log2 e once per query head, BM query rows
(any sequences and heads: the rotation is one matrix) and DC output columns per program (IEEE f32, or
SPLIT16: tensor-core products of bf16 terms, for 16-bit operands), stored in the operand dtype (used when
the split kernel does not rotate its queries itself, ROTATE_Q=False).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._triton_common import dot16, pdl_launch_dependents


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
