"""The connector's in-place block kernels against their definitions: tq_encode_blocks writes the bytes that
tq_encode_store writes for the same blocks' tokens (and the reference); tq_dequantize_blocks with out_blocks
scatters what it decodes into a paged cache and writes nothing else; block_checksums of listed blocks equals
the checksums of those blocks copied out. Every bit width, head_dim 64 and 128, odd block counts, float
caches viewed like vLLM's FLASH_ATTN layout ([NB, H, BS, 2·D] logical over [NB, BS, H, 2·D]: K and V
strided)."""

import pytest
import torch
from kernel_cases import BIT_PAIRS, POISON_BYTE, codec, random_cache, rel_err

from tiercache.kernels import block_checksums, tq_dequantize_blocks, tq_encode_blocks, tq_encode_store
from tiercache.kernels.reference import block_checksums_reference, encode_store_reference

ENCODE_CASES = [(kb, vb, d, 16, torch.bfloat16) for kb, vb in BIT_PAIRS for d in (64, 128)]
ENCODE_CASES += [(4, 4, 64, 32, torch.float32), (8, 4, 128, 16, torch.float16)]


def paged_kv(num_blocks, block_size, heads, head_dim, dtype, gen):
    """K and V sides [NB, BS, H, D] of one FLASH_ATTN-style cache (K‖V on the last dim): strided views."""
    cache = (torch.randn(num_blocks, block_size, heads, 2 * head_dim, generator=gen) * 2).to(dtype)
    return cache[..., :head_dim], cache[..., head_dim:]


def poisoned(num_blocks, block_size, heads, kc, vc):
    return [
        torch.full((num_blocks, block_size, heads, kc.packed_dim), POISON_BYTE, dtype=torch.uint8),
        torch.full((num_blocks, block_size, heads), float("nan")),
        torch.full((num_blocks, block_size, heads, vc.packed_dim), POISON_BYTE, dtype=torch.uint8),
        torch.full((num_blocks, block_size, heads), float("nan")),
    ]


def same(a, b) -> bool:
    return (
        torch.equal(a, b)
        if a.dtype == torch.uint8
        else torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())
    )


@pytest.mark.parametrize("k_bits,v_bits,head_dim,block_size,dtype", ENCODE_CASES)
def test_encode_blocks_equals_encode_store_of_their_tokens(k_bits, v_bits, head_dim, block_size, dtype):
    gen = torch.Generator().manual_seed(k_bits * 100 + v_bits * 10 + head_dim + block_size)
    kc, vc = codec(head_dim, k_bits, 1), codec(head_dim, v_bits, 2)
    heads = 3
    key_cache, value_cache = paged_kv(11, block_size, heads, head_dim, dtype, gen)
    src = torch.tensor([9, 0, 4, 7, 3], dtype=torch.int32)  # odd count, out of order
    dst = torch.tensor([2, 6, 0, 5, 3])
    got = poisoned(8, block_size, heads, kc, vc)
    tq_encode_blocks(key_cache, value_cache, src, dst, *got, kc, vc)
    slots = (dst[:, None] * block_size + torch.arange(block_size)).reshape(-1)
    key = key_cache[src.long()].reshape(-1, heads, head_dim)
    value = value_cache[src.long()].reshape(-1, heads, head_dim)
    via_store = poisoned(8, block_size, heads, kc, vc)
    tq_encode_store(key, value, slots, *via_store, kc, vc)
    for a, b in zip(got, via_store, strict=True):
        assert same(a, b)
    untouched = torch.ones(8, dtype=torch.bool)
    untouched[dst] = False
    assert (got[0][untouched] == POISON_BYTE).all() and got[1][untouched].isnan().all()
    ref = poisoned(8, block_size, heads, kc, vc)
    encode_store_reference(key, value, slots, *ref, kc, vc)
    assert torch.allclose(got[1][dst], ref[1][dst], rtol=2e-6) and torch.allclose(
        got[3][dst], ref[3][dst], rtol=2e-6
    )


def test_encode_blocks_checks_its_arguments():
    kc = codec(64, 4, 1)
    key_cache, value_cache = paged_kv(4, 16, 2, 64, torch.float32, torch.Generator().manual_seed(0))
    caches = poisoned(4, 16, 2, kc, kc)
    with pytest.raises(ValueError, match="differ in length"):
        tq_encode_blocks(key_cache, value_cache, torch.tensor([0, 1]), torch.tensor([0]), *caches, kc, kc)
    with pytest.raises(ValueError, match="block size"):
        small = poisoned(4, 8, 2, kc, kc)
        tq_encode_blocks(key_cache, value_cache, torch.tensor([0]), torch.tensor([0]), *small, kc, kc)


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("head_dim,dtype", [(64, torch.float32), (128, torch.bfloat16)])
def test_dequantize_scatters_into_a_paged_cache(bits, head_dim, dtype):
    gen = torch.Generator().manual_seed(bits + head_dim)
    c = codec(head_dim, bits, 3)
    packed, norms = random_cache(9, 16, 3, c, gen)
    key_side, _ = paged_kv(12, 16, 3, head_dim, dtype, gen)
    key_side.fill_(float("nan"))
    ids = torch.tensor([7, 2, 2, 5, 0], dtype=torch.int32)
    out_blocks = torch.tensor([11, 0, 4, 3, 8])
    tq_dequantize_blocks(packed, norms, ids, c, key_side, out_blocks=out_blocks)
    want = c.decode(packed[ids.long()], norms[ids.long()], torch.float64)
    assert rel_err(key_side[out_blocks], want) <= (1e-6 if dtype == torch.float32 else 8e-3)
    others = torch.ones(12, dtype=torch.bool)
    others[out_blocks] = False
    assert key_side[others].isnan().all(), "a block not in out_blocks was written"


def test_dequantize_out_blocks_checks_shapes():
    c = codec(64, 4)
    packed, norms = torch.zeros(2, 16, 1, c.packed_dim, dtype=torch.uint8), torch.zeros(2, 16, 1)
    with pytest.raises(ValueError, match="out_blocks has 1 entries for 2"):
        tq_dequantize_blocks(packed, norms, torch.tensor([0, 1]), c, torch.empty(4, 16, 1, 64),
                             out_blocks=torch.tensor([3]))  # fmt: skip
    with pytest.raises(ValueError, match="paged cache"):
        tq_dequantize_blocks(packed, norms, torch.tensor([0]), c, torch.empty(4, 8, 1, 64),
                             out_blocks=torch.tensor([3]))  # fmt: skip


@pytest.mark.parametrize("pk,pv", [(64, 32), (100, 36), (3, 5)])  # whole words and the byte path
def test_checksums_of_listed_blocks(pk, pv):
    g = torch.Generator().manual_seed(pk + pv)
    sections = [
        torch.randint(0, 256, (3, 10, 4, 2, pk), generator=g, dtype=torch.uint8),
        torch.randint(0, 256, (3, 10, 4, 2, pv), generator=g, dtype=torch.uint8),
        torch.randn(3, 10, 4, 2, generator=g),
        torch.randn(3, 10, 4, 2, generator=g),
    ]
    blocks = torch.tensor([9, 1, 1, 4, 0, 7, 3])
    copied = [s.index_select(1, blocks) for s in sections]
    want = block_checksums_reference(copied)
    assert torch.equal(block_checksums(sections, blocks), want)
    assert torch.equal(block_checksums_reference(sections, blocks), want)
    assert block_checksums(sections, blocks[:0]).shape == (0, 2)
