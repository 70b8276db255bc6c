"""Triton kernel: TurboQuant blocks → a float paged cache (the connector's load path).

Grid (programs,): each program loads the rotation once and walks work items with a stride of the grid
size. Listed block i of layer l (packed pages at layer stride sp_l / sn_l) goes to out[i], or with OUT_IDS
to out[out_ids[i]] (a scatter straight into a paged cache); LAYERED: layer l's out at o_ptr + ooff[l] · ALIGN
(paged_layers.py). Per tile of ROWS (offset, head) rows: unpack, codebook lookup, rotate back (one dot in
field-major order), scale by the norms, store.
  plain / CHECKED: an item is (layer, listed block, row tile); CHECKED: a listed block whose ok[i] is 0 is
    skipped (its destination keeps its bytes).
  VERIFY: an item is (layer, listed block), one piece of checksum.py (its packed bytes, then its norms, as
    32-bit words): the program sums the piece's words first (PTILE / NTILE at a time), stores the sums in
    got[i, l] and compares them with exp[i, l]; only a piece whose sums match is decoded and written, so
    no byte of a changed piece reaches the cache. The piece's bytes are read twice, the second time from
    the cache of the SM that just read them.
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
    exp_ptr, se_n, se_l, got_ptr, sg_n, sg_l, pwords,  # VERIFY: expected, read sums [N, L, 2] int64;
                                                       # pwords: 32-bit words of a piece's packed bytes
    cb_ptr, rot_ptr,  # codebook [2**BITS], rotation Π[perm, :] [D, D] (f32 or f16)
    o_ptr, ooff_ptr, so_n, so_o, so_h, so_d,  # out [N, BS, H, D] (OUT_IDS: [NB, BS, H, D]) per layer
    BLOCK_SIZE: tl.constexpr, D: tl.constexpr, ROWS: tl.constexpr, IEEE: tl.constexpr,
    BITS: tl.constexpr, PG: tl.constexpr, BPG: tl.constexpr, NG: tl.constexpr, OUT_IDS: tl.constexpr,
    LAYERED: tl.constexpr, ALIGN: tl.constexpr, CHECKED: tl.constexpr, VERIFY: tl.constexpr,
    PTILE: tl.constexpr, NTILE: tl.constexpr,
):  # fmt: skip
    d = tl.arange(0, D)
    rot = tl.load(rot_ptr + d[:, None] * D + d[None, :])
    row_tiles = tl.cdiv(BLOCK_SIZE * H, ROWS)
    if VERIFY:
        for item in range(tl.program_id(0), L * num_ids, tl.num_programs(0)):
            layer = (item // num_ids).to(tl.int64)
            n = item % num_ids
            block = tl.load(ids_ptr + n).to(tl.int64)
            s1, s2 = _word_sums(
                (p_ptr + layer * sp_l + block * sp_b).to(tl.pointer_type(tl.int32)), pwords, 0, PTILE
            )
            norm_words = (n_ptr + layer * sn_l + block * sn_b).to(tl.pointer_type(tl.int32))
            t1, t2 = _word_sums(norm_words, BLOCK_SIZE * H, pwords, NTILE)
            s1 += t1
            s2 += t2
            got = got_ptr + n * sg_n + layer * sg_l
            tl.store(got, s1)
            tl.store(got + 1, s2)
            exp = exp_ptr + n * se_n + layer * se_l
            intact = (s1 == tl.load(exp)) & (s2 == tl.load(exp + 1))
            rows_kept = BLOCK_SIZE * H * intact.to(tl.int32)
            for tile in range(row_tiles):
                r = tile * ROWS + tl.arange(0, ROWS)
                _decode_rows(
                    p_ptr, sp_l, sp_b, sp_o, sp_h, sp_p, n_ptr, sn_l, sn_b, sn_o, sn_h, out_ids_ptr,
                    cb_ptr, rot, o_ptr, ooff_ptr, so_n, so_o, so_h, so_d,
                    layer, n, block, r, r < rows_kept, H,
                    D, ROWS, IEEE, BITS, PG, BPG, NG, OUT_IDS, LAYERED, ALIGN,
                )  # fmt: skip
    else:
        per_layer = num_ids * row_tiles
        for item in range(tl.program_id(0), L * per_layer, tl.num_programs(0)):
            layer = (item // per_layer).to(tl.int64)
            n = (item % per_layer) // row_tiles
            r = (item % row_tiles) * ROWS + tl.arange(0, ROWS)
            if CHECKED:  # noqa: SIM108 (constexpr branch); a refused block (ok 0) has no rows to write
                rmask = r < BLOCK_SIZE * H * tl.load(ok_ptr + n).to(tl.int32)
            else:
                rmask = r < BLOCK_SIZE * H
            block = tl.load(ids_ptr + n).to(tl.int64)
            _decode_rows(
                p_ptr, sp_l, sp_b, sp_o, sp_h, sp_p, n_ptr, sn_l, sn_b, sn_o, sn_h, out_ids_ptr,
                cb_ptr, rot, o_ptr, ooff_ptr, so_n, so_o, so_h, so_d,
                layer, n, block, r, rmask, H,
                D, ROWS, IEEE, BITS, PG, BPG, NG, OUT_IDS, LAYERED, ALIGN,
            )  # fmt: skip


@triton.jit
def _word_sums(words_ptr, count, base, CTILE: tl.constexpr):
    """(Σ w, Σ (base + j + 1) · w) over the count int32 words at words_ptr, zero-extended, wrapping int64."""
    s1 = tl.zeros([CTILE], dtype=tl.int64)  # per lane: one reduction at the end, no barrier per step
    s2 = tl.zeros([CTILE], dtype=tl.int64)
    for start in range(0, count, CTILE):
        j = start + tl.arange(0, CTILE)
        w = tl.load(words_ptr + j, mask=j < count, other=0).to(tl.uint32, bitcast=True).to(tl.int64)
        s1 += w
        s2 += w * (base + j.to(tl.int64) + 1)
    return tl.sum(s1, axis=0), tl.sum(s2, axis=0)


@triton.jit
def _decode_rows(
    p_ptr, sp_l, sp_b, sp_o, sp_h, sp_p, n_ptr, sn_l, sn_b, sn_o, sn_h, out_ids_ptr,
    cb_ptr, rot, o_ptr, ooff_ptr, so_n, so_o, so_h, so_d,
    layer, n, block, r, rmask, H,
    D: tl.constexpr, ROWS: tl.constexpr, IEEE: tl.constexpr, BITS: tl.constexpr, PG: tl.constexpr,
    BPG: tl.constexpr, NG: tl.constexpr, OUT_IDS: tl.constexpr, LAYERED: tl.constexpr, ALIGN: tl.constexpr,
):  # fmt: skip
    """Rows r (offset · H + head; rmask: those to write) of listed block n (stored block `block`) of one
    layer: decoded and stored in its destination."""
    d = tl.arange(0, D)
    offset = r // H
    h = r % H
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
