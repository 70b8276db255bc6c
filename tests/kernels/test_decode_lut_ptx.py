"""The Gluon decode kernel's inline PTX (which only a GPU runs), checked by emulating its text per lane:
the shared-memory table lookups against the codebooks, the uniform 8-bit keys, and the Pᵀ packing."""

import random
import re

import numpy as np
import pytest
import torch
from kernel_cases import codec
from ptx_emulation import run_ptx

from tiercache.kernels import decode_lut
from tiercache.kernels._tables import decode_lut_table, f16_byte_lut, f16_pair_lut

if not decode_lut.HAVE_GLUON:
    pytest.skip("this Triton has no Gluon", allow_module_level=True)
from tiercache.kernels import _decode_lut_kernel as lut


def shared_table(k_codec, v_codec, key_mode: int) -> tuple[np.ndarray, int, int]:
    """The kernel's shared memory as words: entry e, table t, lane l at word e·64 + 32·t + l."""
    table, k_off, v_off = decode_lut_table(k_codec, v_codec, key_mode, torch.device("cpu"))
    words = table.numpy().astype(np.int64) & 0xFFFFFFFF
    return np.repeat(words[:, :, None], 32, axis=2).reshape(-1), k_off, v_off


def f16_bits(x: torch.Tensor) -> list[int]:
    return [int(b) & 0xFFFF for b in x.to(torch.float16).view(torch.int16).tolist()]


WORDS = [0, 0xFFFFFFFF, 0x76543210, 0xFEDCBA98] + [random.Random(0).getrandbits(32) for _ in range(200)]


@pytest.mark.parametrize("same_codebook", [True, False])
def test_k4_lookup_gives_both_nibbles_centroids(same_codebook):
    kc, vc = codec(128, 4, 1), codec(128, 4, 1 if same_codebook else 2)
    shared, k_off, _ = shared_table(kc, vc, 4)
    cb = f16_bits(kc.codebook)
    asm = lut.k4_asm(k_off)
    for i, word in enumerate(WORDS):
        lane = i % 32
        regs = run_ptx(asm, {"$8": word, "$9": 0}, lane, shared)
        for b in range(4):
            byte = (word >> (8 * b)) & 0xFF
            assert (regs[f"${2 * b}"], regs[f"${2 * b + 1}"]) == (cb[byte & 15], cb[byte >> 4])


def test_v4_lookup_pairs_two_tokens_of_one_coordinate():
    kc, vc = codec(128, 4, 1), codec(128, 4, 2)
    shared, _, v_off = shared_table(kc, vc, 4)
    cb = f16_bits(vc.codebook)
    asm = lut.v4_asm(v_off)
    rng = random.Random(1)
    for i, wa in enumerate(WORDS):
        wb, lane = rng.getrandbits(32), i % 32
        regs = run_ptx(asm, {"$16": wa, "$17": wb, "$18": 0}, lane, shared)
        for n in range(8):  # nibble n of the word = coordinate n, for token 2t (wa) and 2t+1 (wb)
            want = (cb[(wa >> (4 * n)) & 15], cb[(wb >> (4 * n)) & 15])
            assert (regs[f"${2 * n}"], regs[f"${2 * n + 1}"]) == want


def test_k8_lookup_and_uniform_keys():
    kc, vc = codec(128, 8, 1), codec(128, 4, 2)
    shared, k_off, _ = shared_table(kc, vc, 8)
    assert k_off == 128
    cb = f16_bits(kc.codebook)
    for i, word in enumerate(WORDS):
        regs = run_ptx(lut.k8_asm(k_off), {"$4": word, "$5": 0}, i % 32, shared)
        assert [regs[f"${b}"] for b in range(4)] == [cb[(word >> (8 * b)) & 0xFF] for b in range(4)]
        regs = run_ptx(lut.K8U_ASM, {"$4": word, "$5": 0}, i % 32, shared)
        got = np.array([regs[f"${b}"] for b in range(4)], dtype=np.uint16).view(np.float16)
        assert [float(x) for x in got] == [((word >> (8 * b)) & 0xFF) - 128 for b in range(4)]


def test_lut_tables_hold_float16_centroids():
    c4, c8 = codec(128, 4, 1), codec(128, 8, 1)
    pair = f16_pair_lut(c4.codebook).view(torch.int16).view(torch.float16).view(256, 2)
    e = torch.arange(256)
    assert torch.equal(pair[:, 0], c4.codebook[e & 15].half())
    assert torch.equal(pair[:, 1], c4.codebook[e >> 4].half())
    byte = f16_byte_lut(c8.codebook).view(torch.int16).view(torch.float16).view(256, 2)
    assert torch.equal(byte[:, 0], c8.codebook.half())


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


def staging_slots(asm: str, warps: int) -> dict[tuple[int, int, int], int]:
    """(warp, lane, piece) → shared byte offset of that piece's slot, read off a staging PTX string."""
    warp_bytes = int(re.search(r"mul\.lo\.u32 w, w, (\d+);", asm).group(1))
    size = int(re.search(r"mad\.lo\.u32 b, b, (\d+), w;", asm).group(1))
    start = int(re.search(r"add\.u32 b, b, (\d+);", asm).group(1))
    offsets = [int(x) for x in re.findall(r"\[b\+(\d+)\]", asm)]
    return {
        (w, lane, p): start + w * warp_bytes + lane * size + off
        for w in range(warps)
        for lane in range(32)
        for p, off in enumerate(offsets)
    }


@pytest.mark.parametrize("tile,key_mode,warps", [(32, 4, 4), (32, 8, 8), (64, 4, 4), (64, 9, 8)])
def test_staging_slots_fit_and_never_overlap(tile, key_mode, warps):
    """Each piece of every thread has its own slot past the table and inside the kernel's shared memory; the
    copy and the read of a piece use the same slots; a warp's 32 lanes of one piece are contiguous."""
    k_stage, v_stage, k_unstage, v_unstage = lut.staging_asm(tile, key_mode)
    assert staging_slots(k_stage, warps) == staging_slots(k_unstage, warps)
    assert staging_slots(v_stage, warps) == staging_slots(v_unstage, warps)
    pieces = [(staging_slots(k_stage, warps), 16), (staging_slots(v_stage, warps), 8)]
    assert len(pieces[0][0]) == warps * 32 * tile // 8 * (1 if key_mode == 4 else 2)
    assert len(pieces[1][0]) == warps * 32 * tile // 4
    covered = np.zeros(lut.shared_bytes(warps, tile, key_mode), dtype=np.int64)
    for slots, size in pieces:
        for (w, lane, p), start in slots.items():
            assert start % size == 0 and start >= lut.LUT_BYTES.value
            covered[start : start + size] += 1
            if lane:
                assert start == slots[(w, lane - 1, p)] + size
    assert (covered[lut.LUT_BYTES.value :] == 1).all()  # the staging fills its part exactly once
