"""Attention over one layer's TurboQuant pages (primary mode), through the kernels' launchers (their PyTorch
references where Triton does not run). Independent of vLLM: the backend calls it with vLLM's tensors.

Provides:
    PagedAttention(page_format, k_codec, v_codec, num_heads, scale)
        write(pages, key, value, slot_mapping)      encode the step's new tokens into their slots
        decode(pages, query, block_table, seq_lens, out, workspace=None)
                                                    one query token per sequence (tq_decode_attention)
        prefill(pages, query, query_start_loc, seq_lens, block_table, out, varlen=None)
                                                    any number of query tokens per sequence: its cached
                                                    tokens dequantized (tq_dequantize_blocks), then causal
                                                    softmax attention: one `varlen` call over all sequences
                                                    (a paged varlen kernel, e.g. FlashAttention's) or, without
                                                    one, SDPA per sequence (grouped-query)
    workspace(query, block_table) -> DecodeWorkspace   decode scratch, reserved up front (CUDA graphs)
    causal_attention(q, k, v, scale) -> out     one sequence's last len(q) tokens over its keys (SDPA, GQA)
    VarlenAttention                             the `varlen` contract (below)

Shapes (one layer): pages [NB, page_bytes] uint8; key, value [T, H, D]; query, out [T, Hq, D] (prefill) or
[B, Hq, D] (decode); block_table [S, max_blocks] int32; seq_lens [S] (tokens of each sequence, this step's
included); query_start_loc [S + 1] (cumulative query tokens); slot = block · block_size + offset.

Every key and value is read back from the pages, this step's tokens too (write() runs first): a token sees
the same quantized K/V whichever path computes its attention, which is what benchmarks/quality.py simulates.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from tiercache.kernels import DecodeWorkspace, tq_decode_attention, tq_dequantize_blocks, tq_encode_store
from tiercache.kernels.codec import TurboQuantCodec
from tiercache.pages import PageFormat, PageViews

# varlen(q [T, Hq, D], k [N, BS, H, D], v [N, BS, H, D], out [T, Hq, D], cu_seqlens_q [S + 1] int32,
#        max_seqlen_q, seqused_k [S] int32, max_seqlen_k, block_table [S, M] int32 (rows of k/v), scale)
# writes causal attention into out; each sequence's queries are its last tokens (bottom-right alignment).
VarlenAttention = Callable[..., None]


class PagedAttention:
    def __init__(
        self, page_format: PageFormat, k_codec: TurboQuantCodec, v_codec: TurboQuantCodec, num_heads: int,
        scale: float,
    ) -> None:  # fmt: skip
        if num_heads % page_format.num_kv_heads:
            raise ValueError(
                f"{num_heads} query heads are not a multiple of {page_format.num_kv_heads} KV heads"
            )
        if (k_codec.packed_dim, v_codec.packed_dim) != (page_format.k_packed_dim, page_format.v_packed_dim):
            raise ValueError(
                f"codecs pack {k_codec.packed_dim} + {v_codec.packed_dim} bytes per vector, the page format "
                f"{page_format.k_packed_dim} + {page_format.v_packed_dim}"
            )
        self.format = page_format
        self.k_codec, self.v_codec = k_codec, v_codec
        self.num_heads = num_heads
        self.scale = scale

    def write(self, pages: torch.Tensor, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor):
        v = self.format.views(pages)
        tq_encode_store(key, value, slot_mapping, v.k_packed, v.k_norms, v.v_packed, v.v_norms,
                        self.k_codec, self.v_codec)  # fmt: skip

    def decode(
        self,
        pages: torch.Tensor,
        query: torch.Tensor,
        block_table: torch.Tensor,
        seq_lens: torch.Tensor,
        out: torch.Tensor,
        workspace: DecodeWorkspace | None = None,
    ) -> torch.Tensor:
        v = self.format.views(pages)
        return tq_decode_attention(
            query, v.k_packed, v.k_norms, v.v_packed, v.v_norms, block_table, seq_lens, self.k_codec,
            self.v_codec, self.scale, workspace=workspace, out=out,
        )  # fmt: skip

    def workspace(self, query: torch.Tensor, block_table: torch.Tensor) -> DecodeWorkspace:
        """Decode scratch for up to query.shape[0] sequences of up to block_table.shape[1] blocks."""
        return DecodeWorkspace.allocate(query, block_table, self.format.block_size, self.format.num_kv_heads)

    def prefill(
        self,
        pages: torch.Tensor,
        query: torch.Tensor,
        query_start_loc: torch.Tensor,
        seq_lens: torch.Tensor,
        block_table: torch.Tensor,
        out: torch.Tensor,
        varlen: VarlenAttention | None = None,
        seq_lens_device: torch.Tensor | None = None,
        query_start_loc_device: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Causal attention of each sequence's query tokens (its last ones) over all its cached tokens.
        query_start_loc / seq_lens on the host; with `varlen`, also their device copies (int32)."""
        views = self.format.views(pages)
        if varlen is not None:
            return self._prefill_varlen(views, query, query_start_loc, seq_lens, block_table, out, varlen,
                                        seq_lens_device, query_start_loc_device)  # fmt: skip
        starts = query_start_loc.tolist()
        for i, length in enumerate(seq_lens.tolist()):
            first, last = starts[i], starts[i + 1]
            if last > first:
                keys, values = self._gather(views, block_table[i], length, query.dtype)
                out[first:last] = causal_attention(query[first:last], keys, values, self.scale)
        return out

    def _prefill_varlen(self, views: PageViews, query, query_start_loc, seq_lens, block_table, out, varlen,
                        seq_lens_device, query_start_loc_device) -> torch.Tensor:  # fmt: skip
        """Every sequence's blocks dequantized into one workspace [N, BS, H, D] (one launch per side), then
        one varlen call over a block table of workspace rows."""
        bs, h, device = self.format.block_size, self.format.num_kv_heads, query.device
        lengths = seq_lens.tolist()
        counts = [-(-n // bs) for n in lengths]
        ids = torch.cat([block_table[i, :c] for i, c in enumerate(counts)]).long()
        rows = torch.zeros(len(counts), max(counts), dtype=torch.int32)
        first = 0
        for i, c in enumerate(counts):
            rows[i, :c] = torch.arange(first, first + c, dtype=torch.int32)
            first += c
        work = []
        for packed, norms, codec in ((views.k_packed, views.k_norms, self.k_codec),
                                     (views.v_packed, views.v_norms, self.v_codec)):  # fmt: skip
            x = torch.empty(ids.shape[0], bs, h, codec.head_dim, dtype=query.dtype, device=device)
            tq_dequantize_blocks(packed, norms, ids, codec, x)
            work.append(x)
        q_lens = query_start_loc[1:] - query_start_loc[:-1]
        varlen(query, work[0], work[1], out, query_start_loc_device, int(q_lens.max()), seq_lens_device,
               max(lengths), rows.to(device, non_blocking=True), self.scale)  # fmt: skip
        return out

    def _gather(self, views: PageViews, blocks: torch.Tensor, length: int, dtype: torch.dtype):
        """The first `length` tokens of a sequence, dequantized: keys, values [length, H, D]."""
        bs, h = self.format.block_size, self.format.num_kv_heads
        ids = blocks[: -(-length // bs)]
        out = []
        for packed, norms, codec in ((views.k_packed, views.k_norms, self.k_codec),
                                     (views.v_packed, views.v_norms, self.v_codec)):  # fmt: skip
            x = torch.empty(ids.shape[0], bs, h, codec.head_dim, dtype=dtype, device=packed.device)
            tq_dequantize_blocks(packed, norms, ids, codec, x)
            out.append(x.view(-1, h, codec.head_dim)[:length])
        return out


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q [Lq, Hq, D] are the last Lq of the sequence's len(k) tokens; causal over k, v [L, H, D] (GQA)."""
    lq, length = q.shape[0], k.shape[0]
    allowed = (
        torch.arange(length, device=q.device) <= torch.arange(length - lq, length, device=q.device)[:, None]
    )
    attended = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=allowed, scale=scale,
        enable_gqa=True,
    )  # fmt: skip
    return attended.transpose(0, 1)
