"""Gluon pieces of the decode kernel (_decode_lut_kernel.py) between its items: the combine of a program's
W warp partials of an item into the item's one partial, through the kernel's one shared buffer and without
cross-warp reductions (they would need scratch shared memory, and the kernel's PTX addresses its buffer from
offset 0). Partials are normalised outputs with base-2 log-sum-exps; a warp that saw no token has lse −inf
and weighs 0.
"""

from __future__ import annotations

import triton
from triton.experimental import gluon
from triton.experimental.gluon import constexpr_function
from triton.experimental.gluon import language as gl

from ._decode_lut_ptx import COMBINE_STATS_AT as _COMBINE_STATS_AT
from ._decode_lut_ptx import LUT_BYTES as _LUT_BYTES
from ._decode_lut_ptx import PROXY_FENCE_ASM as _PROXY_FENCE_ASM

LUT_BYTES = gl.constexpr(_LUT_BYTES)
COMBINE_STATS_AT = gl.constexpr(_COMBINE_STATS_AT)
PROXY_FENCE_ASM = gl.constexpr(_PROXY_FENCE_ASM)
# A barrier of the program's threads: Gluon's thread_barrier (Triton 3.6), barrier() since (3.8 has no other).
cta_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier
# Whether this Triton compiles combine_warps: its view of the warps' outputs reinterprets one 8 KiB chunk as
# W / 2 of them, which Triton 3.6 takes and 3.8 refuses ("source and result must have the same logical
# storage size"; the whole buffer has 13 chunks, no power of two to reinterpret at). Elsewhere the warps'
# partials go through the merge (decode_lut.lut_combines).
COMBINE_COMPILES = tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 8)


@gluon.jit
def per_thread(asm: gl.constexpr, threads):
    """Run `asm` (its $0: an unused output) once in every thread (threads: a tensor of one element per
    thread)."""
    gl.inline_asm_elementwise(asm, "=r,r", [threads], gl.int32, False, 1)


@constexpr_function
def combine_layout(W, D):
    """The combine's read-back [W, D, 8]: thread (r, q) of a warp holds all W warps' row r, heads 4q … 4q+3
    (D = 128: 16-byte reads, a warp's 512 contiguous bytes per read) or 2q, 2q+1 (D = 64: 8-byte reads, 256
    bytes), the program's threads covering 16·W rows (D = 128) or 8·W (D = 64)."""
    if D == 128:
        return gl.BlockedLayout([W, 1, 4], [1, 16, 2], [1, W, 1], [2, 1, 0])
    return gl.BlockedLayout([W, 1, 2], [1, 8, 4], [1, W, 1], [2, 1, 0])


@gluon.jit
def combine_warps(
    buf, lse_w, out_w, threads, W: gl.constexpr, D: gl.constexpr, SMEM: gl.constexpr, TMA: gl.constexpr
):  # fmt: skip
    """The program's partial of an item from its warps' partials (log-sum-exps lse_w [W, 8], normalised
    outputs out_w [W, D, 8] with rows in logical order), through shared memory: the outputs in the staging
    slots' bytes (idle between items: every warp has waited for its last tile), the log-sum-exps in the last
    chunk. Returns the log-sum-exp [1, 8] and the output [D, 8] (rows in logical order), in the layout
    SliceLayout(0, combine_layout(W, D)): thread (r, q) holds row r's heads 4q … 4q+3 (or 2q, 2q+1)."""
    RL: gl.constexpr = combine_layout(W, D)
    # row-major views of the one buffer: the outputs [W, D, 8] from chunk LUT_BYTES / 8192 on (W·D / 256
    # chunks; `index` gives the first chunk's address, the view extends over the next ones), the
    # log-sum-exps [W, 8] at COMBINE_STATS_AT in the last chunk
    gl.static_assert(W % 2 == 0)
    outs = buf.index(LUT_BYTES // 8192)._reinterpret(
        gl.float32, [W, D, 8], gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0])
    )
    lses = (
        buf.index(SMEM // 8192 - 1)
        ._reinterpret(gl.float32, [256, 8], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
        .slice(COMBINE_STATS_AT // 32, W)
    )
    cta_barrier()  # no warp still reads its slots
    outs.store(out_w)
    lses.store(lse_w)
    cta_barrier()
    o3 = outs.load(RL)
    l3 = gl.expand_dims(lses.load(gl.SliceLayout(1, RL)), 1)  # [W, 1, 8]
    if TMA:  # the next item's boxes overwrite these bytes
        per_thread(PROXY_FENCE_ASM, threads)
    cta_barrier()
    m = gl.max(l3, axis=0)  # [1, 8]
    m_use = gl.where(m == float("-inf"), 0.0, m)
    weight = gl.exp2(l3 - gl.expand_dims(m_use, 0))  # 0 for warps that saw no token
    total = gl.sum(weight, axis=0)
    out = gl.sum(o3 * weight, axis=0)
    has = total > 0
    lse = gl.where(has, m_use + gl.log2(gl.where(has, total, 1.0)), float("-inf"))
    return lse, out / gl.where(has, total, 1.0)
