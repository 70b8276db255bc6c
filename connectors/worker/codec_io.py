"""Encode vLLM blocks into the tiers' format and decode tier blocks back into vLLM's cache (one rank).

Provides:
    encode_blocks(codec, k_access, v_access, block_ids, layout) -> KVBlocks   [L, n, BS, H, P] per section
    encode_into(codec, k_access, v_access, block_ids, layout, pool, slots)   the same bytes written
                                             straight into pool[:, slots] (pool: [L, NB, …] KVBlocks, slots
                                             [n] int64 on its device)
    decode_blocks(codec, blocks, k_access, v_access, block_ids, src=None, ok=None, verify=None)
                                             blocks[:, src[i]] (blocks[:, i] when src is None) → vLLM's block
                                             block_ids[i], in place, for every i with ok[i] ([n] bool on the
                                             device; None: all): the others' destinations keep their bytes.
                                             verify (expected, got), [n, 2, L, 2] int64 on the device: each
                                             piece's checksum (integrity.py) compared in the decode's own
                                             kernels, got filled with the sums read, only intact pieces
                                             written (needs verifies_in_kernel)
    verifies_in_kernel(codec, blocks, k_access, v_access) -> bool   decode_blocks can take verify for
                                             these blocks
k_access / v_access: one BlockAccess per layer (kv_views.py), in the pools' layer order.
On CUDA, where both sides are TurboQuant and vLLM's cache is a strided view (GPU backends), encode_into and
decode_blocks launch one kernel for every layer at once (per side for the decode) that reads vLLM's blocks
in place and writes the pool in place (tq_encode_layers), or reads the source in place and writes vLLM's
blocks in place (tq_dequantize_layers): no gathered copy, no temporary, and the ok flags are read by the
kernel (the host never waits for them). Layers whose views differ in strides or dtype take one launch per
layer. Elsewhere, and for lossless (raw) sides, through the codec itself (exactly
codec.decode(codec.encode(x))) with a copy in between.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch

from tiercache.codecs import KVCodec, RawCodec
from tiercache.kernels import (
    PagedLayers,
    tq_dequantize_blocks,
    tq_dequantize_layers,
    tq_encode_blocks,
    tq_encode_layers,
    tq_encode_store,
)
from tiercache.kernels.dequantize import verifiable
from tiercache.layout import BlockLayout
from tiercache.worker.pools import SECTIONS, KVBlocks

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
    if _fused(codec, k_views, v_views):
        _encode_in_place(codec, k_views, v_views, idx, out, torch.arange(n, device=device))
        return out
    fused_sides = _use_kernels(device) and not _raw(codec)
    slots = torch.arange(n * bs, device=device)
    for layer, (k_view, v_view) in enumerate(zip(k_views, v_views, strict=True)):
        k = k_view.read(idx)  # [n, BS, H, D]
        v = v_view.read(idx)
        if fused_sides:
            tq_encode_store(
                k.reshape(n * bs, h, -1), v.reshape(n * bs, h, -1), slots, *_layer(out, layer),
                codec.keys, codec.values,
            )  # fmt: skip
            continue
        for x, side, packed, norms in ((k, codec.keys, out.k_packed, out.k_norms),
                                       (v, codec.values, out.v_packed, out.v_norms)):  # fmt: skip
            p, g = side.encode(x)
            packed[layer].copy_(p)
            norms[layer].copy_(g)
    return out


def encode_into(
    codec: KVCodec,
    k_views: Sequence[BlockAccess],
    v_views: Sequence[BlockAccess],
    block_ids: Sequence[int] | torch.Tensor,
    layout: BlockLayout,
    pool: KVBlocks,
    slots: torch.Tensor,
) -> None:
    device = k_views[0].device
    if not _fused(codec, k_views, v_views):
        blocks = encode_blocks(codec, k_views, v_views, block_ids, layout)
        for name in SECTIONS:
            getattr(pool, name).index_copy_(1, slots, getattr(blocks, name))
        return
    idx = torch.as_tensor(block_ids, dtype=torch.long, device=device)
    _encode_in_place(codec, k_views, v_views, idx, pool, slots)


def decode_blocks(
    codec: KVCodec,
    blocks: KVBlocks,
    k_views: Sequence[BlockAccess],
    v_views: Sequence[BlockAccess],
    block_ids: Sequence[int] | torch.Tensor,
    src: torch.Tensor | None = None,
    ok: torch.Tensor | None = None,
    verify: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    device = k_views[0].device
    idx = torch.as_tensor(block_ids, dtype=torch.long, device=device)
    n = idx.numel()
    blocks = blocks.to(device)
    src = torch.arange(n, device=device) if src is None else src.to(device)
    if verify is not None and not verifies_in_kernel(codec, blocks, k_views, v_views):
        raise ValueError("decode_blocks: these blocks cannot be verified in the decode (verifies_in_kernel)")
    sides = ((k_views, codec.keys, blocks.k_packed, blocks.k_norms),
             (v_views, codec.values, blocks.v_packed, blocks.v_norms))  # fmt: skip
    for s, (views, side, packed, norms) in enumerate(sides):
        layers = _paged_layers(views) if _use_kernels(device) and not isinstance(side, RawCodec) else None
        if layers is not None:  # every layer in one launch, straight into vLLM's blocks
            pieces = None if verify is None else (verify[0][:, s], verify[1][:, s])  # [n, L, 2] each
            tq_dequantize_layers(packed, norms, src, side, layers, idx, ok=ok, verify=pieces)
            continue
        keep = slice(None) if ok is None else ok.to(device)
        if ok is not None and not bool(ok.any()):  # every block refused (a host sync: not the kernels' path)
            continue
        for layer, view in enumerate(views):
            if isinstance(side, RawCodec) or not _use_kernels(device):
                x = side.decode(packed[layer][src[keep]], norms[layer][src[keep]], view.dtype)
                view.write(idx[keep], x)
            elif view.view is not None:  # straight into vLLM's blocks
                tq_dequantize_blocks(
                    packed[layer], norms[layer], src[keep], side, view.view, out_blocks=idx[keep]
                )
            else:
                x = torch.empty((n, *view.shape), dtype=view.dtype, device=device)[keep]
                tq_dequantize_blocks(packed[layer], norms[layer], src[keep], side, x)
                view.write(idx[keep], x)


def verifies_in_kernel(
    codec: KVCodec, blocks: KVBlocks, k_views: Sequence[BlockAccess], v_views: Sequence[BlockAccess]
) -> bool:
    """CUDA, TurboQuant on both sides, each side's layers one PagedLayers, every piece of blocks contiguous
    (the pools' and the DRAM staging's are): decode_blocks verifies while it decodes."""
    return (
        _use_kernels(k_views[0].device)
        and not _raw(codec)
        and blocks.k_packed.device == k_views[0].device
        and _paged_layers(k_views) is not None
        and _paged_layers(v_views) is not None
        and verifiable(blocks.k_packed, blocks.k_norms)
        and verifiable(blocks.v_packed, blocks.v_norms)
    )


def _encode_in_place(
    codec: KVCodec,
    k_views: Sequence[BlockAccess],
    v_views: Sequence[BlockAccess],
    idx: torch.Tensor,
    target: KVBlocks,
    slots: torch.Tensor,
) -> None:
    """vLLM's blocks idx[i] → target[:, slots[i]], the cache read in place: one tq_encode_layers for the
    whole model, or one tq_encode_blocks per layer where the layers' views differ."""
    keys, values = _paged_layers(k_views), _paged_layers(v_views)
    if keys is not None and values is not None:
        sections = (target.k_packed, target.k_norms, target.v_packed, target.v_norms)
        tq_encode_layers(keys, values, idx, slots, *sections, codec.keys, codec.values)
        return
    for layer, (k_view, v_view) in enumerate(zip(k_views, v_views, strict=True)):
        k_packed, k_norms, v_packed, v_norms = _layer(target, layer)
        tq_encode_blocks(
            k_view.view,
            v_view.view,
            idx,
            slots,
            k_packed,
            k_norms,
            v_packed,
            v_norms,
            codec.keys,
            codec.values,
        )


_TABLES: weakref.WeakKeyDictionary[BlockAccess, tuple[tuple[int, ...], PagedLayers | None]] = (
    weakref.WeakKeyDictionary()
)  # keyed by a side's first view: an entry lives as long as the worker's views


def _paged_layers(views: Sequence[BlockAccess]) -> PagedLayers | None:
    """One side's layers as a PagedLayers (built once per set of views, which a worker keeps for its life);
    None where a layer has no strided view or the views differ in strides or dtype."""
    ids = tuple(id(v) for v in views)
    hit = _TABLES.get(views[0])
    if hit is not None and hit[0] == ids:
        return hit[1]
    try:
        table = PagedLayers([v.view for v in views]) if all(v.view is not None for v in views) else None
    except ValueError:
        table = None
    _TABLES[views[0]] = (ids, table)
    return table


def _use_kernels(device: torch.device) -> bool:
    """The Triton kernels on CUDA; elsewhere the codec (the kernels' tests force them on under
    TRITON_INTERPRET=1)."""
    return device.type == "cuda"


def _fused(codec: KVCodec, k_views: Sequence[BlockAccess], v_views: Sequence[BlockAccess]) -> bool:
    """Whether the encode can read vLLM's blocks in place: kernels, TurboQuant both sides, strided views."""
    return (
        _use_kernels(k_views[0].device)
        and not _raw(codec)
        and all(view.view is not None for view in (*k_views, *v_views))
    )


def _raw(codec: KVCodec) -> bool:
    return isinstance(codec.keys, RawCodec) or isinstance(codec.values, RawCodec)


def _layer(blocks: KVBlocks, layer: int) -> tuple[torch.Tensor, ...]:
    """One layer's (k_packed, k_norms, v_packed, v_norms): the kernels' argument order."""
    return blocks.k_packed[layer], blocks.k_norms[layer], blocks.v_packed[layer], blocks.v_norms[layer]
