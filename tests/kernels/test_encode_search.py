"""The encode kernel's nearest-centroid search: the fixed-point search words (_tables.search_line) and the
PTX that reads them (which only a GPU runs, emulated here per value), against the codec's own search."""

import numpy as np
import pytest
import torch
from ptx_emulation import run_ptx

from tiercache.kernels import TurboQuantCodec
from tiercache.kernels._backend import HAVE_TRITON
from tiercache.kernels._tables import GRID_FRAC_BITS, kernel_tables

if not HAVE_TRITON:
    pytest.skip("needs Triton", allow_module_level=True)
from tiercache.kernels._triton_common import nearest_centroid_asm

WORDS_AT = 0x7F00_0000_1000  # where the emulated search words lie in global memory


def search_words(t) -> dict[int, int]:
    """The table's words as emulated global memory."""
    return {WORDS_AT + 4 * i: w & 0xFFFFFFFF for i, w in enumerate(t.grid.tolist())}


def rotated_values(c: TurboQuantCodec, gen: torch.Generator) -> torch.Tensor:
    """Coordinates of unit vectors, plus every boundary and its neighbourhood, the ends of ±1 and beyond."""
    b = c.boundaries
    near = (b[:, None] + torch.tensor([-1e-5, -1e-7, 0.0, 1e-7, 1e-5])).reshape(-1)
    spread = torch.randn(1500, generator=gen) / c.head_dim**0.5
    ends = torch.tensor([-1.0, -0.999, 0.0, 0.999, 1.0, -1e30, 1e30, float("inf"), float("-inf")])
    return torch.cat([spread, near, ends]).to(torch.float32)


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("codebook", ["lloyd", "uniform"])
def test_search_ptx_matches_the_codec(bits, codebook):
    c = TurboQuantCodec(128, bits, seed=1, codebook=codebook)
    t = kernel_tables(c, torch.device("cpu"))
    words = search_words(t)
    y = rotated_values(c, torch.Generator().manual_seed(bits))
    want = c.tables(torch.device("cpu")).quantize(y.clone()).tolist()
    # the kernel's position: one fused multiply-add in f32 (products of two f32 are exact in f64)
    pos = (y.double() * np.float32(t.grid_scale) + np.float32(t.grid_origin)).float().tolist()
    near = (y.double()[:, None] - c.boundaries.double()).abs().min(1).values < 1e-6
    asm = nearest_centroid_asm(GRID_FRAC_BITS)
    for i, p in enumerate(pos):
        got = run_ptx(asm, {"$1": p, "$2": WORDS_AT, "$3": t.grid_last}, global_words=words)["$0"]
        assert 0 <= got < 2**bits
        if not near[i]:
            assert got == want[i], f"y = {y[i].item()!r}: index {got}, codec.encode {want[i]}"


def test_search_ptx_keeps_nan_in_range():
    c = TurboQuantCodec(128, 8, seed=1)
    t = kernel_tables(c, torch.device("cpu"))
    operands = {"$1": float("nan"), "$2": WORDS_AT, "$3": t.grid_last}
    got = run_ptx(nearest_centroid_asm(GRID_FRAC_BITS), operands, global_words=search_words(t))["$0"]
    assert 0 <= got < 256


def test_search_words_fit_every_codebook():
    """Positions are int32: cells · 2^GRID_FRAC_BITS stays below 2^31 (search_line checks it too)."""
    for bits in (2, 3, 4, 8):
        for codebook in ("lloyd", "uniform"):
            for head_dim in (64, 128, 256):
                c = TurboQuantCodec(head_dim, bits, seed=0, codebook=codebook)
                t = kernel_tables(c, torch.device("cpu"))
                assert t.grid.dtype == torch.int32 and t.grid.numel() << GRID_FRAC_BITS < 2**31
