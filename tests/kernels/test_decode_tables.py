"""The inline-PTX centroid lookup (which the interpreter cannot run), checked by emulating its PTX text."""

import random

import pytest
import torch
from kernel_cases import codec

from tiercache.kernels._tables import prmt_fields_asm


def _prmt(a: int, b: int, selector: int) -> int:
    """PTX prmt.b32 (default mode, selectors 0–7): byte j of the result is byte selector[j] of {b, a}."""
    source, out = (b << 32) | a, 0
    for j in range(4):
        pick = (selector >> (4 * j)) & 0xF
        assert pick < 8, "a selector with bit 3 set would replicate a sign"
        out |= ((source >> (8 * pick)) & 0xFF) << (8 * j)
    return out


def _run_ptx(asm: str, word: int) -> dict[str, int]:
    regs = {"$4": word}
    value = lambda x: regs[x] if x in regs else int(x, 0)
    ops = {
        "and.b32": lambda a, b: a & b,
        "or.b32": lambda a, b: a | b,
        "shr.u32": lambda a, b: a >> b,
        "mov.b32": lambda a: a,
        "prmt.b32": lambda a, b, c: _prmt(a, b, c & 0xFFFF),
    }
    for ins in asm.strip("{} ").split(";"):
        ins = ins.strip()
        if not ins or ins.startswith(".reg"):
            continue
        op, rest = ins.split(None, 1)
        dest, *srcs = (t.strip() for t in rest.split(","))
        regs[dest] = ops[op](*(value(s) for s in srcs)) & 0xFFFFFFFF
    return regs


@pytest.mark.parametrize("head_dim", [64, 128])
def test_prmt_fields_asm_matches_the_codebook(head_dim):
    c = codec(head_dim, 4, 1)
    asm = prmt_fields_asm(c.codebook)
    bf16 = [p & 0xFFFF for p in c.codebook.to(torch.bfloat16).view(torch.int16).tolist()]
    rng = random.Random(0)
    for word in [0, 0xFFFFFFFF, 0x76543210, 0xFEDCBA98] + [rng.getrandbits(32) for _ in range(500)]:
        regs = _run_ptx(asm, word)
        for e in range(4):  # element e of the pack: byte e; outputs hold two bf16 per register
            byte = (word >> (8 * e)) & 0xFF
            low = (regs["$0" if e < 2 else "$1"] >> (16 * (e % 2))) & 0xFFFF
            high = (regs["$2" if e < 2 else "$3"] >> (16 * (e % 2))) & 0xFFFF
            assert (low, high) == (bf16[byte & 15], bf16[byte >> 4])
