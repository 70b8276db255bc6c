"""Encode vLLM blocks into the tiers' format and decode tier blocks back into vLLM's cache (one rank).

Provides:
    encode_blocks(codec, k_access, v_access, block_ids, layout) -> KVBlocks   [L, n, BS, H, P] per section
    decode_blocks(codec, blocks, k_access, v_access, block_ids)               writes vLLM's blocks in place
k_access / v_access: one BlockAccess per layer (kv_views.py), in the pools' layer order.
On CUDA, TurboQuant sides go through the kernels' Triton launchers (tq_encode_store, tq_dequantize_blocks);
elsewhere, and for lossless (raw) sides, through the codec itself (exactly codec.decode(codec.encode(x))).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tiercache.codecs import KVCodec, RawCodec
from tiercache.kernels import tq_dequantize_blocks, tq_encode_store
from tiercache.layout import BlockLayout
from tiercache.worker.pools import KVBlocks

from .kv_views import BlockAccess


def encode_blocks(
    codec: KVCodec,
    k_views: Sequence[BlockAccess],
    v_views: Sequence[BlockAccess],
    block_ids: Sequence[int] | torch.Tensor,
    layout: BlockLayout,
) -> KVBlocks:
    device = k_views[0].device
    idx = torch.as_tensor(block_ids, dtype=torch.long, device=device)
    n, L, bs, h = idx.numel(), layout.num_layers, layout.block_size, layout.num_kv_heads
    out = KVBlocks(
        torch.empty(L, n, bs, h, layout.k_packed_dim, dtype=torch.uint8, device=device),
        torch.empty(L, n, bs, h, layout.v_packed_dim, dtype=torch.uint8, device=device),
        torch.empty(L, n, bs, h, dtype=torch.float32, device=device),
        torch.empty(L, n, bs, h, dtype=torch.float32, device=device),
    )
    fused = (
        device.type == "cuda"
        and not isinstance(codec.keys, RawCodec)
        and not isinstance(codec.values, RawCodec)
    )
    slots = torch.arange(n * bs, device=device)
    for layer, (k_view, v_view) in enumerate(zip(k_views, v_views, strict=True)):
        k = k_view.read(idx)  # [n, BS, H, D]
        v = v_view.read(idx)
        if fused:
            tq_encode_store(
                k.reshape(n * bs, h, -1), v.reshape(n * bs, h, -1), slots,
                out.k_packed[layer], out.k_norms[layer], out.v_packed[layer], out.v_norms[layer],
                codec.keys, codec.values,
            )  # fmt: skip
            continue
        for x, side, packed, norms in ((k, codec.keys, out.k_packed, out.k_norms),
                                       (v, codec.values, out.v_packed, out.v_norms)):  # fmt: skip
            p, g = side.encode(x)
            packed[layer].copy_(p)
            norms[layer].copy_(g)
    return out


def decode_blocks(
    codec: KVCodec,
    blocks: KVBlocks,
    k_views: Sequence[BlockAccess],
    v_views: Sequence[BlockAccess],
    block_ids: Sequence[int] | torch.Tensor,
) -> None:
    device = k_views[0].device
    idx = torch.as_tensor(block_ids, dtype=torch.long, device=device)
    n = idx.numel()
    local = torch.arange(n, device=device)
    blocks = blocks.to(device)
    for layer, (k_view, v_view) in enumerate(zip(k_views, v_views, strict=True)):
        sides = ((k_view, codec.keys, blocks.k_packed, blocks.k_norms),
                 (v_view, codec.values, blocks.v_packed, blocks.v_norms))  # fmt: skip
        for view, side, packed, norms in sides:
            if isinstance(side, RawCodec) or device.type != "cuda":
                x = side.decode(packed[layer], norms[layer], view.dtype)
            else:
                x = torch.empty((n, *view.shape), dtype=view.dtype, device=device)
                tq_dequantize_blocks(packed[layer], norms[layer], local, side, x)
            view.write(idx, x)
