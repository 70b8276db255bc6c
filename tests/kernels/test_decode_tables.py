"""The inline-PTX centroid lookup (which the interpreter cannot run), checked by emulating its PTX text."""

import random

import numpy as np
import pytest
import torch
from kernel_cases import codec
from ptx_emulation import run_ptx

from tiercache.kernels._tables import UNIFORM8_ASM, prmt_fields_asm, uniform_step


@pytest.mark.parametrize("head_dim", [64, 128])
def test_prmt_fields_asm_matches_the_codebook(head_dim):
    c = codec(head_dim, 4, 1)
    asm = prmt_fields_asm(c.codebook)
    bf16 = [p & 0xFFFF for p in c.codebook.to(torch.bfloat16).view(torch.int16).tolist()]
    rng = random.Random(0)
    for word in [0, 0xFFFFFFFF, 0x76543210, 0xFEDCBA98] + [rng.getrandbits(32) for _ in range(500)]:
        regs = run_ptx(asm, {"$4": word})
        for e in range(4):  # element e of the pack: byte e; outputs hold two bf16 per register
            byte = (word >> (8 * e)) & 0xFF
            low = (regs["$0" if e < 2 else "$1"] >> (16 * (e % 2))) & 0xFFFF
            high = (regs["$2" if e < 2 else "$3"] >> (16 * (e % 2))) & 0xFFFF
            assert (low, high) == (bf16[byte & 15], bf16[byte >> 4])


def test_uniform8_asm_gives_the_centred_indices_exactly():
    rng = random.Random(1)
    for word in [0, 0xFFFFFFFF, 0x03020100, 0x80FF7F01] + [rng.getrandbits(32) for _ in range(500)]:
        regs = run_ptx(UNIFORM8_ASM, {"$2": word})
        halves = np.array([regs["$0"] & 0xFFFF, regs["$0"] >> 16, regs["$1"] & 0xFFFF, regs["$1"] >> 16],
                          dtype=np.uint16).view(np.float16)  # fmt: skip
        assert [float(h) for h in halves] == [((word >> (8 * e)) & 0xFF) - 128 for e in range(4)]


def test_uniform_step_recognises_only_symmetric_uniform_8bit_codebooks():
    step = 0.0013
    k = torch.arange(256, dtype=torch.float64)
    uniform = (step * (k - 127.5)).to(torch.float32)
    assert uniform_step(uniform) == pytest.approx(step, rel=1e-6)
    assert uniform_step((step * k - 0.1).to(torch.float32)) is None  # affine but not centred
    assert uniform_step(codec(128, 8, 1).codebook) is None  # Lloyd-Max
    assert uniform_step(codec(128, 4, 1).codebook) is None
