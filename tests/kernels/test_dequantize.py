"""tq_dequantize_blocks against codec.decode: ≤ 1e-6 relative into float32, bf16-rounding level otherwise."""

import pytest
import torch
from kernel_cases import codec, random_cache, rel_err

from tiercache.kernels import tq_dequantize_blocks

CASES = [(b, d, bs, torch.float32) for b in (2, 3, 4, 8) for d, bs in ((64, 32), (128, 16))]
CASES += [(b, 128, 32, dt) for b in (4, 8) for dt in (torch.bfloat16, torch.float16)]
CASES += [(3, 64, 16, torch.bfloat16), (2, 128, 16, torch.float16)]


@pytest.mark.parametrize("bits,head_dim,block_size,dtype", CASES)
def test_dequantize_matches_codec(bits, head_dim, block_size, dtype):
    gen = torch.Generator().manual_seed(bits * 1000 + head_dim + block_size)
    c = codec(head_dim, bits, 3)
    packed, norms = random_cache(9, block_size, 3, c, gen)
    ids = torch.tensor([7, 2, 2, 5], dtype=torch.int32)
    out = torch.full((4, block_size, 3, head_dim), float("nan"), dtype=dtype)
    tq_dequantize_blocks(packed, norms, ids, c, out)
    ref = c.decode(packed[ids.long()], norms[ids.long()], torch.float64)
    assert rel_err(out, ref) <= (1e-6 if dtype == torch.float32 else 8e-3)


def test_dequantize_checks_out_shape():
    c = codec(64, 4)
    packed = torch.zeros(2, 16, 1, c.packed_dim, dtype=torch.uint8)
    with pytest.raises(ValueError, match="out must have shape"):
        tq_dequantize_blocks(packed, torch.zeros(2, 16, 1), torch.tensor([0]), c, torch.empty(2, 16, 1, 64))
