"""Gluon kernel: the decode split kernel on mma.sync with centroid lookups in shared memory (head_dim 128).

_decode_lut_kernel, grid (programs,), W warps each: a persistent loop over work items (sequence, kv head,
split); inside an item the warps walk tiles of W·T tokens, warp w taking tokens Tw … Tw+T−1 of each tile,
each with its own online softmax, and each writes its own partial (P = S·W partials per query head). No
warp waits for another after the table fill.

Per T-token tile (T = 32 or 64) and warp, in the transposed form (tokens and head dims are the M side of the
MMAs, the G ≤ 8 query heads of the kv head the N side):
    Sᵀ [T, 8]   = K̂ [T, 128] · Q̂ᵀ [128, 8]        K̂ straight from registers (dot operand A)
    Oᵀ [128, 8] += V̂ᵀ [128, T] · Pᵀ [T, 8]        V̂ᵀ from registers, Pᵀ by movmatrix from the Sᵀ accumulator
Centroids come from one 256-entry table of float16 pairs, replicated for the 32 lanes in the 64 KiB of
shared memory that is the kernel's only allocation: entry e, lane l at byte e·256 + l·4 (+128 for the
second table), so one `prmt` forms the address from a packed byte and a lookup never has a bank conflict.
4-bit: a byte's two nibbles → (c[lo], c[hi]). For values, two tokens' nibbles of the same coordinate are
first paired into one byte, so an entry is the (token 2t, token 2t+1) pair operand A needs. 8-bit keys:
one lookup per byte (Lloyd-Max, second table) or, for a symmetric uniform codebook, arithmetic (k − 128
as float16, the step folded into the query).
Each thread loads whole words of packed bytes; the coordinates a thread's words hold are relabelled (joins,
a permute and a reshape, checked trivial by the compiler) so that they are exactly its operand fragment.
The query is loaded in the matching order and the partial output stored in natural rotated order, so the
merge rotates back with Π.
The inline PTX reads the table through `global_smem`, Triton's dynamic shared memory; the launcher checks
that the compiled kernel uses exactly the table's 64 KiB (so the table sits at offset 0).
"""

from __future__ import annotations

import functools

from triton.experimental import gluon
from triton.experimental.gluon import constexpr_function
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

LUT_BYTES = 256 * 256  # shared memory: 256 entries × 256 bytes


def _lane_prologue() -> list[str]:
    return [".reg .b32 l, s, a, x;", "mov.u32 l, %laneid;", "shl.b32 l, l, 2;", "mov.u32 s, global_smem;"]


def _lookup(byte_reg: str, k: int, offset: int, dst: str) -> list[str]:
    """dst ← table word of byte k of `byte_reg`, for this lane."""
    return [
        f"prmt.b32 a, {byte_reg}, l, 0x55{k}4;",
        "add.u32 a, a, s;",
        f"ld.shared.b32 {dst}, [a+{offset}];",
    ]


@functools.cache
def k4_asm(offset: int) -> str:
    """One word of 4-bit key indices ($8; $9: the table probe, unused) → float16 centroids $0 … $7, output
    2b + n holding nibble n of byte b."""
    lines = ["{", *_lane_prologue()]
    for b in range(4):
        lines += [*_lookup("$8", b, offset, "x"), f"mov.b32 {{${2 * b}, ${2 * b + 1}}}, x;"]
    return " ".join([*lines, "}"])


@functools.cache
def v4_asm(offset: int) -> str:
    """The same word of 4-bit value indices of tokens 2t ($16) and 2t+1 ($17) → 16 float16 centroids,
    output 2n + j holding nibble n (0 … 7) of token 2t + j. Nibbles are paired across the two tokens
    (lop3: (a & 0x0f…) | (b & 0xf0…)) so one lookup yields the pair."""
    lines = ["{", *_lane_prologue(), ".reg .b32 lo, hi, t;", "shl.b32 t, $17, 4;",
             "lop3.b32 lo, $16, t, 0x0f0f0f0f, 0xE4;", "shr.u32 t, $16, 4;",
             "lop3.b32 hi, t, $17, 0x0f0f0f0f, 0xE4;"]  # fmt: skip
    for b in range(4):
        for h, reg in enumerate(("lo", "hi")):
            n = 2 * b + h
            lines += [*_lookup(reg, b, offset, "x"), f"mov.b32 {{${2 * n}, ${2 * n + 1}}}, x;"]
    return " ".join([*lines, "}"])


@functools.cache
def k8_asm(offset: int) -> str:
    """One word of 8-bit key indices ($4; $5 unused) → float16 centroids $0 … $3 (one per byte), from the
    table's low halves."""
    lines = ["{", *_lane_prologue(), ".reg .b16 z;"]
    for b in range(4):
        lines += [*_lookup("$4", b, offset, "x"), f"mov.b32 {{${b}, z}}, x;"]
    return " ".join([*lines, "}"])


# One word of 8-bit indices k ($4; $5 unused) → k − 128 as float16 ($0 … $3), exactly: `prmt` writes each
# byte under the float16 exponent of 1024 (0x64XX = 1024 + k), one subtraction of 1152 per pair centres it.
K8U_ASM = " ".join([
    "{", ".reg .b32 m, c, h0, h1;", "mov.b32 m, 0x64646464;", "mov.b32 c, 0x64806480;",
    "prmt.b32 h0, $4, m, 0x4140;", "prmt.b32 h1, $4, m, 0x4342;", "sub.f16x2 h0, h0, c;",
    "sub.f16x2 h1, h1, c;", "mov.b32 {$0, $1}, h0;", "mov.b32 {$2, $3}, h1;", "}",
])  # fmt: skip

# Probabilities of heads 2t ($2) and 2t+1 ($3) of token row g of an 8×8 block → the float16 Pᵀ fragment
# ($0: token 2t, head g; $1: token 2t+1, head g): pack, then transpose the 8×8 block across the warp.
PT_ASM = gl.constexpr(" ".join([
    "{", ".reg .b32 x, y;", "cvt.rn.f16x2.f32 x, $3, $2;", "movmatrix.sync.aligned.m8n8.trans.b16 y, x;",
    "mov.b32 {$0, $1}, y;", "}",
]))  # fmt: skip


@constexpr_function
def _value_layout(W, T):
    """Value words [W, T, 16]: thread (g, t) holds words 2g, 2g+1 of tokens 2t, 2t+1 (+8i)."""
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 0, 1], [0, 1, 0]] + [[0, 8 << i, 0] for i in range(T.bit_length() - 4)],
        lane_bases=[[0, 2, 0], [0, 4, 0], [0, 0, 2], [0, 0, 4], [0, 0, 8]],
        warp_bases=[[1 << i, 0, 0] for i in range(W.bit_length() - 1)], block_bases=[], shape=[W, T, 16],
    )  # fmt: skip


@gluon.jit
def _join4(a, b, c, d):
    """Four tensors → one with two new minor axes: [..., i0, i1] = (a, b, c, d)[i0 + 2·i1]."""
    return gl.join(gl.join(a, b), gl.join(c, d))


@gluon.jit
def _join8(x0, x1, x2, x3, x4, x5, x6, x7):
    return gl.join(_join4(x0, x1, x2, x3), _join4(x4, x5, x6, x7))


@gluon.jit
def _k_phys(d, K_MODE: gl.constexpr):
    """Natural coordinate of logical key coordinate d (operand-A column order, see _k_operand)."""
    if K_MODE == 4:  # d bits (low → high): nib, w2, w3, b0, b1, w0, w1; coordinate 8w + 2b + nib
        nib = d & 1
        w = ((d >> 5) & 1) | (((d >> 6) & 1) << 1) | (((d >> 1) & 1) << 2) | (((d >> 2) & 1) << 3)
        b = ((d >> 3) & 1) | (((d >> 4) & 1) << 1)
        return 8 * w + 2 * b + nib
    else:  # d bits: b0, w3, w4, b1, w0, w1, w2; coordinate 4w + b
        b = (d & 1) | (((d >> 3) & 1) << 1)
        w = ((d >> 4) & 7) | (((d >> 1) & 1) << 3) | (((d >> 2) & 1) << 4)
        return 4 * w + b


@gluon.jit
def _v_phys(r):
    """Natural coordinate of logical value coordinate r (operand-A row order, see _v_operand).
    r bits (low → high): w1, w2, w3, w0, n0, n1, n2; coordinate 8w + n."""
    w = ((r >> 3) & 1) | ((r & 7) << 1)
    return 8 * w + (r >> 4)


@gluon.jit
def _k_operand(words, probe, W: gl.constexpr, T: gl.constexpr, K_MODE: gl.constexpr, K_ASM: gl.constexpr):
    """Packed key words [W, T, 16 or 32] → K̂ [W, T, 128] float16, columns in logical order."""
    if K_MODE == 4:
        w = gl.reshape(words, [W, T, 2, 2, 2, 2])  # w3 w2 w1 w0
        o0, o1, o2, o3, o4, o5, o6, o7 = gl.inline_asm_elementwise(
            K_ASM, "=h,=h,=h,=h,=h,=h,=h,=h,r,r", [w, probe], dtype=(gl.float16,) * 8, is_pure=True, pack=1
        )
        x = _join4(gl.join(o0, o1), gl.join(o2, o3), gl.join(o4, o5), gl.join(o6, o7))
        # [W, T, w3, w2, w1, w0, nib, b0, b1] → logical (high → low) w1 w0 b1 b0 w3 w2 nib
        x = gl.permute(x, [0, 1, 4, 5, 8, 7, 2, 3, 6])
    else:
        w = gl.reshape(words, [W, T, 2, 2, 2, 2, 2])  # w4 w3 w2 w1 w0
        o0, o1, o2, o3 = gl.inline_asm_elementwise(
            K_ASM, "=h,=h,=h,=h,r,r", [w, probe], dtype=(gl.float16,) * 4, is_pure=True, pack=1
        )
        x = _join4(o0, o1, o2, o3)
        # [W, T, w4, w3, w2, w1, w0, b0, b1] → logical (high → low) w2 w1 w0 b1 w4 w3 b0
        x = gl.permute(x, [0, 1, 4, 5, 6, 8, 2, 3, 7])
    return gl.reshape(x, [W, T, 128])


@gluon.jit
def _v_operand(words, probe, W: gl.constexpr, T: gl.constexpr, V_ASM: gl.constexpr):
    """Packed 4-bit value words [W, T, 16] → V̂ᵀ [W, 128, T] float16, rows in logical order."""
    pairs = gl.permute(gl.reshape(words, [W, T // 2, 2, 16]), [0, 1, 3, 2])
    wa, wb = gl.split(pairs)  # tokens 2i and 2i+1: [W, T/2, 16]
    wa = gl.reshape(wa, [W, T // 2, 2, 2, 2, 2])  # w3 w2 w1 w0
    wb = gl.reshape(wb, [W, T // 2, 2, 2, 2, 2])
    o = gl.inline_asm_elementwise(
        V_ASM, "=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,r,r,r", [wa, wb, probe],
        dtype=(gl.float16,) * 16, is_pure=True, pack=1,
    )  # fmt: skip
    x = _join8(
        gl.join(o[0], o[1]), gl.join(o[2], o[3]), gl.join(o[4], o[5]), gl.join(o[6], o[7]),
        gl.join(o[8], o[9]), gl.join(o[10], o[11]), gl.join(o[12], o[13]), gl.join(o[14], o[15]),
    )  # fmt: skip
    # [W, T/2, w3, w2, w1, w0, j, n0, n1, n2] → [W, n2 n1 n0 w0 w3 w2 w1, (i, j)]
    x = gl.permute(x, [0, 9, 8, 7, 5, 2, 3, 4, 1, 6])
    return gl.reshape(x, [W, 128, T])


@gluon.jit
def _p_operand(p, W: gl.constexpr, T: gl.constexpr):
    """Probabilities [W, T, 8] f32 in the accumulator layout → Pᵀ [W, T, 8] float16 for operand B."""
    even, odd = gl.split(gl.reshape(p, [W, T, 4, 2]))
    lo, hi = gl.inline_asm_elementwise(
        PT_ASM, "=h,=h,r,r", [even, odd], dtype=(gl.float16, gl.float16), is_pure=True, pack=1
    )
    # label (token 8i + g, head pair t) now holds tokens 8i + 2t + c of head g
    x = gl.reshape(gl.join(lo, hi), [W, T // 8, 8, 4, 2])  # i g t c
    x = gl.permute(x, [0, 1, 3, 4, 2])
    return gl.reshape(x, [W, T, 8])


@gluon.jit
def _blocks(tok, end, bt_row, sbt_m, max_blocks, BS_SHIFT: gl.constexpr):
    """Tokens (≥ 0) → (valid, block id); tokens past `end` get block 0 (read, then weighted 0)."""
    valid = tok < end
    block = gl.load(bt_row + gl.minimum(tok >> BS_SHIFT, max_blocks - 1) * sbt_m)
    return valid, gl.where(valid, block, 0)


@gluon.jit
def _load_tile(
    t0, end, h, bt_row, sbt_m, max_blocks, k_tok, kw_c, v_tok, vw_c,
    kp_ptr, skp_b, skp_o, skp_h, vp_ptr, svp_b, svp_o, svp_h,
    kn_ptr, skn_b, skn_o, skn_h, vn_ptr, svn_b, svn_o, svn_h,
    BLOCK_SIZE: gl.constexpr, BS_SHIFT: gl.constexpr, SCORE_ROWS: gl.constexpr,
):  # fmt: skip
    """The packed words of a tile's keys [W, T, KW] and values [W, T, 16] and, in the score rows' layout,
    its key and value norms and token validity [W, T] (norms of tokens past `end` are unread garbage)."""
    k_t = t0 + k_tok
    kv, kb = _blocks(k_t, end, bt_row, sbt_m, max_blocks, BS_SHIFT)
    ko = k_t & (BLOCK_SIZE - 1)
    kwords = gl.load(kp_ptr + (kb * skp_b + ko * skp_o + h * skp_h)[:, :, None] + kw_c[None, None, :])
    v_t = t0 + v_tok
    _, vb = _blocks(v_t, end, bt_row, sbt_m, max_blocks, BS_SHIFT)
    v_rows = vb * svp_b + (v_t & (BLOCK_SIZE - 1)) * svp_o + h * svp_h
    vwords = gl.load(vp_ptr + v_rows[:, :, None] + vw_c[None, None, :])
    # the score rows hold the same tokens as the key rows
    sv = gl.convert_layout(kv, SCORE_ROWS, assert_trivial=True)
    sb = gl.convert_layout(kb, SCORE_ROWS, assert_trivial=True)
    so = gl.convert_layout(ko, SCORE_ROWS, assert_trivial=True)
    kn = gl.load(kn_ptr + sb * skn_b + so * skn_o + h * skn_h)
    vn = gl.load(vn_ptr + sb * svn_b + so * svn_o + h * svn_h)
    return kwords, vwords, kn, vn, sv


@gluon.jit
def _decode_lut_kernel(
    qr_ptr,  # rotated query × scale·log2 e [B, Hq, 128] float16, natural order, contiguous
    kp_ptr, skp_b, skp_o, skp_h, kn_ptr, skn_b, skn_o, skn_h,  # keys as int32 words [NB, BS, H, Pk/4]
    vp_ptr, svp_b, svp_o, svp_h, vn_ptr, svn_b, svn_o, svn_h,  # values as int32 words [NB, BS, H, Pv/4]
    lut_ptr,  # [256, 2] int32: the two tables' entries
    bt_ptr, sbt_b, sbt_m, ctx_ptr,  # block_tables [B, M], context_lens [B]
    po_ptr, pl_ptr,  # partial out [B, Hq, P, 128] f32 (natural order), partial lse [B, Hq, P] f32
    H, Hq, G, S, P, split_tokens, num_items, max_blocks, k_step,  # P: room for partials per head ≥ S·W
    BLOCK_SIZE: gl.constexpr, BS_SHIFT: gl.constexpr,
    K_MODE: gl.constexpr, K_ASM: gl.constexpr, V_ASM: gl.constexpr,
    W: gl.constexpr, T: gl.constexpr,  # warps per program, tokens per warp and step
    PREFETCH: gl.constexpr,  # load tile i+1 during tile i
):  # fmt: skip
    D: gl.constexpr = 128
    KW: gl.constexpr = 16 if K_MODE == 4 else 32  # key words per token
    MMA: gl.constexpr = gl.NVMMADistributedLayout(
        version=[2, 0], warps_per_cta=[W, 1, 1], instr_shape=[1, 16, 8]
    )
    OPA: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    OPB: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
    # key words: thread (g, t) holds tokens g + 8i and words [t·KW/4, (t+1)·KW/4)
    KL: gl.constexpr = gl.BlockedLayout([1, 1, KW // 4], [1, 8, 4], [W, 1, 1], [2, 1, 0])
    VL: gl.constexpr = _value_layout(W, T)
    TL: gl.constexpr = gl.BlockedLayout([1, 1, 8], [8, 1, 4], [W, 1, 1], [2, 1, 0])  # table fill [256, 2, 32]
    SL: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0])
    SCORE_ROWS: gl.constexpr = gl.SliceLayout(2, MMA)

    # the table: entry e, lane l → word e·64 + 32·table + l
    te = gl.arange(0, 256, layout=gl.SliceLayout(1, gl.SliceLayout(2, TL)))
    tt = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(2, TL)))
    entries = gl.load(lut_ptr + te[:, None] * 2 + tt[None, :])
    lut = gl.allocate_shared_memory(
        gl.int32,
        [256, 2, 32],
        SL,
        gl.broadcast(gl.expand_dims(entries, 2), gl.full([256, 2, 32], 0, gl.int32, TL))[0],
    )
    # read back after the fill's barrier: every lookup takes it as an operand, so none runs before
    probe = gl.max(gl.max(gl.max(lut.slice(0, 1, 0).load(TL), axis=2), axis=1), axis=0)

    # index vectors, one per layout
    kw_w = gl.arange(0, W, layout=gl.SliceLayout(1, gl.SliceLayout(2, KL)))
    kw_i = gl.arange(0, T, layout=gl.SliceLayout(0, gl.SliceLayout(2, KL)))
    kw_c = gl.arange(0, KW, layout=gl.SliceLayout(0, gl.SliceLayout(1, KL)))
    k_tok = kw_w[:, None] * T + kw_i[None, :]  # [W, 64]
    vw_w = gl.arange(0, W, layout=gl.SliceLayout(1, gl.SliceLayout(2, VL)))
    vw_i = gl.arange(0, T, layout=gl.SliceLayout(0, gl.SliceLayout(2, VL)))
    vw_c = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(1, VL)))
    v_tok = vw_w[:, None] * T + vw_i[None, :]
    qb_w = gl.arange(0, W, layout=gl.SliceLayout(1, gl.SliceLayout(2, OPB)))
    qb_d = gl.arange(0, D, layout=gl.SliceLayout(0, gl.SliceLayout(2, OPB)))
    qb_n = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, OPB)))
    qb_off = _k_phys(qb_d, K_MODE)[None, :, None] + qb_n[None, None, :] * D + qb_w[:, None, None] * 0
    m_w = gl.arange(0, W, layout=gl.SliceLayout(1, gl.SliceLayout(1, MMA)))
    m_n = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, MMA)))
    m_r = gl.arange(0, D, layout=gl.SliceLayout(0, gl.SliceLayout(2, MMA)))
    r_w = gl.arange(0, W, layout=gl.SliceLayout(1, gl.SliceLayout(2, MMA)))
    n_mask = m_n < G  # [8]

    for item in range(gl.program_id(0), num_items, gl.num_programs(0)):
        b = item // (H * S)
        h = (item // S) % H
        s = item % S
        ctx = gl.load(ctx_ptr + b)
        start = s * split_tokens
        end = gl.minimum(start + split_tokens, ctx)
        bt_row = bt_ptr + b.to(gl.int64) * sbt_b
        q_row = qr_ptr + (b * Hq + h * G).to(gl.int64) * D
        q = gl.load(q_row + qb_off, mask=(qb_n < G)[None, None, :], other=0.0)  # Q̂ᵀ [W, 128, 8]
        if K_MODE == 9:  # Σ q·c[k] = step·(Σ q·(k − 128) + Σ q/2)
            q = (q.to(gl.float32) * k_step).to(gl.float16)
            q_m = gl.load(
                q_row + m_r[None, :, None] + m_n[None, None, :] * D + r_w[:, None, None] * 0,
                mask=n_mask[None, None, :], other=0.0,
            )  # fmt: skip
            q_half = 0.5 * gl.sum((q_m.to(gl.float32) * k_step).to(gl.float16).to(gl.float32), axis=1)
        m_i = gl.full([W, 8], float("-inf"), gl.float32, gl.SliceLayout(1, MMA))
        l_i = gl.zeros([W, 8], gl.float32, gl.SliceLayout(1, MMA))
        acc = gl.zeros([W, D, 8], gl.float32, MMA)
        if PREFETCH:
            kwords, vwords, kn, vn, sv = _load_tile(
                start, end, h, bt_row, sbt_m, max_blocks, k_tok, kw_c, v_tok, vw_c,
                kp_ptr, skp_b, skp_o, skp_h, vp_ptr, svp_b, svp_o, svp_h,
                kn_ptr, skn_b, skn_o, skn_h, vn_ptr, svn_b, svn_o, svn_h, BLOCK_SIZE, BS_SHIFT, SCORE_ROWS,
            )  # fmt: skip
        for t0 in range(start, end, W * T):
            # this tile's loads, or with PREFETCH the next tile's, in flight while this one is computed
            loaded = _load_tile(
                t0 + PREFETCH * (W * T), end, h, bt_row, sbt_m, max_blocks, k_tok, kw_c, v_tok, vw_c,
                kp_ptr, skp_b, skp_o, skp_h, vp_ptr, svp_b, svp_o, svp_h,
                kn_ptr, skn_b, skn_o, skn_h, vn_ptr, svn_b, svn_o, svn_h,
                BLOCK_SIZE, BS_SHIFT, SCORE_ROWS,
            )  # fmt: skip
            if not PREFETCH:
                kwords, vwords, kn, vn, sv = loaded
            k_op = gl.convert_layout(_k_operand(kwords, probe, W, T, K_MODE, K_ASM), OPA, assert_trivial=True)
            qk = mma_v2(k_op, q, gl.zeros([W, T, 8], gl.float32, MMA))
            if K_MODE == 9:
                qk = qk + gl.expand_dims(q_half, 1)
            qk = gl.where(gl.expand_dims(sv, 2), qk * gl.expand_dims(kn, 2), float("-inf"))
            m_new = gl.maximum(m_i, gl.max(qk, axis=1))
            m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = gl.exp2(m_i - m_use)
            p = gl.exp2(qk - gl.expand_dims(m_use, 1))
            l_i = l_i * alpha + gl.sum(p, axis=1)
            pw = gl.where(gl.expand_dims(sv, 2), p * gl.expand_dims(vn, 2), 0.0)  # unread norms may be NaN
            p_op = gl.convert_layout(_p_operand(pw, W, T), OPB, assert_trivial=True)
            v_op = gl.convert_layout(_v_operand(vwords, probe, W, T, V_ASM), OPA, assert_trivial=True)
            acc = mma_v2(v_op, p_op, acc * gl.expand_dims(alpha, 1))
            m_i = m_new
            if PREFETCH:
                kwords, vwords, kn, vn, sv = loaded

        has = l_i > 0
        inv = 1.0 / gl.where(has, l_i, 1.0)
        lse = gl.where(has, m_i + gl.log2(gl.where(has, l_i, 1.0)), float("-inf"))
        part = (b * Hq + h * G + m_n[None, :]).to(gl.int64) * P + s * W + m_w[:, None]  # [W, 8]
        gl.store(pl_ptr + part, lse, mask=n_mask[None, :])
        o_ptrs = po_ptr + gl.expand_dims(part * D, 1) + _v_phys(m_r)[None, :, None]
        gl.store(o_ptrs, acc * gl.expand_dims(inv, 1), mask=n_mask[None, None, :])
