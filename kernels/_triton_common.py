"""Triton building blocks shared by the TurboQuant kernels.

Provides:
    unpack_field_major (jit)           packed rows → indices [R, D] in field-major order
    load_packed_words (jit)            packed rows → their groups [R, NGP] (bytes, or assembled words)
    pack_field_major (jit)             field-major indices [R, D] → packed bytes, stored to rows
    nearest_centroid (jit)             fixed-point uniform-cell search: the nearest centroid of each value
    centroid_at (jit)                  codebook[idx] (f32), in idx's own layout under ASM
    pdl_wait, pdl_launch_dependents (jit)   programmatic dependent launch hooks (no-ops unless PDL)

Field-major order (see _tables.py): position p = k·NG + g holds index j = g·PG + k, where a packed vector
is NG groups of PG indices in BPG bytes (bits 1 → PG 8, BPG 1; 2 → 4, 1; 3 → 8, 3; 4 → 2, 1; 5 → 8, 5;
6 → 4, 3; 7 → 8, 7; 8 → 1, 1). A group's bytes form one word: int32 up to 4 bytes, int64 for 5 and 7.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._tables import GRID_FRAC_BITS

try:  # Triton ≥ 3.3 on CUDA; the hooks are only compiled in with PDL=True (see _backend.pdl_supported)
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover
    gdc_launch_dependents = gdc_wait = None


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """Under programmatic dependent launch: block until the previous kernel's writes are visible."""
    if PDL:
        gdc_wait()


@triton.jit
def pdl_launch_dependents(PDL: tl.constexpr):
    """Under programmatic dependent launch: let the next kernel start launching (its reads still wait)."""
    if PDL:
        gdc_launch_dependents()


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
    word = load_packed_words(row_ptrs, row_mask, byte_stride, BPG, NG, NG)
    return words_to_field_major(word, BITS, PG, NG)


@triton.jit
def load_packed_words(
    row_ptrs, row_mask, byte_stride, BPG: tl.constexpr, NG: tl.constexpr, NGP: tl.constexpr
):  # fmt: skip
    """The NG groups of each packed row [R, NGP] (NGP ≥ NG, the columns past NG 0): uint8 bytes for one-byte
    groups, else words of BPG little-endian bytes (int32, or int64 for more than 4 bytes)."""
    g = tl.arange(0, NGP)
    mask = row_mask[:, None] & (g < NG)[None, :]
    ptrs = row_ptrs[:, None] + (g * BPG)[None, :] * byte_stride
    word = tl.load(ptrs, mask=mask, other=0)
    if BPG > 1:
        word = word.to(tl.int32)
        if BPG > 4:
            word = word.to(tl.int64)
        for m in tl.static_range(1, BPG):
            word = word | (tl.load(ptrs + m * byte_stride, mask=mask, other=0).to(word.dtype) << (8 * m))
    return word


@triton.jit
def words_to_field_major(word, BITS: tl.constexpr, PG: tl.constexpr, NG: tl.constexpr):
    """Group words [R, NG] → indices [R, PG·NG] (int32) in field-major order."""
    shifts = (tl.arange(0, PG) * BITS).to(word.dtype)
    idx = (word[:, None, :] >> shifts[None, :, None]) & ((1 << BITS) - 1)  # [R, PG, NG]
    return tl.reshape(idx.to(tl.int32), [word.shape[0], PG * NG])


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
    if BPG > 4:
        fields = fields.to(tl.int64)
    shifts = (tl.arange(0, PG) * BITS).to(fields.dtype)
    word = tl.sum(fields << shifts[None, :, None], axis=1)  # disjoint bit ranges: sum == or
    g = tl.arange(0, NG)
    ptrs = row_ptrs[:, None] + (g * BPG)[None, :] * byte_stride
    for m in tl.static_range(BPG):
        tl.store(ptrs + m * byte_stride, ((word >> (8 * m)) & 0xFF).to(tl.uint8), mask=row_mask[:, None])


def nearest_centroid_asm(frac_bits: int) -> str:
    """PTX of nearest_centroid: $0 ← index; $1: position (f32), $2: search words (u64 address), $3: last.
    cvt.rzi.u32 saturates (negative and NaN → 0, above 2^32 − 1 → 2^32 − 1), so one unsigned min clamps."""
    return " ".join([
        "{", ".reg .u32 a, i, w;", ".reg .u64 p;", "cvt.rzi.u32.f32 a, $1;", "min.u32 a, a, $3;",
        f"shr.u32 i, a, {frac_bits};", "mad.wide.u32 p, i, 4, $2;", "ld.global.nc.b32 w, [p];",
        f"and.b32 a, a, {(1 << frac_bits) - 1};", "add.u32 w, w, a;", f"shr.u32 $0, w, {frac_bits};", "}",
    ])  # fmt: skip


_FRAC = tl.constexpr(GRID_FRAC_BITS)
_FRAC_MASK = tl.constexpr((1 << GRID_FRAC_BITS) - 1)
_NEAREST_CENTROID_ASM = tl.constexpr(nearest_centroid_asm(GRID_FRAC_BITS))


@triton.jit
def nearest_centroid(pos, words_ptr, last, ASM: tl.constexpr):
    """Index of the nearest centroid (int32) of values at positions `pos` (f32) on the codec's cell line, in
    units of 2^-F cell (F = GRID_FRAC_BITS): one gather from the fixed-point search words
    (_tables.search_line) and an add whose carry counts the boundary inside the cell; `last` = cells·2^F − 1.
    ASM: in inline PTX (nearest_centroid_asm), which also keeps the layout of `pos` (a tl.load is given a
    coalesced layout, and converting [R, D] pointers to it costs more than the search); else in tl ops (the
    interpreter)."""
    if ASM:
        return tl.inline_asm_elementwise(
            _NEAREST_CENTROID_ASM, "=r,f,l,r", [pos, words_ptr.to(tl.int64, bitcast=True), last],
            dtype=tl.int32, is_pure=True, pack=1,
        )  # fmt: skip
    else:
        at = tl.minimum(tl.where(pos > 0, tl.minimum(pos, 2.0e9), 0.0).to(tl.int32), last)  # NaN → 0, as PTX
        word = tl.load(words_ptr + (at >> _FRAC))
        return (word + (at & _FRAC_MASK)) >> _FRAC


_CENTROID_ASM = tl.constexpr("{ .reg .u64 p; mad.wide.u32 p, $1, 4, $2; ld.global.nc.f32 $0, [p]; }")


@triton.jit
def centroid_at(idx, cb_ptr, ASM: tl.constexpr):
    """codebook[idx] as float32 (idx int32 in [0, 2**bits)); ASM: in inline PTX, keeping idx's layout (as
    nearest_centroid does for its search), else a tl.load gather (the interpreter)."""
    if ASM:
        return tl.inline_asm_elementwise(
            _CENTROID_ASM, "=f,r,l", [idx, cb_ptr.to(tl.int64, bitcast=True)], dtype=tl.float32,
            is_pure=True, pack=1,
        )  # fmt: skip
    else:
        return tl.load(cb_ptr + idx)


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
