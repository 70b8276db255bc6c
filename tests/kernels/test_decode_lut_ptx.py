"""The Gluon decode kernel's inline PTX (which only a GPU runs), checked by emulating its text per lane:
the shared-memory table lookups against the codebooks, the uniform 8-bit keys, the Pᵀ packing, the staging
slots and read-backs; the TMA boxes of its tensor maps, loaded in numpy; and the value operand's
relabelling, simulated in numpy."""

import random
import re

import numpy as np
import pytest
import torch
from kernel_cases import codec
from ptx_emulation import run_ptx

from tiercache.kernels import DecodeLaunchConfig, decode_lut
from tiercache.kernels._tables import UNIFORM8_ASM, decode_lut_table, f16_byte_lut, f16_pair_lut
from tiercache.kernels.packing import pack_indices

if not decode_lut.HAVE_GLUON:
    pytest.skip("this Triton has no Gluon", allow_module_level=True)
from tiercache.kernels import _decode_lut_kernel as lut
from tiercache.kernels import _decode_lut_ptx as lut_ptx
from tiercache.kernels import _tensor_map


def shared_table(k_codec, v_codec, key_mode: int) -> tuple[np.ndarray, int, int]:
    """The kernel's shared memory as words: entry e, table t, lane l at word e·64 + 32·t + l."""
    table, k_off, v_off = decode_lut_table(k_codec, v_codec, key_mode, torch.device("cpu"))
    words = table.numpy().astype(np.int64) & 0xFFFFFFFF
    return np.repeat(words[:, :, None], 32, axis=2).reshape(-1), k_off, v_off


def f16_bits(x: torch.Tensor) -> list[int]:
    return [int(b) & 0xFFFF for b in x.to(torch.float16).view(torch.int16).tolist()]


def halves(word: int) -> tuple[int, int]:
    """A packed float16 pair's (low, high) halves."""
    return word & 0xFFFF, word >> 16


WORDS = [0, 0xFFFFFFFF, 0x76543210, 0xFEDCBA98] + [random.Random(0).getrandbits(32) for _ in range(200)]


@pytest.mark.parametrize("same_codebook", [True, False])
def test_k4_lookup_gives_both_nibbles_centroids(same_codebook):
    kc, vc = codec(128, 4, 1), codec(128, 4, 1 if same_codebook else 2)
    shared, k_off, _ = shared_table(kc, vc, 4)
    cb = f16_bits(kc.codebook)
    asm = lut.k4_asm(k_off)
    for i, word in enumerate(WORDS):
        lane = i % 32
        regs = run_ptx(asm, {"$4": word, "$5": word, "$6": 0, "$7": 0}, lane, shared)
        for b in range(4):
            byte = (word >> (8 * b)) & 0xFF
            assert halves(regs[f"${b}"]) == (cb[byte & 15], cb[byte >> 4])


def test_v4_lookup_pairs_two_tokens_of_one_coordinate():
    kc, vc = codec(128, 4, 1), codec(128, 4, 2)
    shared, _, v_off = shared_table(kc, vc, 4)
    cb = f16_bits(vc.codebook)
    asm = lut.v4_asm(v_off)
    rng = random.Random(1)
    for i, wa in enumerate(WORDS):
        wb, lane = rng.getrandbits(32), i % 32
        regs = run_ptx(asm, {"$8": wa, "$9": wa, "$10": wb, "$11": wb, "$12": 0, "$13": 0}, lane, shared)
        for n in range(8):  # nibble n of the word = coordinate n, for token 2t (wa) and 2t+1 (wb)
            want = (cb[(wa >> (4 * n)) & 15], cb[(wb >> (4 * n)) & 15])
            assert halves(regs[f"${n}"]) == want


@pytest.mark.parametrize("v_bits", [5, 6, 7, 8])
@pytest.mark.parametrize("k_bits,key_mode", [(4, 4), (8, 8), (8, 9)])
def test_v8_lookup_pairs_two_tokens_byte_centroids(v_bits, k_bits, key_mode):
    """v8_asm: byte b of the same word of tokens 2t ($4) and 2t+1 ($6) → (c[index 2t], c[index 2t+1]), the
    index in the byte's low v_bits bits (the bits above, garbage as spread slots leave them, select
    nothing), from the value table next to each kind of key table."""
    kc, vc = codec(128, k_bits, 1), codec(128, v_bits, 2)
    shared, k_off, v_off = shared_table(kc, vc, key_mode)
    assert v_off == 0 and k_off == (0 if key_mode == 9 or (key_mode == 8 and v_bits == 8) else 128)
    cb, mask = f16_bits(vc.codebook), (1 << v_bits) - 1
    asm = lut.v8_asm(v_off)
    rng = random.Random(v_bits)
    for i, wa in enumerate(WORDS):
        wb, lane = rng.getrandbits(32), i % 32
        regs = run_ptx(asm, {"$4": wa, "$5": wa, "$6": wb, "$7": wb, "$8": 0, "$9": 0}, lane, shared)
        for b in range(4):  # byte b of the word = coordinate 4w + b, for token 2t (wa) and 2t+1 (wb)
            want = (cb[(wa >> (8 * b)) & mask], cb[(wb >> (8 * b)) & mask])
            assert halves(regs[f"${b}"]) == want


def test_k8_lookup_and_uniform_keys():
    kc, vc = codec(128, 8, 1), codec(128, 4, 2)
    shared, k_off, _ = shared_table(kc, vc, 8)
    assert k_off == 128
    cb = f16_bits(kc.codebook)
    for i, word in enumerate(WORDS):
        operands = {"$2": word, "$3": word, "$4": 0, "$5": 0}
        regs = run_ptx(lut.k8_asm(k_off), operands, i % 32, shared)
        assert [*halves(regs["$0"]), *halves(regs["$1"])] == [cb[(word >> (8 * b)) & 0xFF] for b in range(4)]
        regs = run_ptx(UNIFORM8_ASM, operands, i % 32, shared)
        got = np.array([*halves(regs["$0"]), *halves(regs["$1"])], dtype=np.uint16).view(np.float16)
        assert [float(x) for x in got] == [((word >> (8 * b)) & 0xFF) - 128 for b in range(4)]


def test_lut_tables_hold_float16_centroids():
    c4, c8 = codec(128, 4, 1), codec(128, 8, 1)
    pair = f16_pair_lut(c4.codebook).view(torch.int16).view(torch.float16).view(256, 2)
    e = torch.arange(256)
    assert torch.equal(pair[:, 0], c4.codebook[e & 15].half())
    assert torch.equal(pair[:, 1], c4.codebook[e >> 4].half())
    byte = f16_byte_lut(c8.codebook).view(torch.int16).view(torch.float16).view(256, 2)
    assert torch.equal(byte[:, 0], c8.codebook.half())


def test_lut_tables_by_value_mode():
    """decode_lut_table: the value table is column 0 (pair table for 1–4 bits, byte table for 5–8), the key
    table column 1, which repeats the values' where they are equal (the key offset then 0) or where uniform
    8-bit keys need none."""
    for v_bits in (3, 4, 5, 8):
        vc = codec(128, v_bits, 2)
        want_v = (f16_pair_lut if v_bits <= 4 else f16_byte_lut)(vc.codebook)
        for kc, key_mode, want_k in [(codec(128, 4, 1), 4, f16_pair_lut(codec(128, 4, 1).codebook)),
                                     (codec(128, 8, 1), 8, f16_byte_lut(codec(128, 8, 1).codebook)),
                                     (codec(128, 8, 1), 9, want_v)]:  # fmt: skip
            table, k_off, v_off = decode_lut_table(kc, vc, key_mode, torch.device("cpu"))
            assert table.shape == (256, 2) and table.dtype == torch.int32
            assert torch.equal(table[:, 0], want_v) and torch.equal(table[:, 1], want_k)
            assert v_off == 0 and k_off == (0 if torch.equal(want_k, want_v) else 128)


def test_pt_fragment_is_the_transposed_block():
    """PT_ASM packs heads 2t, 2t+1 of token row g and transposes the 8×8 block across the warp: lane (g, t)
    ends with (token 2t, head g) in its low half and (token 2t+1, head g) in its high half."""
    rng = np.random.default_rng(0)
    scores = rng.random((8, 8), dtype=np.float32)  # [token, head]
    packed = {}
    for lane in range(32):  # the pack: cvt.rn.f16x2.f32 x, $3 (odd head), $2 (even head)
        g, t = lane // 4, lane % 4
        even, odd = np.float16(scores[g, 2 * t]), np.float16(scores[g, 2 * t + 1])
        packed[lane] = int(np.array([even], np.float16).view(np.uint16)[0]) | (
            int(np.array([odd], np.float16).view(np.uint16)[0]) << 16
        )
    assert "cvt.rn.f16x2.f32 x, $3, $2" in lut.PT_ASM.value  # d = {a → high half, b → low half}
    for lane in range(32):  # movmatrix.trans: lane (g, t) receives element (2t + c, g) of the source
        g, t = lane // 4, lane % 4
        # source (row r, column k) sits in lane 4r + k // 2, half k % 2
        halves = [(packed[4 * (2 * t + c) + g // 2] >> (16 * (g % 2))) & 0xFFFF for c in range(2)]
        got = np.array(halves, dtype=np.uint16).view(np.float16)
        assert list(got) == [np.float16(scores[2 * t + c, g]) for c in range(2)]


@pytest.mark.parametrize("warps", [4, 8])
def test_table_fill_writes_every_lane_copy_without_bank_conflicts(warps):
    """fill_asm run for every thread yields the kernel's table layout (row r: 32 copies of word r), and the
    16-byte stores of each quarter warp at each step meet 8 distinct 16-byte bank groups."""
    rows = lut.LUT_BYTES.value // 128
    per_thread, threads = rows // (32 * warps), 32 * warps
    asm = lut.fill_asm(per_thread)
    words = np.random.default_rng(0).integers(0, 2**32, rows, dtype=np.int64)
    shared = np.full(rows * 32, -1, dtype=np.int64)
    for tid in range(threads):
        inputs = {f"${per_thread + j}": int(words[tid + threads * j]) for j in range(per_thread)}
        run_ptx(asm, inputs, tid % 32, shared, warp=tid // 32)
    assert (shared.reshape(rows, 32) == words[:, None]).all()
    for quarter in range(4):  # the i-th store of the 8 lanes of a quarter warp: distinct 16-byte bank groups
        order = [_store_addresses(asm, per_thread, lane) for lane in range(8 * quarter, 8 * quarter + 8)]
        for i in range(8 * per_thread):
            assert len({lane_stores[i] % 128 for lane_stores in order}) == 8


class _StoreLog:
    """Shared memory that records the byte address of each store."""

    def __init__(self):
        self.addresses = []

    def __setitem__(self, words: slice, values):
        self.addresses.append(4 * words.start)


def _store_addresses(asm: str, per_thread: int, lane: int) -> list[int]:
    log = _StoreLog()
    run_ptx(asm, {f"${per_thread + j}": 0 for j in range(per_thread)}, lane, log)
    return log.addresses


_MEMORY_OPS = re.compile(r"(cp\.async|ld\.shared\.|setp|@q|mov\.b32 \$)")


def staging_slots(asm: str, warps: int) -> dict[tuple[int, int, int], int]:
    """(warp, lane, piece) → shared byte offset of that piece's slot: the PTX's slot arithmetic run per lane
    (global_smem at 0), plus each copy's or read's offset in the order they appear."""
    arithmetic = "; ".join(i for i in asm.strip("{} ").split(";") if not _MEMORY_OPS.search(i))
    offsets = [int(x) for x in re.findall(r"\[b\+(\d+)\]", asm)]
    slots = {}
    for w in range(warps):
        for lane in range(32):
            base = run_ptx(arithmetic, {}, lane, warp=w)["b"]
            slots.update({(w, lane, p): base + off for p, off in enumerate(offsets)})
    return slots


def token_bytes(key_mode: int, value_mode: int, head_dim: int) -> int:
    """A token's key and value operand words in bytes: D/2 or D (key mode 4 or 8, 9), D·value_mode/8."""
    return head_dim // 8 * ((4 if key_mode == 4 else 8) + value_mode)


# tile, key mode, value mode, warps, head_dim
STAGING_CASES = [(32, 4, 4, 4, 128), (32, 8, 4, 8, 128), (64, 4, 4, 4, 128), (64, 9, 4, 8, 128),
                 (16, 4, 4, 16, 128), (16, 4, 8, 8, 128), (16, 8, 8, 8, 128), (32, 9, 8, 4, 128),
                 (64, 8, 8, 2, 128), (16, 4, 8, 16, 128), (16, 4, 4, 8, 64), (32, 4, 8, 4, 64),
                 (16, 8, 4, 8, 64), (64, 9, 8, 2, 64), (16, 8, 8, 16, 64), (32, 9, 4, 4, 64)]  # fmt: skip


@pytest.mark.parametrize("tile,key_mode,value_mode,warps,head_dim", STAGING_CASES)
def test_staging_slots_fit_and_never_overlap(tile, key_mode, value_mode, warps, head_dim):
    """Each piece of every thread has its own slot past the table and inside the kernel's shared memory; the
    copy and the read of a piece use the same slots; a warp's 32 lanes of one piece are contiguous. Key
    pieces: 16 bytes (8 in key mode 4 at head_dim 64); value pieces: a token's eighth, D/16 bytes (value
    mode 4) or D/8 (8)."""
    k_stage, v_stage, k_unstage, v_unstage = lut.staging_asm(tile, key_mode, value_mode, head_dim)
    assert staging_slots(k_stage, warps) == staging_slots(k_unstage, warps)
    assert staging_slots(v_stage, warps) == staging_slots(v_unstage, warps)
    k_size = 8 if (key_mode, head_dim) == (4, 64) else 16
    v_size = head_dim * value_mode // 64
    for stage, unstage, size in ((k_stage, k_unstage, k_size), (v_stage, v_unstage, v_size)):
        assert f"cp.async.{'cg' if size == 16 else 'ca'}.shared.global [b+0], [$" in stage
        assert ("ld.shared.b32 $0," if size == 4 else f"ld.shared.v{size // 4}.b32 {{$0,") in unstage
    pieces = [(staging_slots(k_stage, warps), k_size), (staging_slots(v_stage, warps), v_size)]
    key_bytes = token_bytes(key_mode, 4, head_dim) - head_dim // 2  # a token's key words
    assert len(pieces[0][0]) == warps * 32 * tile // 8 * key_bytes // (4 * k_size)  # a quarter per thread
    assert len(pieces[1][0]) == warps * 32 * tile // 4
    covered = np.zeros(lut.shared_bytes(warps, tile, key_mode, value_mode, head_dim), dtype=np.int64)
    for slots, size in pieces:
        for (w, lane, p), start in slots.items():
            assert start % size == 0 and start >= lut.LUT_BYTES.value
            covered[start : start + size] += 1
            if lane:
                assert start == slots[(w, lane - 1, p)] + size
    slot_end = lut.LUT_BYTES.value + warps * tile * token_bytes(key_mode, value_mode, head_dim)
    assert (covered[lut.LUT_BYTES.value : slot_end] == 1).all()  # the staging fills its part exactly once
    assert not covered[slot_end:].any() and slot_end <= len(covered) - 8192  # and leaves the last chunk


# tile, key mode, value mode, warps
REGION_CASES = [(16, 4, 4, 8), (16, 8, 4, 8), (32, 4, 4, 4), (32, 9, 4, 2), (16, 4, 4, 16), (16, 4, 8, 8),
                (16, 8, 8, 8), (16, 9, 8, 16), (32, 8, 8, 4), (64, 4, 8, 2)]  # fmt: skip


@pytest.mark.parametrize("head_dim", [128, 64])
@pytest.mark.parametrize("tma", [False, True])
@pytest.mark.parametrize("tile,key_mode,value_mode,warps", REGION_CASES)
def test_shared_regions_stay_apart(tma, tile, key_mode, value_mode, warps, head_dim):
    """The kernel's shared memory (8 KiB chunks): the table; the staging slots, whose bytes the combine of
    the warps' outputs ([D, 8] float32 each) reuses between items; the last chunk: each warp's mbarrier
    (TMA, placed by the PTX), then the combine's log-sum-exps. Nothing reaches past the buffer and the last
    chunk's parts do not overlap."""
    smem = lut.shared_bytes(warps, tile, key_mode, value_mode, head_dim)
    assert smem % 8192 == 0
    warp_slots = lut_ptx.warp_slot_bytes(tile, key_mode, value_mode, head_dim)  # both paths
    assert warp_slots == tile * token_bytes(key_mode, value_mode, head_dim)
    assert lut_ptx.combine_warp_bytes(head_dim) == head_dim * 8 * 4
    slots_end = lut_ptx.LUT_BYTES + warps * max(warp_slots, lut_ptx.combine_warp_bytes(head_dim))
    last = smem - 8192
    assert slots_end <= last
    stats = last + lut_ptx.COMBINE_STATS_AT  # log-sum-exps: 8 float32 per warp
    assert warps <= 16 and stats + warps * 32 <= smem
    if tma:
        arithmetic = "; ".join(lut_ptx._mbarrier(warps, tile, key_mode, value_mode, head_dim))
        barriers = [run_ptx(arithmetic, {}, 0, warp=w)["m"] for w in range(warps)]
        assert barriers == [last + 8 * w for w in range(warps)] and barriers[-1] + 8 <= stats


def test_default_launch_keeps_two_programs_per_hopper_sm():
    """8 warps × 16-token tiles (the default) of every key and value mode: at head_dim 128 104 KiB (the
    table, the 32 KiB the combine needs, which holds the largest staging, 8 × 16 × 256 bytes, and the last
    chunk), at head_dim 64 88 KiB (the combine's 16 KiB holds 8 × 16 × 128 bytes), twice into an H100/H200
    SM's 228 KiB of shared memory (1 KiB reserved per program), not three times."""
    for head_dim, kib in ((128, 104), (64, 88)):
        for key_mode in (4, 8, 9):
            for value_mode in (4, 8):
                smem = lut.shared_bytes(8, 16, key_mode, value_mode, head_dim)
                assert smem == kib * 1024 and (228 * 1024) // (smem + 1024) == 2


# (items, programs, steps per item) → PDL-launched under lut_pdl_max_steps 8
PDL_CASES = {(256, 264, 8): True, (264, 264, 1): True, (256, 264, 9): False, (265, 264, 1): False,
             (1024, 264, 128): False}  # fmt: skip


def test_dependent_launch_setting():
    """`lut_pdl_max_steps`: the kernel is launched dependent on the query rotation where no program takes a
    second item and items walk at most that many tile steps; 0: never; None: always."""
    for limit in (8, 0, None):
        config = DecodeLaunchConfig(lut_pdl_max_steps=limit)
        got = {case: decode_lut.lut_pdl(*case, config) for case in PDL_CASES}
        assert got == {case: want if limit == 8 else limit is None for case, want in PDL_CASES.items()}


def _tile_perm(m: int, value_mode: int, head_dim: int) -> int:
    """The kernel's slot order of a tile's tokens (_decode_lut_kernel._tile_perm, run on ints)."""
    return lut._tile_perm.fn(m, value_mode, head_dim)


def _tma_byte(row: int, byte: int, row_bytes: int) -> int:
    """Offset of byte `byte` of box row `row` as the TMA writes it: 64- and 128-byte rows swizzled
    (CU_TENSOR_MAP_SWIZZLE_64B, _128B: address bits 4-5 or 4-6 XOR bits 7-8 or 7-9; _tensor_map.box_map),
    other rows as they are."""
    address = row * row_bytes + byte
    mask = {64: 0x30, 128: 0x70}.get(row_bytes, 0)
    return address ^ ((address >> 3) & mask)


def _distinct_banks(addresses: list[int], width: int) -> bool:
    """Whether accesses of `width` bytes at these addresses (one phase: 128 bytes in all) meet distinct
    banks."""
    return len({a % 128 // width for a in addresses}) == len(addresses) == 128 // width


def _operand_geometry(tile: int, key_mode: int, value_mode: int, head_dim: int) -> dict:
    """As the kernel and its PTX derive them: "k", "v": (a token's slot row, its operand words in bytes;
    piece bytes); "kp": key pieces per thread and token; "perm": the slot order."""
    n_keys, key_piece = lut_ptx.key_pieces(tile, key_mode, head_dim)
    key_row = 4 * lut_ptx.key_words(key_mode, head_dim)
    value_row = 4 * lut_ptx.value_words(value_mode, head_dim)
    perm = [_tile_perm(m, value_mode, head_dim) for m in range(tile)]
    assert sorted(perm) == list(range(tile))
    return {
        "k": (key_row, key_piece),
        "v": (value_row, value_row // 8),
        "kp": n_keys // (tile // 8),
        "perm": perm,
    }


def _thread_pieces(tile: int, geometry: dict, lane: int) -> dict[str, list]:
    """The (token, piece) of each key and value register p of a lane (g, t): keys: tokens π(g + 8i), pieces
    KP·t + sub (p = KP·i + sub); values: tokens π(2t + r + 8i), piece g (p = r + 2i)."""
    g, t, kp, perm = lane // 4, lane % 4, geometry["kp"], geometry["perm"]
    keys = [(perm[g + 8 * (p // kp)], kp * t + p % kp) for p in range(tile // 8 * kp)]
    values = [(perm[2 * t + p % 2 + 8 * (p // 2)], g) for p in range(tile // 4)]
    return {"k": keys, "v": values}


# tile, key mode, value mode, head_dim
TMA_READ_CASES = [(16, 4, 4, 128), (32, 4, 4, 128), (64, 4, 4, 128), (16, 8, 4, 128), (32, 9, 4, 128),
                  (16, 4, 8, 128), (32, 4, 8, 128), (16, 8, 8, 128), (64, 9, 8, 128), (16, 4, 4, 64),
                  (32, 4, 4, 64), (64, 4, 8, 64), (16, 8, 4, 64), (32, 9, 8, 64), (16, 8, 8, 64),
                  (64, 8, 8, 64), (16, 4, 8, 64)]  # fmt: skip


@pytest.mark.parametrize("tile,key_mode,value_mode,head_dim", TMA_READ_CASES)
def test_tma_read_back_finds_every_piece_without_bank_conflicts(tile, key_mode, value_mode, head_dim):
    """The TMA path's read-back offsets of native rows (the kernel's _native_read in its slot order
    _tile_perm, for one warp, relative to its slots) find where the TMA wrote each thread's piece, the token
    and words its operand fragment needs; the reads of each phase (a warp's 4-byte reads, a half warp's
    8-byte reads, a quarter warp's 16-byte reads: 128 bytes) meet distinct banks; every read lies inside the
    warp's slots."""
    geo = _operand_geometry(tile, key_mode, value_mode, head_dim)
    for side in "kv":
        row, size = geo[side]
        reads = {}  # (lane, register) → byte offset in the key or value slots
        for lane in range(32):
            for p, (token, piece) in enumerate(_thread_pieces(tile, geo, lane)[side]):
                reads[lane, p] = lut._native_read.fn(token * row, piece, token, row, size)
                assert reads[lane, p] == _tma_byte(token, piece * size, row)  # the piece, one 16-byte chunk:
                assert (piece * size) % 16 + size <= 16
        lanes = 128 // size  # lanes of one phase
        for p in {p for _, p in reads}:
            for first in range(0, 32, lanes):
                assert _distinct_banks([reads[lane, p] for lane in range(first, first + lanes)], size)
        assert max(reads.values()) < tile * row


_WAIT = re.compile(r"WAIT_\$\{:uid\}: mbarrier\.try_wait[^;]*;\s*@!p bra WAIT_\$\{:uid\};")

# head_dim, keys or values, bits, tile
READ_BACK_CASES = [(128, "v", b, t) for b in (5, 6, 7, 8) for t in (16, 32)] + [
    (128, "k", 3, 16), (128, "k", 4, 32), (128, "k", 5, 16), (128, "k", 8, 16), (128, "v", 1, 16),
    (128, "v", 4, 16), *[(64, side, b, 16) for side in "kv" for b in range(1, 9)], (64, "k", 4, 32),
    (64, "v", 8, 32), (64, "v", 2, 64), (64, "k", 3, 32), (64, "k", 7, 64), (64, "v", 1, 32),
    (64, "v", 5, 64),
]  # fmt: skip


def _box_image(rows: np.ndarray, native: bool, base: int, pitch: int, slots: int, rng) -> np.ndarray:
    """Shared memory as words (random bytes elsewhere) with box rows `rows` [T, P] written from byte `base`
    as the TMA writes them: native rows swizzled (_tma_byte), other rows unswizzled at `pitch` bytes (P
    rounded up to 16: the bytes past P another head's, here random)."""
    tile, row_bytes = rows.shape
    image = bytearray(rng.integers(0, 256, base + slots + 64, dtype=np.uint8).tobytes())
    for m in range(tile):
        for byte in range(row_bytes):
            image[base + (_tma_byte(m, byte, row_bytes) if native else m * pitch + byte)] = rows[m, byte]
    return np.frombuffer(bytes(image), dtype="<u4").astype(np.int64)


@pytest.mark.parametrize("head_dim,side,bits,tile", READ_BACK_CASES)
def test_tma_read_back_gives_each_thread_its_words(head_dim, side, bits, tile):
    """The read-back PTX (tma_unstage_asm; keys: past its mbarrier wait), run for every lane of a warp over
    boxes laid out as the TMA writes them (native 64- and 128-byte rows swizzled, other rows as they are) at
    the kernel's read offsets: register (k, p) of a thread is word k of its p-th piece as the mode's packing
    (nibbles or bytes) holds it, each coordinate's index in the low `bits` bits of its field (widths other
    than 4 and 8 spread, the bits above ignored by the tables; their rows at the box pitch, which at head_dim
    64 and odd widths exceeds the packed bytes)."""
    mode = 4 if bits <= 4 else 8
    key_mode, value_mode = (mode, 4) if side == "k" else (4, mode)
    geo = _operand_geometry(tile, key_mode, value_mode, head_dim)
    slot_row, size = geo[side]
    words, fields, row_bytes, native = size // 4, 32 // mode, head_dim * bits // 8, bits == mode
    pitch = lut_ptx.box_pitch(row_bytes)
    assert row_bytes <= pitch <= slot_row
    rng = np.random.default_rng(bits * 100 + tile + head_dim)
    idx = torch.from_numpy(rng.integers(0, 1 << bits, (tile, head_dim)))
    rows = pack_indices(idx, bits).numpy().reshape(tile, row_bytes)  # slot row m: tile token m
    base = lut.LUT_BYTES.value + (0 if side == "k" else tile * geo["k"][0])  # warp 0's slots
    shared = _box_image(rows, native, base, pitch, tile * slot_row, rng)
    k_bits, v_bits = (bits, None) if side == "k" else (None, bits)
    keys, values = lut.tma_unstage_asm(4, tile, key_mode, value_mode, k_bits, v_bits, head_dim)
    asm = _WAIT.sub("", keys) if side == "k" else values
    assert side == "v" or asm != keys  # the wait removed
    for lane in range(32):
        pieces = _thread_pieces(tile, geo, lane)[side]
        n = len(pieces)
        # the kernel's k_read, v_read: native rows as the TMA wrote them, else a piece's first field
        first_byte = [m * pitch + c * words * fields * bits // 8 for m, c in pieces]
        if native:
            first_byte = [lut._native_read.fn(m * slot_row, c, m, slot_row, size) for m, c in pieces]
        regs = run_ptx(asm, {f"${words * n + p}": base + first_byte[p] for p in range(n)}, lane, shared)
        for p, (m, c) in enumerate(pieces):
            for k in range(words):
                word, first = regs[f"${k * n + p}"], (words * c + k) * fields  # its first coordinate
                got = [(word >> (mode * j)) & ((1 << bits) - 1) for j in range(fields)]
                assert got == [int(idx[m, first + j]) for j in range(fields)], (lane, p, k)
                if native:  # the bytes as they are
                    at = first * mode // 8
                    assert word.to_bytes(4, "little") == bytes(rows[m, at : at + 4])


class _ReadLog:
    """Shared memory of zero words that records the byte address of each word read."""

    def __init__(self):
        self.addresses = []

    def __getitem__(self, word: int) -> int:
        self.addresses.append(4 * word)
        return 0


# keys or values, bits, head_dim: every width the read-back spreads
SPREAD_WIDTHS = [(side, bits, d) for side in "kv" for bits in (1, 2, 3, 5, 6, 7) for d in (128, 64)]


@pytest.mark.parametrize("side,bits,head_dim", SPREAD_WIDTHS)
def test_spread_reads_stay_in_the_token_slot(side, bits, head_dim):
    """A spread row's pieces, each read from its first byte in words that cover its latest possible start
    bit, read only bytes of the token's box row (its pitch), which fits the token's slot (D/2 or D key
    bytes, D·mode/8 value bytes): no read or box row leaves the warp's slots (the last warp's value slots
    are followed by the mbarrier chunk), and box destinations stay 128-byte aligned (≥ 8 rows at a
    multiple of 16 bytes)."""
    mode = 4 if bits <= 4 else 8
    if side == "k":
        size, slot = lut_ptx.key_pieces(16, mode, head_dim)[1], 4 * lut_ptx.key_words(mode, head_dim)
    else:
        size, slot = lut_ptx.value_pieces(16, mode, head_dim)[1], 4 * lut_ptx.value_words(mode, head_dim)
    words, fields = size // 4, 32 // mode
    row_bytes = head_dim * bits // 8
    pitch = lut_ptx.box_pitch(row_bytes)
    assert row_bytes <= pitch <= slot and pitch % 16 == 0 and (8 * pitch) % 128 == 0
    asm = lut_ptx.spread_piece_asm(bits, fields, 1, [[f"$o{k}" for k in range(words)]], ["$off"])
    piece_bytes = words * fields * bits // 8
    log = _ReadLog()
    for c in range(row_bytes // piece_bytes):
        run_ptx(asm, {"$off": c * piece_bytes, "s": 0}, c % 32, log)
    assert min(log.addresses) >= 0 and max(log.addresses) + 4 <= pitch


def _tma_box(storage: np.ndarray, geometry: tuple, coords: tuple[int, ...]) -> np.ndarray:
    """A TMA tiled load emulated (unswizzled): the box [b3, b2, b1, b0] of bytes at `coords` of the 4-D map
    `geometry` (_tensor_map.map_geometry: dims and box innermost first, byte strides of dims 1 … 3) over
    `storage` from byte 0; out-of-bounds elements zero."""
    dims, strides, box, _ = geometry
    out = np.zeros(box[::-1], dtype=np.uint8)
    for index in np.ndindex(*box[::-1]):
        at = [c + i for c, i in zip(coords, index[::-1], strict=True)]
        if all(0 <= a < d for a, d in zip(at, dims, strict=True)):
            out[index] = storage[sum(a * s for a, s in zip(at, (1, *strides), strict=True))]
    return out


# packed bytes, heads, bytes between heads' rows, token and block strides beyond the dense rows
MAP_CASES = [(24, 4, 0, 16, 32), (40, 2, 0, 0, 16), (8, 2, 0, 0, 0), (56, 3, 0, 8, 0), (48, 3, 16, 0, 0),
             (32, 2, 0, 0, 0)]  # fmt: skip


@pytest.mark.parametrize("row_bytes,heads,head_gap,token_gap,block_gap", MAP_CASES)
def test_tensor_map_boxes_hold_each_heads_rows(row_bytes, heads, head_gap, token_gap, block_gap):
    """_tensor_map.map_geometry over caches [NB, BS, H, P] that take TMA boxes (decode_lut._takes_boxes),
    loaded at the kernel's coordinates (native form {0, h, offset, block}; flat form, P not a multiple of 16:
    {h·P rounded down to 16, offset, block, 0}): each box row holds the token's P bytes of head h, in the flat
    form from byte h·P mod 16 of the row, with the neighbouring heads' bytes around them up to the pitch, or
    zeros past the last head. The flat form is unswizzled."""
    num_blocks, block_size, rows = 3, 16, 8
    head_stride = row_bytes + head_gap
    token_stride = heads * head_stride + token_gap
    block_stride = block_size * token_stride + block_gap
    gen = torch.Generator().manual_seed(row_bytes + heads)
    storage = torch.randint(0, 256, (num_blocks * block_stride,), dtype=torch.uint8, generator=gen)
    shape, strides = (num_blocks, block_size, heads, row_bytes), (block_stride, token_stride, head_stride, 1)
    packed = storage.as_strided(shape, strides)
    flat = _tensor_map.flat_rows(packed)
    assert flat == (row_bytes % 16 != 0) and decode_lut._takes_boxes(packed)
    geometry = _tensor_map.map_geometry(packed, rows)
    pitch = lut_ptx.box_pitch(row_bytes)
    assert geometry[2] == ((pitch, rows, 1, 1) if flat else (row_bytes, 1, rows, 1))
    assert all(s % 16 == 0 for s in geometry[1]) and (geometry[3] == 0 or not flat)
    data = storage.numpy()
    for block, offset, h in [(0, 0, 0), (2, 8, heads - 1), (1, 8, heads // 2)]:
        start = h * row_bytes // 16 * 16 if flat else 0
        assert start % 16 == 0
        coords = (start, offset, block, 0) if flat else (0, h, offset, block)
        got = _tma_box(data, geometry, coords).reshape(rows, -1)
        assert got.shape[1] == pitch
        tokens = packed[block, offset : offset + rows]
        shift = h * row_bytes - start if flat else 0  # the kernel's read-back shift
        assert shift + row_bytes <= pitch
        assert np.array_equal(got[:, shift : shift + row_bytes], tokens[:, h].numpy())
        if flat:  # the rest of the row: the token's bytes of the heads around h, zeros past the last
            row = np.concatenate([tokens.reshape(rows, -1)[:, : heads * head_stride].numpy(),
                                  np.zeros((rows, pitch), np.uint8)], axis=1)  # fmt: skip
            assert head_gap == 0 and np.array_equal(got, row[:, start : start + pitch])


def test_caches_that_take_no_tma_box():
    """decode_lut._takes_boxes refuses a flat-form cache (P not a multiple of 16) whose heads are not dense,
    whose token or block stride is not a multiple of 16 bytes, or whose address is not 16-byte aligned, and
    a native-form one whose head stride is not."""
    storage = torch.zeros(1 << 16, dtype=torch.uint8)

    def cache(p, heads, strides, at=0):
        return storage[at:].as_strided((4, 16, heads, p), strides)

    assert decode_lut._takes_boxes(cache(24, 8, (3072, 192, 24, 1)))
    assert not decode_lut._takes_boxes(cache(24, 8, (3072, 192, 24, 1), at=4))
    assert not decode_lut._takes_boxes(cache(24, 1, (384, 24, 24, 1)))  # token stride 24
    assert not decode_lut._takes_boxes(cache(24, 4, (2048, 128, 32, 1)))  # heads not dense
    assert not decode_lut._takes_boxes(cache(24, 8, (3080, 192, 24, 1)))  # block stride
    assert decode_lut._takes_boxes(cache(48, 2, (2048, 128, 64, 1)))
    assert not decode_lut._takes_boxes(cache(48, 2, (2048, 128, 56, 1)))


def _join(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """gl.join: a new minor axis of size 2, (a, b)."""
    return np.stack([a, b], axis=-1)


def _bits(x: np.ndarray, lead: int, n: int) -> np.ndarray:
    """x [1, lead, n] → [1, lead, 2, …, 2]: n (a power of two) as its bits, the highest first."""
    return x.reshape(1, lead, *[2] * (n.bit_length() - 1))


def _piece_lanes(tile: int) -> np.ndarray:
    """The lane holding each value piece [T, 8] of a warp, by the kernel's _value_piece_layout."""
    layout = lut._value_piece_layout(1, tile)
    lanes = np.full((tile, 8), -1)
    for lane in range(32):
        for reg in range(1 << len(layout.reg_bases)):
            at = np.zeros(3, dtype=np.int64)
            for bit, basis in enumerate(layout.lane_bases):
                at ^= np.array(basis) * ((lane >> bit) & 1)
            for bit, basis in enumerate(layout.reg_bases):
                at ^= np.array(basis) * ((reg >> bit) & 1)
            assert lanes[at[1], at[2]] in (-1, lane)
            lanes[at[1], at[2]] = lane
    return lanes


def _blocked_lane(layout, index: tuple[int, ...]) -> int:
    """The lane of warp 0 that holds element `index` of a gl.BlockedLayout (one warp: warps_per_cta 1s)."""
    lane, stride = 0, 1
    for dim in layout.order:  # fastest first
        lane += (index[dim] // layout.size_per_thread[dim]) % layout.threads_per_warp[dim] * stride
        stride *= layout.threads_per_warp[dim]
    return lane


def _decode(x: np.ndarray, words: int, fields: int) -> tuple[np.ndarray, ...]:
    """Labels ((token·words + word)·fields + field)·32 + lane → (token, natural coordinate, lane)."""
    lane, x = x % 32, x // 32
    field, x = x % fields, x // fields
    return x // words, (x % words) * fields + field, lane


def _k_operand_replay(key_mode: int, tile: int, head_dim: int) -> tuple[np.ndarray, ...]:
    """_decode_lut_kernel._k_operand (one warp) replayed in numpy on labels of the staged key words [1, T, KW]
    held by the threads of _key_piece_layout: its reshapes, joins and permute as they are, its lookups as
    what they mean (output b, element j: field 2b + j of the word, in the thread of that word). For each
    element of K̂ [T, D]: (token, natural coordinate, lane)."""
    kw, fields = lut_ptx.key_words(key_mode, head_dim), 32 // (4 if key_mode == 4 else 8)
    kp = lut_ptx.key_pieces(8, key_mode, head_dim)[0]
    layout = lut._key_piece_layout(1, kp)
    token, word = np.meshgrid(np.arange(tile), np.arange(kw), indexing="ij")
    lane = np.vectorize(lambda m, c: _blocked_lane(layout, (0, m, c)))(token, word // (kw // (4 * kp)))
    code = (token * kw + word)[None]  # [1, T, KW]
    w = _bits(code, tile, kw)
    lanes = _bits(lane[None], tile, kw)[..., None]
    j = np.arange(2)
    x = _join(w, w) * fields  # the pair axis j
    if key_mode == 4:  # output b: the byte's nibbles
        x = _join(_join(x + j, x + 2 + j), _join(x + 4 + j, x + 6 + j))
        lanes = lanes[..., None, None]
    else:  # output b: bytes 2b, 2b + 1
        x = _join(x + j, x + 2 + j)
        lanes = lanes[..., None]
    x = np.transpose(x * 32 + lanes, lut._k_axes(key_mode, head_dim)).reshape(tile, head_dim)
    return _decode(x, kw, fields)


def _v_operand_replay(value_mode: int, tile: int, head_dim: int) -> tuple[np.ndarray, ...]:
    """_decode_lut_kernel._v_operand (one warp) replayed in numpy on labels of the staged value words
    [1, T, VW]: its reshapes, permutes, split and joins as they are, its lookups as what they mean (output
    n, element j: field n, nibble or byte, of the word of token 2i + j, in the thread of that word). For each
    element of V̂ᵀ [D, T]: (token, natural coordinate, lane)."""
    vw, fields = lut_ptx.value_words(value_mode, head_dim), 32 // value_mode
    token, word = np.meshgrid(np.arange(tile), np.arange(vw), indexing="ij")
    lane = _piece_lanes(tile)[token, word // (vw // 8)]
    code = ((token * vw + word) * 32 + lane)[None]  # [1, T, VW]
    pairs = np.transpose(code.reshape(1, tile // 2, 2, vw), (0, 1, 3, 2))
    wa, wb = (_bits(pairs[..., k], tile // 2, vw) for k in range(2))
    a, b = _join(wa, wa), _join(wb, wb)
    assert (a % 32 == b % 32).all()  # the two tokens of a pair in one thread
    j = np.arange(2)
    o = [(np.where(j == 0, a, b) // 32 * fields + n) * 32 + a % 32 for n in range(fields)]  # the lookups
    if value_mode == 4:
        x = _join(_join(_join(o[0], o[1]), _join(o[2], o[3])), _join(_join(o[4], o[5]), _join(o[6], o[7])))
    else:
        x = _join(_join(o[0], o[1]), _join(o[2], o[3]))
    x = np.transpose(x, lut._v_axes(value_mode, head_dim)).reshape(head_dim, tile)
    return _decode(x, vw, fields)


@pytest.mark.parametrize("head_dim", [128, 64])
@pytest.mark.parametrize("key_mode", [4, 8, 9])
@pytest.mark.parametrize("tile", [16, 32, 64])
def test_key_operand_relabelling_is_operand_a_fragment(key_mode, tile, head_dim):
    """K̂ as _k_operand builds it: row m holds token m; column d holds natural coordinate _k_phys(d), a
    one-to-one map of 0 … D−1 (the query is loaded through it); the thread holding element (m, d) is lane
    4·(m mod 8) + (d mod 8) / 2, mma.m16n8k16's operand-A fragment (rows g, g + 8 and columns 2t, 2t + 1,
    2t + 8, 2t + 9 of each 16 × 16 block to lane 4g + t), so the conversion to the dot-operand layout moves
    no data (the kernel asserts it trivial); and columns 2c, 2c + 1 are the two halves of one lookup output
    (fields 2b, 2b + 1 of a word: coordinates of the same parity as their columns), operand A's register
    pairs."""
    token, coordinate, lane = _k_operand_replay(key_mode, tile, head_dim)
    rows, cols = np.meshgrid(np.arange(tile), np.arange(head_dim), indexing="ij")
    assert (token == rows).all()
    phys = np.array([lut._k_phys.fn(d, key_mode, head_dim) for d in range(head_dim)])
    assert sorted(phys) == list(range(head_dim))
    assert (coordinate == phys[None, :]).all()
    assert (lane == 4 * (rows % 8) + (cols % 8) // 2).all()
    assert (coordinate % 2 == cols % 2).all() and (coordinate[:, 1::2] == coordinate[:, ::2] + 1).all()


@pytest.mark.parametrize("head_dim", [128, 64])
@pytest.mark.parametrize("value_mode", [4, 8])
@pytest.mark.parametrize("tile", [16, 32, 64])
def test_value_operand_relabelling_is_operand_a_fragment(value_mode, tile, head_dim):
    """V̂ᵀ as _v_operand builds it: column m holds token m (columns 2i, 2i + 1: the two halves of one lookup
    output, operand A's register pairs); row r holds natural coordinate _v_phys(r), a one-to-one map of
    0 … D−1 (the partial outputs are stored through it); and the thread holding element (r, m) is lane
    4·(r mod 8) + (m mod 8) / 2, mma.m16n8k16's operand-A fragment (rows g, g + 8 and columns 2t, 2t + 1,
    2t + 8, 2t + 9 of each 16 × 16 block to lane 4g + t), so the conversion to the dot-operand layout moves
    no data (the kernel asserts it trivial)."""
    token, coordinate, lane = _v_operand_replay(value_mode, tile, head_dim)
    rows, cols = np.meshgrid(np.arange(head_dim), np.arange(tile), indexing="ij")
    assert (token == cols).all()
    phys = np.array([lut._v_phys.fn(r, value_mode, head_dim) for r in range(head_dim)])
    assert sorted(phys) == list(range(head_dim))
    assert (coordinate == phys[:, None]).all()
    assert (lane == 4 * (rows % 8) + (cols % 8) // 2).all()


@pytest.mark.parametrize("head_dim", [128, 64])
@pytest.mark.parametrize("value_mode", [4, 8])
def test_tma_stage_text_arrives_once_and_copies_one_box(value_mode, head_dim):
    """One arrival per lane per tile (the mbarrier counts 32) expecting the box's bytes ($7), one box
    predicated on them, after the proxy fence: at shared offset $6 from global_smem, of the map at $1, at the
    four coordinates $2 … $5 the kernel computes for either form."""
    stage = lut.tma_stage_asm(8, 16, 4, value_mode, head_dim)
    assert stage.count("mbarrier.arrive.expect_tx") == 1 and stage.count("cp.async.bulk.tensor") == 1
    assert stage.index("fence.proxy.async") < stage.index("cp.async.bulk.tensor")
    assert "mbarrier.arrive.expect_tx.shared::cta.b64 st, [m], $7;" in stage
    assert "setp.ne.u32 p, $7, 0;" in stage and "add.u32 x, $6, s;" in stage
    assert "@p cp.async.bulk.tensor.4d." in stage and "[x], [$1, {$2, $3, $4, $5}], [m];" in stage
    assert "$8" not in stage
    assert "mbarrier.init.shared::cta.b64 [m], 32" in lut.tma_init_asm(8, 16, 4, value_mode, head_dim)


# (bits, words per piece, fields per word, head_dim): at head_dim 128 keys of 1–3 bits as nibble words (key
# mode 4: pieces of 4 words), keys and values of 5–7 bits as byte words (key and value mode 8: pieces of 4
# words), values of 1–3 bits as nibble words (value mode 4: pieces of 2 words); at head_dim 64 keys of 1–3
# bits (key mode 4: pieces of 2 words of 8 nibbles) and 5–7 bits (key mode 8: 4 words of 4 bytes), values
# of 1–3 bits (value mode 4: 1 word of 8 nibbles, 1–3 bytes: pieces at any byte) and 5–7 bits (value mode
# 8: 2 words of 4 bytes, 5–7 bytes)
SPREAD_CASES = [(1, 4, 8, 128), (2, 4, 8, 128), (3, 4, 8, 128), (5, 4, 4, 128), (6, 4, 4, 128),
                (7, 4, 4, 128), (1, 2, 8, 128), (2, 2, 8, 128), (3, 2, 8, 128), (2, 2, 8, 64), (6, 4, 4, 64),
                (2, 1, 8, 64), (6, 2, 4, 64), (1, 2, 8, 64), (3, 2, 8, 64), (5, 4, 4, 64), (7, 4, 4, 64),
                (1, 1, 8, 64), (3, 1, 8, 64), (5, 2, 4, 64), (7, 2, 4, 64)]  # fmt: skip


@pytest.mark.parametrize("bits,piece_words,fields,head_dim", SPREAD_CASES)
def test_spread_pieces_read_the_packed_rows_as_the_native_words(bits, piece_words, fields, head_dim):
    """spread_piece_asm on rows laid out as the TMA writes them (unswizzled: P = D·bits/8 packed bytes a
    token at the box pitch, P rounded up to 16, the bytes between another head's) at the kernel's read
    offsets (a piece's first byte): output word k of piece c holds, in the low `bits` bits of slot i, the
    index of coordinate c·F + k·fields + i (F fields a piece), and the lookups of the native path then give
    that index's centroid."""
    rng = np.random.default_rng(bits * 10 + piece_words + head_dim)
    rows, row_bytes = 3, head_dim * bits // 8
    pitch = lut_ptx.box_pitch(row_bytes)
    idx = torch.from_numpy(rng.integers(0, 1 << bits, (rows, head_dim)))
    packed = pack_indices(idx, bits).numpy().reshape(rows, row_bytes)
    start = lut.LUT_BYTES.value
    image = bytearray(rng.integers(0, 256, start + rows * pitch + 64, dtype=np.uint8).tobytes())
    for m in range(rows):
        image[start + m * pitch : start + m * pitch + row_bytes] = packed[m].tobytes()
    shared = np.frombuffer(bytes(image), dtype="<u4").astype(np.int64)
    per_piece = piece_words * fields
    outs = [f"$o{k}" for k in range(piece_words)]
    asm = lut_ptx.spread_piece_asm(bits, fields, 1, [outs], ["$off"])
    slot = 32 // fields
    for m in range(rows):
        for c in range(head_dim // per_piece):
            offset = start + m * pitch + c * per_piece * bits // 8
            regs = run_ptx(asm, {"$off": offset, "s": 0}, c % 32, shared)
            for k, out in enumerate(outs):
                for i in range(fields):
                    want = int(idx[m, c * per_piece + k * fields + i])
                    assert (regs[out] >> (slot * i)) & ((1 << bits) - 1) == want, (m, c, k, i)


@pytest.mark.parametrize("k_bits", [1, 2, 3, 5, 6, 7])
def test_spread_key_words_look_up_their_centroids(k_bits):
    """Garbage above a field in its slot selects nothing: the key lookups of the native path over spread
    words give codebook[index] (tables repeating every 2^bits entries)."""
    mode = 4 if k_bits <= 4 else 8
    kc, vc = codec(128, k_bits, 1), codec(128, 3, 2)
    shared, k_off, _ = shared_table(kc, vc, mode)
    cb = f16_bits(kc.codebook)
    rng = random.Random(k_bits)
    for i in range(200):
        fields = [rng.randrange(1 << k_bits) for _ in range(8 if mode == 4 else 4)]
        slot = 4 if mode == 4 else 8
        word = sum(
            (f | (rng.randrange(1 << (slot - k_bits)) << k_bits)) << (slot * j) for j, f in enumerate(fields)
        )
        if mode == 4:
            regs = run_ptx(lut.k4_asm(k_off), {"$4": word, "$5": word, "$6": 0, "$7": 0}, i % 32, shared)
            got = [h for b in range(4) for h in halves(regs[f"${b}"])]
        else:
            regs = run_ptx(lut.k8_asm(k_off), {"$2": word, "$3": word, "$4": 0, "$5": 0}, i % 32, shared)
            got = [*halves(regs["$0"]), *halves(regs["$1"])]
        assert got == [cb[f] for f in fields]


def test_spread_value_words_look_up_their_centroids():
    kc, vc = codec(128, 6, 1), codec(128, 3, 2)
    shared, _, v_off = shared_table(kc, vc, 8)
    cb = f16_bits(vc.codebook)
    rng = random.Random(5)
    for i in range(200):
        fa, fb = ([rng.randrange(8) for _ in range(8)] for _ in range(2))
        wa, wb = (sum((f | (rng.randrange(2) << 3)) << (4 * j) for j, f in enumerate(fs)) for fs in (fa, fb))
        regs = run_ptx(lut.v4_asm(v_off), {"$8": wa, "$9": wa, "$10": wb, "$11": wb, "$12": 0, "$13": 0},
                       i % 32, shared)  # fmt: skip
        assert [halves(regs[f"${n}"]) for n in range(8)] == [(cb[fa[n]], cb[fb[n]]) for n in range(8)]


def test_masked_tables_repeat_every_codebook():
    for bits in (1, 2, 3):
        cb = codec(128, bits, 1).codebook
        pair = f16_pair_lut(cb).view(torch.int16).view(torch.float16).view(256, 2)
        e = torch.arange(256)
        assert torch.equal(pair[:, 0], cb[e & ((1 << bits) - 1)].half())
        assert torch.equal(pair[:, 1], cb[(e >> 4) & ((1 << bits) - 1)].half())
    for bits in (5, 6, 7):
        cb = codec(128, bits, 1).codebook
        byte = f16_byte_lut(cb).view(torch.int16).view(torch.float16).view(256, 2)
        assert torch.equal(byte[:, 0], cb[torch.arange(256) % (1 << bits)].half())
    with pytest.raises(ValueError, match="power-of-two codebook of at most 16"):
        f16_pair_lut(codec(128, 5, 1).codebook)


def test_gluon_serves_every_key_and_value_width():
    """Keys and values of 1–8 bits at head_dim 128 and 64 (value mode 4 for 1–4 bits, 8 for 5–8; odd widths'
    rows at head_dim 64, 8·bits bytes, by flat-form TMA boxes), nothing else; the native widths, which need
    no TMA, are the 4- and 8-bit pairs."""
    widths = [(k, v) for k in range(1, 9) for v in range(1, 9)]
    assert all(decode_lut.lut_serves(k, v, 128) for k, v in widths)
    assert all(decode_lut.lut_serves(k, v, 64) for k, v in widths)
    for head_dim in (128, 64):
        assert not any(decode_lut.lut_serves(k, v, head_dim) for k, v in [(0, 4), (4, 0), (9, 4), (4, 9)])
    assert not any(decode_lut.lut_serves(4, 4, d) for d in (32, 80, 96, 256))
    assert [decode_lut.lut_value_mode(v) for v in range(1, 9)] == [4] * 4 + [8] * 4
    assert sorted(decode_lut.NATIVE_WIDTHS) == [(4, 4), (4, 8), (8, 4), (8, 8)]
