"""PTX text of the Gluon decode kernel (_decode_lut_kernel.py): centroid lookups from its shared-memory
table and the staging of packed words through shared memory (uniform 8-bit keys: _tables.UNIFORM8_ASM).
The CPU tests emulate the lookup text lane by lane and check the staging slots
(tests/kernels/test_decode_lut_ptx.py).
"""

from __future__ import annotations

import functools

LUT_BYTES = 256 * 256  # the table: 256 entries × 256 bytes, at offset 0 of shared memory


def shared_bytes(warps: int, tile: int, key_mode: int) -> int:
    """The kernel's shared memory: the table, then each warp's staging of one tile's packed key and value
    words (16 or 32 and 16 words per token)."""
    return LUT_BYTES + warps * tile * ((16 if key_mode == 4 else 32) + 16) * 4


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


def _unstage_asm(start: int, size: int, pieces: int, warp_bytes: int, wait: bool) -> str:
    """Piece p's words → $p, $n + p (, $2n + p, $3n + p) (n = pieces); the next n operands: unused. With
    `wait`, first waits for all of this thread's copies."""
    words = size // 4
    lines = ["{", *(["cp.async.wait_all;"] if wait else []), *_slot_prologue(start, size, warp_bytes)]
    for p in range(pieces):
        regs = ", ".join(f"${k * pieces + p}" for k in range(words))
        lines.append(f"ld.shared.v{words}.b32 {{{regs}}}, [b+{p * 32 * size}];")
    return " ".join([*lines, "}"])


@functools.cache
def staging_asm(tile: int, key_mode: int) -> tuple[str, str, str, str]:
    """(key stage, value stage, key unstage, value unstage) PTX for `tile`-token tiles: 16-byte key pieces
    ((tile/8)·(1 or 2) per thread), 8-byte value pieces (tile/4 per thread)."""
    kp, vp = tile // 8 * (1 if key_mode == 4 else 2), tile // 4
    key_bytes = kp * 32 * 16
    warp_bytes = key_bytes + vp * 32 * 8
    return (
        _stage_asm(0, 16, kp, warp_bytes, commit=False),
        _stage_asm(key_bytes, 8, vp, warp_bytes, commit=True),
        _unstage_asm(0, 16, kp, warp_bytes, wait=True),
        _unstage_asm(key_bytes, 8, vp, warp_bytes, wait=False),
    )
