"""Primary mode's attention over TurboQuant pages: page views alias the page bytes, writes land in their
slots (the tokens read back are the codec round trip of the tokens written), and decode and prefill equal
float64 softmax attention over the tokens the pages hold."""

from __future__ import annotations

import math

import pytest
import torch

from tiercache.codecs import KVCodecSpec
from tiercache.pages import PageFormat
from tiercache.worker.paged_attention import PagedAttention

CODECS = ["tq4", "k8v4", "k3v4", "tq3"]
SHAPES = [(64, 16, 2, 6), (128, 32, 1, 4), (64, 16, 3, 3)]  # head_dim, block size, kv heads, query heads/kv


def make(preset: str, head_dim: int, block_size: int, kv_heads: int, group: int):
    spec = KVCodecSpec.from_preset(preset)
    codec = spec.build(head_dim, torch.float32)
    fmt = PageFormat.from_spec(spec, kv_heads, head_dim, block_size)
    attn = PagedAttention(fmt, codec.keys, codec.values, kv_heads * group, 1 / math.sqrt(head_dim))
    return codec, fmt, attn


def fill(attn: PagedAttention, fmt: PageFormat, lengths: list[int], seed: int = 0):
    """Pages holding sequences of these lengths in scattered blocks; returns pages, block table, K, V."""
    gen = torch.Generator().manual_seed(seed)
    d, bs, h = attn.k_codec.head_dim, fmt.block_size, fmt.num_kv_heads
    per_seq = [-(-n // bs) for n in lengths]
    blocks = torch.randperm(sum(per_seq) + 3, generator=gen)[: sum(per_seq)]
    table = torch.zeros(len(lengths), max(per_seq), dtype=torch.int32)
    pages = torch.zeros(sum(per_seq) + 3, fmt.page_bytes, dtype=torch.uint8)
    keys, values, used = [], [], 0
    for i, n in enumerate(lengths):
        table[i, : per_seq[i]] = blocks[used : used + per_seq[i]]
        used += per_seq[i]
        k, v = torch.randn(n, h, d, generator=gen) * 3, torch.randn(n, h, d, generator=gen)
        slots = table[i, torch.arange(n) // bs].long() * bs + torch.arange(n) % bs
        attn.write(pages, k, v, slots)
        keys.append(k)
        values.append(v)
    return pages, table, keys, values


def stored(codec, fmt: PageFormat, pages, blocks, n: int):
    """The first n tokens a sequence's pages hold, decoded with the codec itself: K, V [n, H, D] float64."""
    views, bs = fmt.views(pages), fmt.block_size
    ids = blocks[torch.arange(n) // bs].long()
    offsets = torch.arange(n) % bs
    k = codec.keys.decode(views.k_packed[ids, offsets], views.k_norms[ids, offsets]).double()
    v = codec.values.decode(views.v_packed[ids, offsets], views.v_norms[ids, offsets]).double()
    return k, v


def reference(q, kq, vq, scale):
    """float64 causal attention of q [Lq, Hq, D] (the last tokens) over kq, vq [n, H, D]."""
    group = q.shape[1] // kq.shape[1]
    kq, vq = kq.repeat_interleave(group, dim=1), vq.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), kq) * scale
    lq, n = q.shape[0], kq.shape[0]
    scores.masked_fill_(torch.arange(n) > torch.arange(n - lq, n)[:, None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, -1), vq)


def rel(a, b) -> float:
    return float((a.double() - b).norm() / b.norm())


def test_page_views_alias_one_contiguous_page_per_block():
    fmt = PageFormat(16, 2, 64, 32)
    assert fmt.token_head_bytes == 64 + 32 + 8 and fmt.page_bytes == 16 * 2 * 104
    pages = torch.zeros(5, fmt.page_bytes, dtype=torch.uint8)
    views = fmt.views(pages)
    assert views.k_packed.shape == (5, 16, 2, 64) and views.v_norms.shape == (5, 16, 2)
    views.v_norms[3, 15, 1] = 1.0  # the last float of block 3's page
    assert pages[3, -4:].view(torch.float32).item() == 1.0 and pages[[0, 1, 2, 4]].count_nonzero() == 0
    views.k_packed[2, 0, 0, 0] = 7  # the first byte of block 2's page
    assert pages[2, 0] == 7
    with pytest.raises(ValueError, match=r"uint8 \[num_blocks, ≥ 3328\]"):
        fmt.views(pages[:, :100])
    padded = torch.zeros(2, fmt.page_bytes + 56 * 32, dtype=torch.uint8)  # a larger page: padding at its end
    fmt.views(padded).v_norms[1, 15, 1] = 2.0
    assert padded[1, fmt.page_bytes - 4 : fmt.page_bytes].view(torch.float32).item() == 2.0


@pytest.mark.parametrize("preset", ["tq4", "k8v4"])
def test_page_bytes_per_token_and_head(preset):
    fmt = PageFormat.from_spec(KVCodecSpec.from_preset(preset), 8, 128, 16)
    assert fmt.token_head_bytes == {"tq4": 136, "k8v4": 200}[preset]


def test_a_lossless_side_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="primary mode needs TurboQuant keys and values.*k8v4"):
        PageFormat.from_spec(KVCodecSpec.from_preset("none"), 2, 64, 16)


@pytest.mark.parametrize("preset", CODECS)
@pytest.mark.parametrize("shape", SHAPES)
def test_decode_equals_attention_over_the_codec_round_trip(preset, shape):
    head_dim, bs, h, group = shape
    codec, fmt, attn = make(preset, head_dim, bs, h, group)
    lengths = [1, bs, 2 * bs + 5, 3 * bs - 1]
    pages, table, keys, _ = fill(attn, fmt, lengths)
    query = torch.randn(len(lengths), h * group, head_dim, generator=torch.Generator().manual_seed(1))
    out = attn.decode(pages, query, table, torch.tensor(lengths, dtype=torch.int32), torch.empty_like(query))
    for i, n in enumerate(lengths):
        kq, vq = stored(codec, fmt, pages, table[i], n)
        round_trip = codec.keys.decode(*codec.keys.encode(keys[i])).double()
        assert rel(kq, round_trip) < 0.02  # each token in its slot (a wrong slot is an O(1) error)
        expect = reference(query[i : i + 1], kq, vq, attn.scale)[0]
        assert rel(out[i], expect) < 1e-4, (i, rel(out[i], expect))


def torch_varlen(q, k, v, out, cu_seqlens_q, max_seqlen_q, seqused_k, max_seqlen_k, block_table, scale):
    """PagedAttention's `varlen` contract in plain PyTorch: k, v [N, BS, H, D] rows named by block_table."""
    cu = cu_seqlens_q.tolist()
    for i, n in enumerate(seqused_k.tolist()):
        assert cu[i + 1] - cu[i] <= max_seqlen_q and n <= max_seqlen_k
        rows = block_table[i, : -(-n // k.shape[1])].long()
        keys, values = k[rows].flatten(0, 1)[:n].double(), v[rows].flatten(0, 1)[:n].double()
        out[cu[i] : cu[i + 1]] = reference(q[cu[i] : cu[i + 1]], keys, values, scale).to(out.dtype)


@pytest.mark.parametrize("preset", CODECS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("varlen", [None, torch_varlen], ids=["sdpa", "varlen"])
def test_prefill_with_a_cached_prefix_equals_the_reference(preset, shape, varlen):
    head_dim, bs, h, group = shape
    codec, fmt, attn = make(preset, head_dim, bs, h, group)
    lengths = [bs + 3, 2 * bs, 5, 3 * bs + 1]  # whole sequences
    query_lens = [bs + 3, 7, 1, 2 * bs]  # fresh prefill, chunked prefill / prefix hit, decode, chunk
    pages, table, _, values = fill(attn, fmt, lengths, seed=2)
    query = torch.randn(sum(query_lens), h * group, head_dim, generator=torch.Generator().manual_seed(3))
    starts = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()])
    lens = torch.tensor(lengths, dtype=torch.int32)
    out = attn.prefill(pages, query, starts, lens, table, torch.zeros_like(query), varlen=varlen,
                       seq_lens_device=lens, query_start_loc_device=starts.int())  # fmt: skip
    for i, n in enumerate(lengths):
        kq, vq = stored(codec, fmt, pages, table[i], n)
        assert rel(vq, codec.values.decode(*codec.values.encode(values[i])).double()) < 0.02
        got = out[starts[i] : starts[i + 1]]
        expect = reference(query[starts[i] : starts[i + 1]], kq, vq, attn.scale)
        assert rel(got, expect) < 1e-4, (i, rel(got, expect))


@pytest.mark.gpu
@pytest.mark.parametrize("preset", ["tq4", "k8v4"])
@pytest.mark.parametrize(("batch", "tokens"), [(2, 300), (16, 2048)])  # Triton kernels; the Gluon kernel
def test_gpu_pages_with_bf16_queries(preset, batch, tokens):
    """On CUDA the kernels read and write the pages through their strides (a block's sections are one page
    apart); bf16 queries: the tolerance of 16-bit products."""
    codec, fmt, attn = make(preset, 128, 16, 8, 4)
    lengths = [tokens - 7 * i for i in range(batch)]
    pages, table, _, _ = fill(attn, fmt, lengths)
    pages, table = pages.cuda(), table.cuda()
    gen = torch.Generator().manual_seed(5)
    query = torch.randn(batch, 32, 128, generator=gen).to("cuda", torch.bfloat16)
    out = attn.decode(pages, query, table, torch.tensor(lengths, dtype=torch.int32, device="cuda"),
                      torch.empty_like(query))  # fmt: skip
    pages_cpu = pages.cpu()
    for i, n in enumerate(lengths):
        kq, vq = stored(codec, fmt, pages_cpu, table[i].cpu(), n)
        expect = reference(query[i : i + 1].float().cpu(), kq, vq, attn.scale)[0]
        assert rel(out[i].float().cpu(), expect) < 2e-2, (i, rel(out[i].float().cpu(), expect))
    starts = torch.tensor([0, 5, 5 + 64])  # a 5-token chunk of sequence 0, 64 tokens of sequence 1
    q = torch.randn(69, 32, 128, generator=gen).to("cuda", torch.bfloat16)
    lens = torch.tensor(lengths[:2], dtype=torch.int32)
    got = attn.prefill(pages, q, starts, lens, table[:2], torch.zeros_like(q))
    flash = pytest.importorskip("tiercache.connectors.attention.impl")._flash_varlen(128)
    via_flash = attn.prefill(
        pages, q, starts, lens, table[:2], torch.zeros_like(q), varlen=flash, seq_lens_device=lens.cuda(),
        query_start_loc_device=starts.int().cuda(),
    )  # fmt: skip
    for i in range(2):
        kq, vq = stored(codec, fmt, pages_cpu, table[i].cpu(), lengths[i])
        expect = reference(q[starts[i] : starts[i + 1]].float().cpu(), kq, vq, attn.scale)
        assert rel(got[starts[i] : starts[i + 1]].float().cpu(), expect) < 2e-2
        assert rel(via_flash[starts[i] : starts[i + 1]].float().cpu(), expect) < 2e-2
