"""Plain-PyTorch references for the three TurboQuant cache kernels and the piece checksums; also their CPU
fallback.

Provides:
    encode_store_reference(key, value, slot_mapping, k_packed, k_norms, v_packed, v_norms, k_codec, v_codec)
    dequantize_blocks_reference(packed, norms, block_ids, codec, out, out_blocks=None)
    decode_attention_reference(query, k_packed, k_norms, v_packed, v_norms, block_tables, context_lens,
                               k_codec, v_codec, scale=None, compute_dtype=torch.float32) -> [B, Hq, D]
    piece_checksums_reference(groups, blocks=None) -> [n, G, L, 2] int64   (definition and guarantee:
                                                            checksum.py); blocks: which of the sections'
                                                            blocks (all, in order, when None)
    piece_bytes(section) -> [L, n, B] uint8                 a [L, n, …] section's (layer, block) pieces

Cache layout of one layer (see kernels/__init__.py):
    packed [num_blocks, block_size, num_kv_heads, packed_dim] uint8
    norms  [num_blocks, block_size, num_kv_heads] float32
Slot s is (block s // block_size, offset s % block_size); slot −1 is skipped.
The decode reference dequantizes the whole cache with the codec, then runs plain softmax attention in
`compute_dtype` (float64 in the tests). It synchronises with the host; the Triton path does not.
"""

from __future__ import annotations

import math

import torch

from .codec import TurboQuantCodec


def encode_store_reference(
    key: torch.Tensor,
    value: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_packed: torch.Tensor,
    k_norms: torch.Tensor,
    v_packed: torch.Tensor,
    v_norms: torch.Tensor,
    k_codec: TurboQuantCodec,
    v_codec: TurboQuantCodec,
) -> None:
    """Encode key/value [T, H, D] and write them into their slots, in place."""
    for x, packed, norms, codec in ((key, k_packed, k_norms, k_codec), (value, v_packed, v_norms, v_codec)):
        block_size = packed.shape[1]
        slots = slot_mapping.to(torch.int64)
        keep = slots >= 0
        slots = slots[keep]
        codes, gammas = codec.encode(x[keep])
        blocks, offsets = slots // block_size, slots % block_size
        packed[blocks, offsets] = codes
        norms[blocks, offsets] = gammas


def dequantize_blocks_reference(
    packed: torch.Tensor,
    norms: torch.Tensor,
    block_ids: torch.Tensor,
    codec: TurboQuantCodec,
    out: torch.Tensor,
    out_blocks: torch.Tensor | None = None,
) -> torch.Tensor:
    """out[i] = decode(packed[block_ids[i]]) for every i, out [N, BS, H, D] of a float dtype; with
    out_blocks, out[out_blocks[i]] (out a paged cache [NB, BS, H, D])."""
    ids = block_ids.to(torch.int64)
    x = codec.decode(packed[ids], norms[ids], out.dtype)
    if out_blocks is None:
        out.copy_(x)
    else:
        out[out_blocks.to(torch.int64)] = x
    return out


def decode_attention_reference(
    query: torch.Tensor,
    k_packed: torch.Tensor,
    k_norms: torch.Tensor,
    v_packed: torch.Tensor,
    v_norms: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    k_codec: TurboQuantCodec,
    v_codec: TurboQuantCodec,
    scale: float | None = None,
    compute_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Softmax attention of query [B, Hq, D] over the first context_lens[b] cached tokens → [B, Hq, D]."""
    _, num_q_heads, head_dim = query.shape
    num_kv_heads = k_packed.shape[2]
    group = num_q_heads // num_kv_heads
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    out = torch.empty_like(query)
    for b, length in enumerate(context_lens.tolist()):
        blocks = block_tables[b].to(torch.int64)
        k = _gather_tokens(k_codec, k_packed, k_norms, blocks, length).to(compute_dtype)  # [L, H, D]
        v = _gather_tokens(v_codec, v_packed, v_norms, blocks, length).to(compute_dtype)
        q = query[b].to(compute_dtype).view(num_kv_heads, group, head_dim)  # [H, G, D]
        scores = torch.einsum("hgd,lhd->hgl", q, k) * scale
        weights = torch.softmax(scores, dim=-1)
        out[b] = torch.einsum("hgl,lhd->hgd", weights, v).reshape(num_q_heads, head_dim).to(query.dtype)
    return out


def _gather_tokens(
    codec: TurboQuantCodec, packed: torch.Tensor, norms: torch.Tensor, blocks: torch.Tensor, length: int
) -> torch.Tensor:
    block_size = packed.shape[1]
    used = blocks[: -(-length // block_size)]
    x = codec.decode(packed[used], norms[used])  # [n, BS, H, D] f32
    return x.reshape(-1, *x.shape[2:])[:length]


def piece_bytes(section: torch.Tensor) -> torch.Tensor:
    """[L, n, …] of any dtype → [L, n, B] uint8: each (layer, block) piece's bytes in memory order (a view
    where the trailing dimensions are contiguous, else a copy)."""
    layers, n = section.shape[:2]
    per = 1
    for size in section.shape[2:]:
        per *= size
    flat = section.reshape(layers, n, per)
    if flat.shape[2] and flat.stride(2) != 1:
        flat = flat.contiguous()
    return flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat


def piece_checksums_reference(groups, blocks: torch.Tensor | None = None) -> torch.Tensor:
    """(S1, S2) per piece, [n, G, L, 2] int64 wrapping like the Triton kernel (checksum.py defines them);
    blocks [n]: those blocks of the groups' [L, NB, …] sections, in that order."""
    if blocks is not None:
        idx = blocks.to(device=groups[0][0].device, dtype=torch.int64)
        groups = [[t.index_select(1, idx) for t in group] for group in groups]
    layers, n = groups[0][0].shape[:2]
    out = torch.zeros(n, len(groups), layers, 2, dtype=torch.int64, device=groups[0][0].device)
    for g, group in enumerate(groups):
        raws = []
        for section in group:
            raw = piece_bytes(section)
            raws.append(torch.nn.functional.pad(raw, (0, -raw.shape[2] % 4)))
        w = torch.cat(raws, 2).contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF  # [L, n, W]
        pos = torch.arange(1, w.shape[2] + 1, dtype=torch.int64, device=w.device)
        out[:, g, :, 0] = w.sum(2).T
        out[:, g, :, 1] = (w * pos).sum(2).T
    return out
