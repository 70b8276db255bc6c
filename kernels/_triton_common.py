"""Triton building blocks shared by the TurboQuant kernels.

Provides:
    unpack_field_major (jit)           packed rows → indices [R, D] in field-major order
    pack_field_major (jit)             field-major indices [R, D] → packed bytes, stored to rows
    nearest_centroid (jit)             binary search: number of boundaries strictly below each value

Field-major order (see _tables.py): position p = k·NG + g holds index j = g·PG + k, where a packed vector
is NG groups of PG indices in BPG bytes (bits 2 → PG 4, BPG 1; 3 → 8, 3; 4 → 2, 1; 8 → 1, 1).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def unpack_field_major(
    row_ptrs,  # [R] pointers to byte 0 of each packed vector
    row_mask,  # [R] bool
    byte_stride,
    BITS: tl.constexpr,
    PG: tl.constexpr,
    BPG: tl.constexpr,
    NG: tl.constexpr,
):
    g = tl.arange(0, NG)
    ptrs = row_ptrs[:, None] + (g * BPG)[None, :] * byte_stride
    word = tl.load(ptrs, mask=row_mask[:, None], other=0).to(tl.int32)
    for m in tl.static_range(1, BPG):
        byte = tl.load(ptrs + m * byte_stride, mask=row_mask[:, None], other=0).to(tl.int32)
        word = word | (byte << (8 * m))
    shifts = tl.arange(0, PG) * BITS
    idx = (word[:, None, :] >> shifts[None, :, None]) & ((1 << BITS) - 1)  # [R, PG, NG]
    return tl.reshape(idx, [row_ptrs.shape[0], PG * NG])


@triton.jit
def pack_field_major(
    idx,  # [R, D] int32, field-major
    row_ptrs,  # [R] pointers to byte 0 of each destination vector
    row_mask,
    byte_stride,
    BITS: tl.constexpr,
    PG: tl.constexpr,
    BPG: tl.constexpr,
    NG: tl.constexpr,
):
    fields = tl.reshape(idx, [row_ptrs.shape[0], PG, NG])
    shifts = tl.arange(0, PG) * BITS
    word = tl.sum(fields << shifts[None, :, None], axis=1)  # disjoint bit ranges: sum == or
    g = tl.arange(0, NG)
    ptrs = row_ptrs[:, None] + (g * BPG)[None, :] * byte_stride
    for m in tl.static_range(BPG):
        tl.store(ptrs + m * byte_stride, ((word >> (8 * m)) & 0xFF).to(tl.uint8), mask=row_mask[:, None])


@triton.jit
def nearest_centroid(y, boundaries_ptr, BITS: tl.constexpr):
    """Index of the nearest centroid of each value: the number of (sorted) boundaries strictly below it."""
    lo = tl.zeros(y.shape, dtype=tl.int32)
    for s in tl.static_range(BITS):
        cand = lo + (1 << (BITS - 1 - s))
        bound = tl.load(boundaries_ptr + cand - 1)
        lo = tl.where(y > bound, cand, lo)
    return lo


@triton.jit
def dot16(a, b, acc, UPCAST: tl.constexpr):
    """acc + a @ b for 16-bit operands with f32 accumulation.

    UPCAST (set under the interpreter, whose bfloat16 dot is wrong in Triton 3.9) computes the same
    products in float32: 16-bit × 16-bit products are exact in float32, so only the summation order differs.
    """
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)
