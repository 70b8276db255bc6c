"""tq_encode_store against codec.encode: bytes identical except for values within 1e-6 of a boundary."""

import pytest
import torch
from kernel_cases import BIT_PAIRS, POISON_BYTE, codec, near_boundary, scales_of

from tiercache.kernels import EncodeLaunchConfig, tq_encode_store
from tiercache.kernels.packing import unpack_indices

CASES = [(kb, vb, d, 16, torch.bfloat16) for kb, vb in BIT_PAIRS for d in (64, 128)]
OTHER_DTYPES = (torch.float16, torch.float32)
CASES += [(kb, vb, 128, bs, dt) for kb, vb in [(4, 4), (8, 4)] for bs in (16, 32) for dt in OTHER_DTYPES]


def check_stored(x, slots, packed, norms, c, block_size):
    keep = slots >= 0
    blocks, offsets = slots[keep] // block_size, slots[keep] % block_size
    expect_packed, expect_norms = c.encode(x[keep])
    got = unpack_indices(packed[blocks, offsets].contiguous(), c.bits, c.head_dim)
    want = unpack_indices(expect_packed, c.bits, c.head_dim)
    bad = (got != want) & ~near_boundary(x[keep], c)
    assert not bad.any(), f"{int(bad.sum())} indices differ away from a boundary"
    stored = packed[blocks, offsets].contiguous()
    scales = norms[blocks, offsets].double()
    torch.testing.assert_close(scales, scales_of(x[keep], stored, c), rtol=1e-5, atol=0)
    same = (got == want).all(-1)  # where every index agrees, the scale agrees with codec.encode's
    torch.testing.assert_close(norms[blocks, offsets][same], expect_norms[same], rtol=1e-5, atol=1e-30)
    untouched = torch.ones(packed.shape[:2], dtype=torch.bool)
    untouched[blocks, offsets] = False
    assert (packed[untouched] == POISON_BYTE).all(), "a slot not in slot_mapping was written"
    assert torch.isnan(norms[untouched]).all()


@pytest.mark.parametrize("k_bits,v_bits,head_dim,block_size,dtype", CASES)
def test_encode_store_matches_codec(k_bits, v_bits, head_dim, block_size, dtype):
    gen = torch.Generator().manual_seed(hash((k_bits, v_bits, head_dim, block_size, str(dtype))) % 2**31)
    kc, vc = codec(head_dim, k_bits, 1), codec(head_dim, v_bits, 2)
    tokens, heads, num_blocks = 45, 2, 6
    key = (torch.randn(tokens, heads, head_dim, generator=gen) * 3).to(dtype)
    value = torch.randn(tokens, 3 * heads, head_dim, generator=gen).to(dtype)[:, ::3]  # strided heads
    key[5] = 0  # zero vectors encode to norm 0
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:tokens]
    slots[[2, 11]] = -1
    caches = [
        torch.full((num_blocks, block_size, heads, kc.packed_dim), POISON_BYTE, dtype=torch.uint8),
        torch.full((num_blocks, block_size, heads), float("nan")),
        torch.full((num_blocks, block_size, heads, vc.packed_dim), POISON_BYTE, dtype=torch.uint8),
        torch.full((num_blocks, block_size, heads), float("nan")),
    ]
    tq_encode_store(key, value, slots, *caches, kc, vc)
    check_stored(key, slots, caches[0], caches[1], kc, block_size)
    check_stored(value, slots, caches[2], caches[3], vc, block_size)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # ‖x‖² of the 1e38 rows
@pytest.mark.parametrize("k_bits,v_bits", [(4, 4), (8, 4)])
def test_encode_store_bf16_extreme_scales(k_bits, v_bits):
    """bfloat16 rows far outside float16's range (the kernel rescales them by powers of two) and rows whose
    entries span many decades still encode like codec.encode."""
    gen = torch.Generator().manual_seed(7 + k_bits)
    kc, vc = codec(128, k_bits, 1), codec(128, v_bits, 2)
    scales = torch.tensor([1e-30, 1e-8, 1e-3, 1.0, 7e4, 1e12, 3e30, 1e38]).repeat(3)
    key = (torch.randn(len(scales), 1, 128, generator=gen) * scales[:, None, None]).to(torch.bfloat16)
    key[-1, 0, :64] *= 1e-20  # half of one row 20 decades below the other half
    value = key.flip(0).contiguous()
    slots = torch.arange(len(scales))
    caches = [
        torch.full((2, 16, 1, kc.packed_dim), POISON_BYTE, dtype=torch.uint8),
        torch.full((2, 16, 1), float("nan")),
        torch.full((2, 16, 1, vc.packed_dim), POISON_BYTE, dtype=torch.uint8),
        torch.full((2, 16, 1), float("nan")),
    ]
    tq_encode_store(key, value, slots, *caches, kc, vc)
    check_stored(key, slots, caches[0], caches[1], kc, 16)
    check_stored(value, slots, caches[2], caches[3], vc, 16)


LAUNCH_CONFIGS = [  # other launch choices than the defaults: smaller and larger token tiles, fewer programs
    EncodeLaunchConfig(block_tokens=16, programs_per_sm=1, num_warps=2),
    EncodeLaunchConfig(block_tokens=128, programs_per_sm=3, num_stages=2),
]


@pytest.mark.parametrize("config", LAUNCH_CONFIGS)
def test_encode_store_launch_configs(config):
    """The launch configuration changes how the work is cut, not what is stored."""
    gen = torch.Generator().manual_seed(17)
    kc, vc = codec(64, 4, 1), codec(64, 8, 2)
    key, value = torch.randn(2, 45, 2, 64, generator=gen).to(torch.bfloat16)
    slots = torch.randperm(6 * 16, generator=gen)[:45]
    caches = [
        torch.full((6, 16, 2, kc.packed_dim), POISON_BYTE, dtype=torch.uint8),
        torch.full((6, 16, 2), float("nan")),
        torch.full((6, 16, 2, vc.packed_dim), POISON_BYTE, dtype=torch.uint8),
        torch.full((6, 16, 2), float("nan")),
    ]
    tq_encode_store(key, value, slots, *caches, kc, vc, config=config)
    check_stored(key, slots, caches[0], caches[1], kc, 16)
    check_stored(value, slots, caches[2], caches[3], vc, 16)


def test_encode_store_rejects_wrong_cache():
    kc = codec(64, 4)
    key = torch.randn(3, 1, 64)
    packed = torch.zeros(2, 16, 1, 7, dtype=torch.uint8)
    with pytest.raises(ValueError, match="packed_dim"):
        norms = torch.zeros(2, 16, 1)
        tq_encode_store(key, key, torch.arange(3), packed, norms, packed, norms, kc, kc)
