"""PTX text of the Gluon decode kernel (_decode_lut_kernel.py): centroid lookups from its shared-memory
table and the staging of packed words through shared memory (uniform 8-bit keys: _tables.UNIFORM8_ASM).
The CPU tests emulate the lookup text lane by lane and check the staging slots
(tests/kernels/test_decode_lut_ptx.py).

Modes: the key mode (4: nibble words, keys of 1–4 bits; 8: byte words, 5–8 bits; 9: uniform 8-bit keys by
arithmetic) and the value mode (4: nibble words, values of 1–4 bits; 8: byte words, 5–8 bits) set, with the
head_dim D (64 or 128), the words a token's operand takes (D/8 or D/4 per vector), hence its staging pieces
and slots and the kernel's shared memory. Pieces (a thread's copy unit, and its read-back unit): keys 16
bytes, or 8 (key mode 4 at D = 64); values D/16 bytes (value mode 4) or D/8 (value mode 8), one eighth of
a token's words.
"""

from __future__ import annotations

import functools
import math

LUT_BYTES = 256 * 256  # the table: 256 entries × 256 bytes, at offset 0 of shared memory


COMBINE_STATS_AT = 1024  # the combine's log-sum-exps ([≤ 16, 8] float32) at this byte of the last chunk
# The proxy fence that orders a thread's shared-memory accesses before later TMA writes (one per thread).
PROXY_FENCE_ASM = "fence.proxy.async.shared::cta; mov.b32 $0, 0;"
# Programmatic dependent launch: block until the previous kernel's writes are visible (a no-op without PDL).
GRID_WAIT_ASM = "griddepcontrol.wait; mov.b32 $0, 0;"


def combine_warp_bytes(head_dim: int = 128) -> int:
    """A warp's output [D, 8] float32 in the combine of the warps' partials."""
    return head_dim * 8 * 4


def key_words(key_mode: int, head_dim: int = 128) -> int:
    """Words of a token's key operand: nibbles (key mode 4) or bytes (8, 9) of its D coordinates."""
    return head_dim // 8 if key_mode == 4 else head_dim // 4


def value_words(value_mode: int, head_dim: int = 128) -> int:
    """Words of a token's value operand: nibbles (value mode 4) or bytes (8) of its D coordinates."""
    return head_dim * value_mode // 32


def key_piece_words(key_mode: int, head_dim: int = 128) -> int:
    """Words of a key piece: 4 (16 bytes), or 2 where a token has 8 words (key mode 4 at D = 64), a thread
    holding a quarter of each of its tokens' words (mma's operand A: 4 lanes of a row)."""
    return min(4, key_words(key_mode, head_dim) // 4)


def shared_bytes(warps: int, tile: int, key_mode: int, value_mode: int, head_dim: int = 128) -> int:
    """The kernel's shared memory, in 8 KiB chunks: the table; each warp's staging of one tile (TMA or
    cp.async), the same bytes holding the warps' outputs (D·32 bytes each) in the combine between items; a
    last chunk: the TMA path's mbarriers, then the combine's log-sum-exps at COMBINE_STATS_AT (the kernel
    computes it as a constexpr function, which may call no other function). A token's slots: D/2 (mode 4) or
    D (8, 9) key bytes and D·value_mode/8 value bytes. At the default launch (8 warps, 16-token tiles) 104
    KiB at D = 128 for every mode (the combine's 32 KiB covers the largest staging, key and value mode 8:
    8 × 16 × 256 bytes), 88 KiB at D = 64 (the combine's 16 KiB): two programs fit an H100/H200 SM's 228
    KiB either way."""
    token = head_dim * ((4 if key_mode == 4 else 8) + value_mode) // 8
    slots = max(warps * tile * token, warps * head_dim * 32)
    return LUT_BYTES + -(-slots // 8192) * 8192 + 8192


def warp_slot_bytes(tile: int, key_mode: int, value_mode: int, head_dim: int = 128) -> int:
    """A warp's staging slots of one tile, either path (the kernel's WARP_BYTES): its key slots (D/2 or D
    bytes a token), then its value slots (D·value_mode/8 bytes a token); a constexpr function too."""
    return tile * head_dim * ((4 if key_mode == 4 else 8) + value_mode) // 8


def box_pitch(row_bytes: int) -> int:
    """A token's row in the TMA boxes and staging slots: its packed bytes (`row_bytes`) rounded up to 16, the
    box rows' unit (the flat form's rows: the head's bytes, then the next head's or zeros); a constexpr
    function too. Never more than the token's slot: D/2 or D key bytes, D·value_mode/8 value bytes."""
    return (row_bytes + 15) // 16 * 16


def fill_asm(rows_per_thread: int) -> str:
    """The table fill of a program of LUT_BYTES / 128 / rows_per_thread threads: thread i writes rows
    i + threads·j (j < n = rows_per_thread; $n + j: the row's word; $j: unused output), each the 32 lanes'
    copies of its word as eight 16-byte stores, lane l writing chunk (k + l) mod 8 at step k so that a
    quarter warp's stores meet distinct banks."""
    n = rows_per_thread
    threads = LUT_BYTES // 128 // n
    lines = ["{", ".reg .b32 t, l, c, s;", "mov.u32 t, %tid.x;", "shl.b32 t, t, 7;",
             "mov.u32 s, global_smem;", "add.u32 t, t, s;", "mov.u32 l, %laneid;"]  # fmt: skip
    for k in range(8):
        lines += [f"add.u32 c, l, {k};", "and.b32 c, c, 7;", "shl.b32 c, c, 4;", "add.u32 c, c, t;"]
        for j in range(n):
            word = f"${n + j}"
            lines.append(f"st.shared.v4.b32 [c+{j * threads * 128}], {{{word}, {word}, {word}, {word}}};")
    return " ".join([*lines, *(f"mov.b32 ${j}, 0;" for j in range(n)), "}"])


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
    """One word of 4-bit key indices ($4; $5: the same word, $6, $7: the table probe, unused) → packed
    float16 pairs $0 … $3, output b holding (c[nibble 0], c[nibble 1]) of byte b."""
    lines = ["{", *_lane_prologue()]
    for b in range(4):
        lines += _lookup("$4", b, offset, f"${b}")
    return " ".join([*lines, "}"])


@functools.cache
def v4_asm(offset: int) -> str:
    """The same word of 4-bit value indices of tokens 2t ($8; $9 the same) and 2t+1 ($10; $11 the same;
    $12, $13: the probe, unused) → packed float16 pairs $0 … $7, output n holding (token 2t, token 2t+1) of
    nibble n (0 … 7). Nibbles are paired across the two tokens (lop3: (a & 0x0f…) | (b & 0xf0…)) so one
    lookup yields the pair."""
    lines = ["{", *_lane_prologue(), ".reg .b32 lo, hi, t;", "shl.b32 t, $10, 4;",
             "lop3.b32 lo, $8, t, 0x0f0f0f0f, 0xE4;", "shr.u32 t, $8, 4;",
             "lop3.b32 hi, t, $10, 0x0f0f0f0f, 0xE4;"]  # fmt: skip
    for b in range(4):
        for h, reg in enumerate(("lo", "hi")):
            lines += _lookup(reg, b, offset, f"${2 * b + h}")
    return " ".join([*lines, "}"])


@functools.cache
def v8_asm(offset: int) -> str:
    """The same word of 8-bit value indices of tokens 2t ($4; $5 the same) and 2t+1 ($6; $7 the same; $8,
    $9: the probe, unused) → packed float16 pairs $0 … $3, output b holding (token 2t, token 2t+1) of byte
    b: one lookup per token in the table's low halves, the two centroids packed by prmt."""
    lines = ["{", *_lane_prologue(), ".reg .b32 y;"]
    for b in range(4):
        lines += [*_lookup("$4", b, offset, "x"), *_lookup("$6", b, offset, "y")]
        lines.append(f"prmt.b32 ${b}, x, y, 0x5410;")
    return " ".join([*lines, "}"])


@functools.cache
def k8_asm(offset: int) -> str:
    """One word of 8-bit key indices ($2; $3: the same word, $4, $5: the probe, unused) → packed float16
    pairs $0 (centroids of bytes 0, 1) and $1 (bytes 2, 3), from the table's low halves."""
    lines = ["{", *_lane_prologue(), ".reg .b32 y;"]
    for pair in range(2):
        lines += [*_lookup("$2", 2 * pair, offset, "x"), *_lookup("$2", 2 * pair + 1, offset, "y")]
        lines.append(f"prmt.b32 ${pair}, x, y, 0x5410;")
    return " ".join([*lines, "}"])


# Staging, in PTX the compiler does not see: its barrier analysis would put a CTA barrier around every tile,
# while each thread only ever reads back the pieces it copied itself, so its own wait orders them. Each warp
# owns `warp_bytes` after the table: its key pieces, then its value pieces. Piece p of a thread (its p-th
# register of the piece tensor) of lane l sits at byte start + p·(32·size) + l·size of its warp's keys or
# values, so a warp's copies and reads of one piece are one contiguous run (no bank conflicts). One asm call
# takes all of a thread's pieces (pack = pieces).
def _slot_prologue(start: int, size: int, warp_bytes: int) -> list[str]:
    return [
        ".reg .b32 b, w;", "mov.u32 w, %tid.x;", "shr.u32 w, w, 5;", "mov.u32 b, %laneid;",
        f"mul.lo.u32 w, w, {warp_bytes};", f"mad.lo.u32 b, b, {size}, w;", "mov.u32 w, global_smem;",
        "add.u32 b, b, w;", f"add.u32 b, b, {LUT_BYTES + start};",
    ]  # fmt: skip


def _stage_asm(start: int, size: int, pieces: int, warp_bytes: int, commit: bool) -> str:
    """$0 … $n−1: unused; $n + p: global address of piece p; $2n + p: copy it if ≠ 0 (n = pieces)."""
    cache = "cg" if size == 16 else "ca"
    lines = ["{", ".reg .pred q;", *_slot_prologue(start, size, warp_bytes)]
    for p in range(pieces):
        lines += [
            f"setp.ne.b32 q, ${2 * pieces + p}, 0;",
            f"@q cp.async.{cache}.shared.global [b+{p * 32 * size}], [${pieces + p}], {size};",
            f"mov.b32 ${p}, 0;",
        ]
    if commit:
        lines.append("cp.async.commit_group;")
    return " ".join([*lines, "}"])


def _load_words(regs: list[str], address: str) -> str:
    """ld.shared of len(regs) (1, 2 or 4) words at `address` into regs."""
    if len(regs) == 1:
        return f"ld.shared.b32 {regs[0]}, {address};"
    return f"ld.shared.v{len(regs)}.b32 {{{', '.join(regs)}}}, {address};"


def _unstage_asm(start: int, size: int, pieces: int, warp_bytes: int, wait: bool) -> str:
    """Piece p's words → $p (, $n + p, …) (n = pieces); the next n operands: unused. With `wait`, first
    waits for all of this thread's copies."""
    words = size // 4
    lines = ["{", *(["cp.async.wait_all;"] if wait else []), *_slot_prologue(start, size, warp_bytes)]
    for p in range(pieces):
        lines.append(_load_words([f"${k * pieces + p}" for k in range(words)], f"[b+{p * 32 * size}]"))
    return " ".join([*lines, "}"])


def key_pieces(tile: int, key_mode: int, head_dim: int = 128) -> tuple[int, int]:
    """(key pieces per thread, piece bytes): each thread holds a quarter of the words of tile/8 tokens."""
    size = 4 * key_piece_words(key_mode, head_dim)
    return tile // 8 * key_words(key_mode, head_dim) // size, size


def value_pieces(tile: int, value_mode: int, head_dim: int = 128) -> tuple[int, int]:
    """(value pieces per thread, piece bytes): each thread holds an eighth of the words of tile/4 tokens."""
    return tile // 4, value_words(value_mode, head_dim) * 4 // 8


@functools.cache
def staging_asm(tile: int, key_mode: int, value_mode: int, head_dim: int = 128) -> tuple[str, str, str, str]:
    """(key stage, value stage, key unstage, value unstage) PTX for `tile`-token tiles: key pieces of 16
    bytes, or 8 (key_pieces), (tile/8)·(1 or 2) per thread; value pieces of D/16 or D/8 bytes (value mode
    4 or 8: a token's eighth), tile/4 per thread."""
    kp, ksize = key_pieces(tile, key_mode, head_dim)
    vp, vsize = value_pieces(tile, value_mode, head_dim)
    key_bytes = kp * 32 * ksize
    warp_bytes = warp_slot_bytes(tile, key_mode, value_mode, head_dim)
    return (
        _stage_asm(0, ksize, kp, warp_bytes, commit=False),
        _stage_asm(key_bytes, vsize, vp, warp_bytes, commit=True),
        _unstage_asm(0, ksize, kp, warp_bytes, wait=True),
        _unstage_asm(key_bytes, vsize, vp, warp_bytes, wait=False),
    )


# TMA staging (sm_90+): each warp's tiles arrive as TMA boxes (one block piece of one kv head: R = min(block
# size, tile) tokens × the box pitch, box_pitch of the packed bytes), issued by lane j for box j, completing
# on the warp's mbarrier; every lane arrives once per tile with the bytes its box brings. A warp's slots: its
# key boxes (token m's row at m·pitch), then its value boxes (at tile·Sk + m·pitch; Sk: a token's key slot).
# Native-form maps (_tensor_map.box_map: rows of a multiple of 16 bytes) swizzle each row's 16-byte chunks
# (64-byte rows: chunk c of row m at c ^ ((m >> 1) & 3); 128-byte rows: at c ^ (m & 7); other rows as they
# are); flat-form maps (other rows) write them unswizzled, each row's packed bytes followed by the next head's
# (or zeros) up to the pitch. The mbarriers (8 bytes per warp) open the last 8 KiB chunk (shared_bytes).


def _mbarrier(warps: int, tile: int, key_mode: int, value_mode: int, head_dim: int = 128) -> list[str]:
    """m ← the shared address of this warp's mbarrier; s ← global_smem."""
    start = shared_bytes(warps, tile, key_mode, value_mode, head_dim) - 8192
    return [
        "mov.u32 s, global_smem;", "mov.u32 m, %tid.x;", "shr.u32 m, m, 5;", "shl.b32 m, m, 3;",
        "add.u32 m, m, s;", f"add.u32 m, m, {start};",
    ]  # fmt: skip


@functools.cache
def tma_init_asm(warps: int, tile: int, key_mode: int, value_mode: int, head_dim: int = 128) -> str:
    """Lane 0 of each warp initialises its mbarrier for 32 arrivals, then the warp syncs ($0: unused)."""
    return " ".join([
        "{", ".reg .b32 s, m, l;", ".reg .pred p;", *_mbarrier(warps, tile, key_mode, value_mode, head_dim),
        "mov.u32 l, %laneid;", "setp.eq.u32 p, l, 0;", "@p mbarrier.init.shared::cta.b64 [m], 32;",
        "fence.mbarrier_init.release.cluster;", "bar.warp.sync -1;", "mov.b32 $0, 0;", "}",
    ])  # fmt: skip


@functools.cache
def tma_stage_asm(warps: int, tile: int, key_mode: int, value_mode: int, head_dim: int = 128) -> str:
    """One lane's TMA box of a tile and its arrival on the warp's mbarrier expecting the box's bytes ($1: the
    tensor map's global address; $2 … $5: the box's four coordinates, innermost first: {0, head, offset in
    its block, block} in a native-form map, {head·P, offset, block, 0} in a flat-form one; $6: its shared
    offset from global_smem; $7: its bytes, 0 for no box; $0: unused). The proxy fence and the warp sync
    order every lane's earlier reads of the slots before the boxes overwrite them."""
    return " ".join([
        "{", ".reg .b32 s, m, x;", ".reg .pred p;", ".reg .b64 st;",
        *_mbarrier(warps, tile, key_mode, value_mode, head_dim),
        "fence.proxy.async.shared::cta;", "bar.warp.sync -1;",
        "mbarrier.arrive.expect_tx.shared::cta.b64 st, [m], $7;", "setp.ne.u32 p, $7, 0;",
        "add.u32 x, $6, s;",
        "@p cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [x], [$1, {$2, $3, $4, $5}], [m];",
        "mov.b32 $0, 0;", "}",
    ])  # fmt: skip


def native_bits(mode: int) -> int:
    """The width whose packed words a key or value mode's operand takes as they are: 4 (nibbles) or 8
    (bytes)."""
    return 4 if mode == 4 else 8


@functools.cache
def tma_unstage_asm(
    warps: int, tile: int, key_mode: int, value_mode: int, k_bits: int | None = None,
    v_bits: int | None = None, head_dim: int = 128,
) -> tuple[str, str]:  # fmt: skip
    """(keys, values) read-back PTX. Keys: waits for the phase of parity $(k+1)n of this warp's mbarrier,
    then reads piece p (k = 4 words, or 2: key_pieces) at shared offset $kn + p into $p, $n + p, …
    (n: key pieces per thread). Values: piece p (k = D/64 words of nibbles in value mode 4, D/32 of bytes in
    value mode 8) at offset $kn + p into $p, $n + p, … (n: value pieces per thread); no wait (the keys' wait
    covers the tile). Offsets are from global_smem. Widths other than the mode's own (k_bits, v_bits; None:
    the mode's own): each piece's packed bits are read from the byte offset of its first field and spread
    into the words the mode takes (spread_piece_asm)."""
    n, size = key_pieces(tile, key_mode, head_dim)
    words = size // 4
    keys = ["{", ".reg .b32 s, m, b;", ".reg .pred p;",
            *_mbarrier(warps, tile, key_mode, value_mode, head_dim), "WAIT_${:uid}:",
            f"mbarrier.try_wait.parity.shared::cta.b64 p, [m], ${(words + 1) * n};",
            "@!p bra WAIT_${:uid};"]  # fmt: skip
    keys += _read_pieces(key_mode, k_bits, n, words)
    values = ["{", ".reg .b32 s, b;", "mov.u32 s, global_smem;"]
    n, size = value_pieces(tile, value_mode, head_dim)
    values += _read_pieces(value_mode, v_bits, n, size // 4)
    return " ".join([*keys, "}"]), " ".join([*values, "}"])


def _read_pieces(mode: int, bits: int | None, n: int, words: int) -> list[str]:
    """Read back n pieces of `words` words of a mode's operand words (s: global_smem set): piece p from
    shared offset ${words·n + p} into $p, $n + p, …; widths other than the mode's own spread."""
    outputs = [[f"${k * n + p}" for k in range(words)] for p in range(n)]
    offsets = [f"${words * n + p}" for p in range(n)]
    if bits is None or bits == native_bits(mode):
        lines = []
        for out, offset in zip(outputs, offsets, strict=True):
            lines += [f"add.u32 b, {offset}, s;", _load_words(out, "[b]")]
        return lines
    return [spread_piece_asm(bits, 8 if mode == 4 else 4, n, outputs, offsets)]


# Widths other than 4 and 8 (packed bits of the natural bitstream: field j of a vector at bits j·b …) reach
# the operands as the words of the 4- or 8-bit path: each piece's fields are spread into 4-bit (nibble) or
# 8-bit (byte) slots, a field in the low bits of its slot and whatever bits followed it above. The tables
# repeat every 2^b entries (_tables.f16_pair_lut, f16_byte_lut), so those bits select nothing.
def spread_piece_asm(
    bits: int, fields: int, pieces: int, outputs: list[list[str]], offsets: list[str]
) -> str:  # fmt: skip
    """Read and spread `pieces` pieces (s: global_smem set): piece p's first field at shared byte offset
    offsets[p], its len(outputs[p]) words of `fields` fields each, `32 // fields`-bit slots, into outputs[p].
    Pieces are whole bytes laid end to end from a 4-byte aligned row, so a piece starts at a multiple of
    gcd(piece bits, 32) bits into a word (0 for pieces of whole words; 0 or 16 for whole half words; else any
    byte); it reads, from the piece's first word, the words a piece at the latest such start spans, which
    may reach a few bytes past the piece (the caller's rows keep them inside shared memory)."""
    slot = 32 // fields
    piece_bits = len(outputs[0]) * fields * bits
    assert piece_bits % 8 == 0
    latest = 32 - math.gcd(piece_bits, 32)  # the latest bit of a word a piece can start at
    words = -(-(piece_bits + latest) // 32)
    regs = ", ".join(f"w{i}" for i in range(words))
    lines = ["{", f".reg .b32 a, g, x, {regs};"]
    for p in range(pieces):
        if latest:
            lines += [f"and.b32 a, {offsets[p]}, 3;", "shl.b32 a, a, 3;",
                      f"and.b32 b, {offsets[p]}, 0xfffffffc;", "add.u32 b, b, s;"]  # fmt: skip
        else:
            lines.append(f"add.u32 b, {offsets[p]}, s;")
        lines += [f"ld.shared.b32 w{i}, [b+{4 * i}];" for i in range(words)]
        if latest:  # the piece's bits from bit 0 of w0 (the last word's high bits: beyond the piece)
            lines += [f"shf.r.clamp.b32 w{i}, w{i}, w{i + 1}, a;" for i in range(words - 1)]
            lines.append(f"shr.u32 w{words - 1}, w{words - 1}, a;")
        for k, out in enumerate(outputs[p]):
            start = k * fields * bits
            lines += _field_group(start, fields * bits)
            lines += spread_lines("g", out, bits, slot, fields)
    return " ".join([*lines, "}"])


def _field_group(start: int, width: int) -> list[str]:
    """g ← bits start … start + width − 1 of the little-endian words w0, w1, … (at bit 0; garbage above)."""
    q, s = divmod(start, 32)
    if s == 0:
        return [f"mov.b32 g, w{q};"]
    if s + width <= 32:
        return [f"shr.u32 g, w{q}, {s};"]
    return [f"shf.r.clamp.b32 g, w{q}, w{q + 1}, {s};"]


def spread_lines(src: str, dst: str, bits: int, slot: int, fields: int) -> list[str]:
    """dst ← the `fields` `bits`-wide fields at bit 0 of src (fields · slot = 32), field i in the low bits
    of bits slot·i … slot·i + slot − 1 (x: scratch). Halving steps: the upper half of the fields of every
    region moves up to the region's middle, one shift and one bitwise select each."""
    lines, current, half = [], src, fields // 2
    while half:
        region = 2 * half * slot
        keep = sum(((1 << (half * slot)) - 1) << r for r in range(0, 32, region))
        lines += [f"shl.b32 x, {current}, {half * (slot - bits)};",
                  f"lop3.b32 {dst}, {current}, x, {keep:#010x}, 0xE4;"]  # fmt: skip
        current, half = dst, half // 2
    return lines if current == dst else [*lines, f"mov.b32 {dst}, {current};"]
