"""tq_dequantize_blocks against codec.decode: ≤ 1e-6 relative into float32, bf16-rounding level otherwise."""

import pytest
import torch
from kernel_cases import codec, random_cache, rel_err

from tiercache.kernels import DequantizeLaunchConfig, tq_dequantize_blocks

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


@pytest.mark.parametrize(
    "config",
    [  # other launch choices than the defaults: smaller and larger row tiles, one program per SM
        DequantizeLaunchConfig(rows=16, programs_per_sm=1, num_warps=2, num_stages=1),
        DequantizeLaunchConfig(rows=128, programs_per_sm=2),
    ],
)
def test_dequantize_launch_configs(config):
    """The launch configuration changes how the work is cut, not the output."""
    c = codec(128, 4, 3)
    packed, norms = random_cache(9, 16, 3, c, torch.Generator().manual_seed(5))
    ids = torch.tensor([7, 2, 2, 5, 0], dtype=torch.int32)
    out = torch.full((5, 16, 3, 128), float("nan"))
    tq_dequantize_blocks(packed, norms, ids, c, out, config=config)
    assert rel_err(out, c.decode(packed[ids.long()], norms[ids.long()], torch.float64)) <= 1e-6


def test_dequantize_checks_out_shape():
    c = codec(64, 4)
    packed = torch.zeros(2, 16, 1, c.packed_dim, dtype=torch.uint8)
    with pytest.raises(ValueError, match="out must have shape"):
        tq_dequantize_blocks(packed, torch.zeros(2, 16, 1), torch.tensor([0]), c, torch.empty(2, 16, 1, 64))


def test_cpu_fallback_is_the_reference(monkeypatch):
    """Without CUDA and without the interpreter, encode+store and dequantize run the PyTorch references."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    from tiercache.kernels import tq_encode_store
    from tiercache.kernels.reference import encode_store_reference

    kc, vc = codec(64, 4, 1), codec(64, 8, 2)
    x = torch.randn(20, 2, 64, generator=torch.Generator().manual_seed(4))
    slots = torch.arange(20) * 2 - 1  # slot −1 first
    caches = [torch.zeros(4, 16, 2, c.packed_dim, dtype=torch.uint8) for c in (kc, vc)]
    norms = [torch.zeros(4, 16, 2) for _ in range(2)]
    want = [t.clone() for t in (caches[0], norms[0], caches[1], norms[1])]
    tq_encode_store(x, x, slots, caches[0], norms[0], caches[1], norms[1], kc, vc)
    encode_store_reference(x, x, slots, *want, kc, vc)
    for got, ref in zip((caches[0], norms[0], caches[1], norms[1]), want, strict=True):
        assert torch.equal(got, ref)
    out = torch.empty(2, 16, 2, 64)
    tq_dequantize_blocks(caches[0], norms[0], torch.tensor([1, 0]), kc, out)
    assert torch.equal(out, kc.decode(caches[0][[1, 0]], norms[0][[1, 0]]))
