"""The connector's in-place block kernels against their definitions: tq_encode_blocks writes the bytes that
tq_encode_store writes for the same blocks' tokens (and the reference); tq_dequantize_blocks with out_blocks
scatters what it decodes into a paged cache and writes nothing else; piece_checksums of listed blocks equals
the checksums of those blocks copied out. Every bit width, head_dim 64 and 128, odd block counts, float
caches viewed like vLLM's FLASH_ATTN layout ([NB, H, BS, 2·D] logical over [NB, BS, H, 2·D]: K and V
strided). The whole-model forms (tq_encode_layers, tq_dequantize_layers: one launch over every layer's
separately allocated cache) write exactly what the one-layer forms write layer by layer, at aligned and
unaligned layer starts, the load skips the blocks its ok flags refuse, and with verify it writes exactly the
pieces whose checksums match (and reports every piece's sums)."""

import pytest
import torch
from kernel_cases import BIT_PAIRS, POISON_BYTE, codec, random_cache, rel_err, scales_of

from tiercache.kernels import (
    PagedLayers,
    piece_checksums,
    tq_dequantize_blocks,
    tq_dequantize_layers,
    tq_encode_blocks,
    tq_encode_layers,
    tq_encode_store,
)
from tiercache.kernels.dequantize import verifiable
from tiercache.kernels.reference import piece_checksums_reference

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
    for x, packed, norms, c in ((key, got[0], got[1], kc), (value, got[2], got[3], vc)):
        rows = packed[dst].reshape(-1, packed.shape[-1])
        want = scales_of(x.reshape(-1, head_dim), rows, c).view_as(norms[dst])
        torch.testing.assert_close(norms[dst].double(), want, rtol=1e-5, atol=0)


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
    groups = [[sections[0], sections[2]], [sections[1], sections[3]]]
    blocks = torch.tensor([9, 1, 1, 4, 0, 7, 3])
    copied = [[s.index_select(1, blocks) for s in group] for group in groups]
    want = piece_checksums_reference(copied)
    assert torch.equal(piece_checksums(groups, blocks), want)
    assert torch.equal(piece_checksums_reference(groups, blocks), want)
    assert piece_checksums(groups, blocks[:0]).shape == (0, 2, 3, 2)


def model_kv(layers, num_blocks, block_size, heads, head_dim, dtype, gen, shift=0):
    """K and V sides of `layers` separately allocated FLASH_ATTN-style caches; shift > 0 starts layer l
    l · shift elements into its allocation (layer starts not 16 bytes apart)."""
    k_sides, v_sides = [], []
    for layer in range(layers):
        flat = (
            torch.randn(layer * shift + num_blocks * block_size * heads * 2 * head_dim, generator=gen) * 2
        ).to(dtype)
        cache = flat[layer * shift :].view(num_blocks, block_size, heads, 2 * head_dim)
        k_sides.append(cache[..., :head_dim])
        v_sides.append(cache[..., head_dim:])
    return k_sides, v_sides


def layered_poison(layers, num_blocks, block_size, heads, kc, vc):
    return [torch.stack([t] * layers) for t in poisoned(num_blocks, block_size, heads, kc, vc)]


@pytest.mark.parametrize("k_bits,v_bits", BIT_PAIRS)
@pytest.mark.parametrize("head_dim,dtype,shift", [(64, torch.float32, 0), (128, torch.bfloat16, 0),
                                                  (64, torch.float16, 3)])  # fmt: skip
def test_encode_layers_equals_encode_blocks_layer_by_layer(k_bits, v_bits, head_dim, dtype, shift):
    gen = torch.Generator().manual_seed(k_bits * 10 + v_bits + head_dim + shift)
    kc, vc = codec(head_dim, k_bits, 1), codec(head_dim, v_bits, 2)
    layers, heads, bs = 3, 3, 16
    k_sides, v_sides = model_kv(layers, 9, bs, heads, head_dim, dtype, gen, shift)
    keys, values = PagedLayers(k_sides), PagedLayers(v_sides)
    assert (keys.align > 1) == (shift == 0)
    src = torch.tensor([8, 0, 3, 5, 1], dtype=torch.int32)
    dst = torch.tensor([4, 6, 0, 2, 5])
    got = layered_poison(layers, 7, bs, heads, kc, vc)
    tq_encode_layers(keys, values, src, dst, *got, kc, vc)
    for layer in range(layers):
        want = poisoned(7, bs, heads, kc, vc)
        tq_encode_blocks(k_sides[layer], v_sides[layer], src, dst, *want, kc, vc)
        for a, b in zip((t[layer] for t in got), want, strict=True):
            assert same(a, b), f"layer {layer} differs from tq_encode_blocks"


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("head_dim,dtype,shift", [(64, torch.float32, 0), (128, torch.bfloat16, 0),
                                                  (128, torch.bfloat16, 5)])  # fmt: skip
def test_dequantize_layers_equals_dequantize_blocks_and_skips_refused_blocks(bits, head_dim, dtype, shift):
    gen = torch.Generator().manual_seed(bits + head_dim + shift)
    c = codec(head_dim, bits, 3)
    layers, heads, bs = 3, 2, 16
    caches = [random_cache(8, bs, heads, c, gen) for _ in range(layers)]
    packed = torch.stack([p for p, _ in caches])
    norms = torch.stack([n for _, n in caches])
    k_sides, _ = model_kv(layers, 10, bs, heads, head_dim, dtype, gen, shift)
    want = [side.clone() for side in k_sides]
    ids = torch.tensor([6, 1, 1, 4, 0], dtype=torch.int32)
    out_blocks = torch.tensor([9, 0, 3, 2, 7])
    ok = torch.tensor([True, True, False, True, False])
    tq_dequantize_layers(packed, norms, ids, c, PagedLayers(k_sides), out_blocks, ok=ok)
    for layer in range(layers):
        tq_dequantize_blocks(packed[layer], norms[layer], ids[ok], c, want[layer], out_blocks=out_blocks[ok])
        assert torch.equal(k_sides[layer], want[layer]), (
            f"layer {layer} differs (or a refused block was written)"
        )
    tq_dequantize_layers(packed, norms, ids, c, PagedLayers(k_sides), out_blocks)  # no flags: all of them
    for layer in range(layers):
        tq_dequantize_blocks(packed[layer], norms[layer], ids, c, want[layer], out_blocks=out_blocks)
        assert torch.equal(k_sides[layer], want[layer])


def test_paged_layers_and_the_layered_kernels_check_their_arguments():
    gen = torch.Generator().manual_seed(0)
    c = codec(64, 4)
    k_sides, v_sides = model_kv(2, 4, 16, 2, 64, torch.float32, gen)
    with pytest.raises(ValueError, match="layer 1 is .* strides"):
        PagedLayers([k_sides[0], k_sides[1].contiguous()])
    with pytest.raises(ValueError, match="layer 1"):
        PagedLayers([k_sides[0], k_sides[1].to(torch.bfloat16)])
    with pytest.raises(ValueError, match="no layers"):
        PagedLayers([])
    caches = layered_poison(3, 4, 16, 2, c, c)  # three layers of pages for two layers of cache
    with pytest.raises(ValueError, match=r"\[2 layers"):
        tq_encode_layers(PagedLayers(k_sides), PagedLayers(v_sides), torch.tensor([0]), torch.tensor([1]),
                         *caches, c, c)  # fmt: skip
    with pytest.raises(ValueError, match="PagedLayers"):
        tq_encode_layers(k_sides, v_sides, torch.tensor([0]), torch.tensor([1]), *caches, c, c)
    with pytest.raises(ValueError, match="one flag per listed block"):
        tq_dequantize_layers(caches[0][:2], caches[1][:2], torch.tensor([0]), c, PagedLayers(k_sides),
                             torch.tensor([1]), ok=torch.tensor([1, 0]))  # fmt: skip


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("head_dim,dtype,shift", [(64, torch.float32, 0), (128, torch.bfloat16, 5)])
def test_dequantize_layers_verify_writes_exactly_the_intact_pieces(bits, head_dim, dtype, shift):
    """Pieces with a flipped byte (packed or norms) or a wrong expected sum stay unwritten, every other piece
    is written as tq_dequantize_blocks writes it, and got holds every piece's sums (the reference's)."""
    gen = torch.Generator().manual_seed(bits * 7 + head_dim)
    c = codec(head_dim, bits, 3)
    layers, heads, bs = 3, 2, 16
    caches = [random_cache(8, bs, heads, c, gen) for _ in range(layers)]
    packed = torch.stack([p for p, _ in caches])
    norms = torch.stack([n for _, n in caches])
    ids = torch.tensor([6, 1, 4, 0, 3], dtype=torch.int32)
    out_blocks = torch.tensor([9, 0, 3, 2, 7])
    expected = piece_checksums_reference([[packed, norms]], ids)[:, 0].clone()  # [N, L, 2] as stored
    packed[1, 6, 3, 1, 0] ^= 0x10  # listed block 0, layer 1: a packed byte
    norms[2, 4].view(torch.uint8).view(-1)[5] ^= 0x01  # listed block 2, layer 2: a norm's byte
    expected[3, 0, 1] += 1  # listed block 3, layer 0: the stored sum disagrees
    bad = {(0, 1), (2, 2), (3, 0)}
    k_sides, _ = model_kv(layers, 10, bs, heads, head_dim, dtype, gen, shift)
    want = [side.clone() for side in k_sides]
    got = torch.full_like(expected, -1)
    assert verifiable(packed, norms)
    tq_dequantize_layers(packed, norms, ids, c, PagedLayers(k_sides), out_blocks, verify=(expected, got))
    assert torch.equal(got, piece_checksums_reference([[packed, norms]], ids)[:, 0])
    for layer in range(layers):
        keep = torch.tensor([(i, layer) not in bad for i in range(len(ids))])
        tq_dequantize_blocks(
            packed[layer], norms[layer], ids[keep], c, want[layer], out_blocks=out_blocks[keep]
        )
        assert torch.equal(k_sides[layer], want[layer]), f"layer {layer}: a changed piece was written"


def test_verify_checks_its_arguments():
    gen = torch.Generator().manual_seed(1)
    c = codec(64, 4)
    packed, norms = (torch.stack([t, t]) for t in random_cache(4, 16, 2, c, gen))
    k_sides, _ = model_kv(2, 4, 16, 2, 64, torch.float32, gen)
    ids, dst = torch.tensor([0, 2]), torch.tensor([1, 3])
    sums = torch.zeros(2, 2, 2, dtype=torch.int64)
    with pytest.raises(ValueError, match="ok or verify"):
        tq_dequantize_layers(packed, norms, ids, c, PagedLayers(k_sides), dst, ok=torch.tensor([True, True]),
                             verify=(sums, sums.clone()))  # fmt: skip
    with pytest.raises(ValueError, match=r"int64 tensor \[2, 2, 2\]"):
        tq_dequantize_layers(packed, norms, ids, c, PagedLayers(k_sides), dst, verify=(sums[:1], sums))
    strided = packed[:, :, ::2]  # every other token: pieces not contiguous
    halves = PagedLayers([s[:, ::2] for s in k_sides])
    with pytest.raises(ValueError, match="separate pass"):
        tq_dequantize_layers(strided, norms[:, :, ::2], ids, c, halves, dst, verify=(sums, sums.clone()))
    assert not verifiable(strided, norms[:, :, ::2])
