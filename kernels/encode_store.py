"""Public launchers: fused TurboQuant encode + store of keys and values into the VRAM tier's format.

Provides:
    tq_encode_store(key, value, slot_mapping, k_packed, k_norms, v_packed, v_norms, k_codec, v_codec, *,
                    config=None)        new tokens [T, H, D] → their slots (the cache-update path)
    tq_encode_blocks(key_cache, value_cache, src_blocks, dst_blocks, k_packed, k_norms, v_packed, v_norms,
                     k_codec, v_codec, *, config=None)
                                        whole blocks of a float paged cache [NB, BS, H, D] (any strides:
                                        one side of one layer of vLLM's cache) → other blocks of the packed
                                        cache, read in place
    tq_encode_layers(key_layers, value_layers, src_blocks, dst_blocks, k_packed, k_norms, v_packed,
                     v_norms, k_codec, v_codec, *, config=None)
                                        the same for L layers in one launch: key_layers / value_layers are
                                        PagedLayers (paged_layers.py: every layer's float cache), the
                                        packed caches [L, NB', BS, H, P] / [L, NB', BS, H] (the connector's
                                        save path: no gathered copy, one launch for the whole model)
config: an EncodeLaunchConfig (launch_config.py), None for the defaults.

Triton on CUDA (and under TRITON_INTERPRET=1); the PyTorch reference elsewhere.
"""

from __future__ import annotations

import torch

from ._backend import HAVE_TRITON, interpreting, num_sms, use_triton
from ._checks import (
    check_cache,
    check_codec,
    check_float,
    check_index,
    check_layered_cache,
    check_same_device,
    describe,
    triton_layout_ok,
)
from ._tables import kernel_tables
from .codec import TurboQuantCodec
from .launch_config import EncodeLaunchConfig, resolve_config
from .paged_layers import PagedLayers
from .reference import encode_store_reference

LAST_COMPILED: dict = {}  # the last compiled kernel (register and spill report in the benchmark)

if HAVE_TRITON:
    from ._encode_store_kernel import _encode_store_kernel


def tq_encode_store(
    key: torch.Tensor,  # [T, H, D] float
    value: torch.Tensor,  # [T, H, D] float
    slot_mapping: torch.Tensor,  # [T] int; slot = block * block_size + offset, −1 = skip
    k_packed: torch.Tensor,  # [NB, BS, H, Pk] uint8 (one layer)
    k_norms: torch.Tensor,  # [NB, BS, H] f32
    v_packed: torch.Tensor,  # [NB, BS, H, Pv] uint8
    v_norms: torch.Tensor,  # [NB, BS, H] f32
    k_codec: TurboQuantCodec,
    v_codec: TurboQuantCodec,
    *,
    config: EncodeLaunchConfig | None = None,
) -> None:
    """Encode key/value with their codecs and write each token into its slot, in place."""
    config = resolve_config(config, EncodeLaunchConfig)
    check_float("key", key, 3)
    check_float("value", value, 3)
    if key.shape != value.shape or key.dtype != value.dtype:
        raise ValueError(
            f"key and value must match: {key.dtype} {tuple(key.shape)} vs {value.dtype} {tuple(value.shape)}"
        )
    num_tokens, _, head_dim = key.shape
    check_index("slot_mapping", slot_mapping, 1)
    if slot_mapping.shape[0] != num_tokens:
        raise ValueError(f"slot_mapping has {slot_mapping.shape[0]} entries for {num_tokens} tokens")
    caches = (k_packed, k_norms, v_packed, v_norms)
    _check_caches(key, value, caches, k_codec, v_codec, slot_mapping=slot_mapping)
    if num_tokens == 0:
        return
    if not (use_triton(key) and triton_layout_ok(head_dim)):
        encode_store_reference(key, value, slot_mapping, *caches, k_codec, v_codec)
        return
    strides = ((0, *key.stride()), (0, *value.stride()))
    _launch(
        key, value, strides, slot_mapping, slot_mapping, num_tokens, tuple(t.unsqueeze(0) for t in caches),
        k_codec, v_codec, config, False,
    )  # fmt: skip


def tq_encode_blocks(
    key_cache: torch.Tensor,  # [NB, BS, H, D] float, any strides
    value_cache: torch.Tensor,  # [NB, BS, H, D] float, any strides
    src_blocks: torch.Tensor,  # [n] int: blocks of key_cache / value_cache …
    dst_blocks: torch.Tensor,  # [n] int: … encoded into these blocks of the packed cache
    k_packed: torch.Tensor,  # [NB', BS, H, Pk] uint8 (one layer)
    k_norms: torch.Tensor,  # [NB', BS, H] f32
    v_packed: torch.Tensor,  # [NB', BS, H, Pv] uint8
    v_norms: torch.Tensor,  # [NB', BS, H] f32
    k_codec: TurboQuantCodec,
    v_codec: TurboQuantCodec,
    *,
    config: EncodeLaunchConfig | None = None,
) -> None:
    """Block dst_blocks[i] of the packed cache := encode(block src_blocks[i] of the float caches), in place;
    the same bytes as tq_encode_store of those blocks' tokens into those slots."""
    check_float("key_cache", key_cache, 4)
    check_float("value_cache", value_cache, 4)
    caches = (k_packed, k_norms, v_packed, v_norms)
    check_cache("k", k_packed, k_norms, k_codec)
    check_cache("v", v_packed, v_norms, v_codec)
    tq_encode_layers(
        PagedLayers([key_cache]), PagedLayers([value_cache]), src_blocks, dst_blocks,
        *(t.unsqueeze(0) for t in caches), k_codec, v_codec, config=config,
    )  # fmt: skip


def tq_encode_layers(
    key_layers: PagedLayers,  # L × [NB, BS, H, D] float
    value_layers: PagedLayers,  # L × [NB, BS, H, D] float
    src_blocks: torch.Tensor,  # [n] int: blocks of every layer's float caches …
    dst_blocks: torch.Tensor,  # [n] int: … encoded into these blocks of the packed caches
    k_packed: torch.Tensor,  # [L, NB', BS, H, Pk] uint8
    k_norms: torch.Tensor,  # [L, NB', BS, H] f32
    v_packed: torch.Tensor,  # [L, NB', BS, H, Pv] uint8
    v_norms: torch.Tensor,  # [L, NB', BS, H] f32
    k_codec: TurboQuantCodec,
    v_codec: TurboQuantCodec,
    *,
    config: EncodeLaunchConfig | None = None,
) -> None:
    """For every layer l: block dst_blocks[i] of packed layer l := encode(block src_blocks[i] of float layer
    l), in place, in one launch; the same bytes as tq_encode_blocks layer by layer."""
    config = resolve_config(config, EncodeLaunchConfig)
    for name, layers in (("key_layers", key_layers), ("value_layers", value_layers)):
        if not isinstance(layers, PagedLayers):
            raise ValueError(f"{name} must be a PagedLayers (paged_layers.py), not {describe(layers)}")
    k_kind = (key_layers.num_layers, key_layers.dtype, key_layers.shape)
    v_kind = (value_layers.num_layers, value_layers.dtype, value_layers.shape)
    if k_kind != v_kind:
        raise ValueError("key and value layers must match: {} × {} {} vs {} × {} {}".format(*k_kind, *v_kind))
    num_layers = key_layers.num_layers
    _, block_size, num_heads, head_dim = key_layers.shape
    check_index("src_blocks", src_blocks, 1)
    check_index("dst_blocks", dst_blocks, 1)
    if src_blocks.shape != dst_blocks.shape:
        raise ValueError(
            f"src_blocks and dst_blocks differ in length: {len(src_blocks)} vs {len(dst_blocks)}"
        )
    caches = (k_packed, k_norms, v_packed, v_norms)
    check_codec("k_codec", k_codec, head_dim)
    check_codec("v_codec", v_codec, head_dim)
    check_layered_cache("k", k_packed, k_norms, k_codec, num_layers, num_heads)
    check_layered_cache("v", v_packed, v_norms, v_codec, num_layers, num_heads)
    if k_packed.shape[:3] != v_packed.shape[:3]:
        raise ValueError(f"k and v caches differ in blocks: {k_packed.shape[:3]} vs {v_packed.shape[:3]}")
    if k_packed.shape[2] != block_size:
        raise ValueError(
            f"the packed cache's block size is {k_packed.shape[2]}, the float cache's {block_size}"
        )
    check_same_device(
        key=key_layers.base, value=value_layers.base, k_packed=k_packed, v_packed=v_packed, src=src_blocks,
        dst=dst_blocks,
    )  # fmt: skip
    n = src_blocks.shape[0]
    if n == 0:
        return
    if not (use_triton(key_layers.base) and triton_layout_ok(head_dim)):
        src = src_blocks.to(torch.int64)
        slots = dst_blocks.to(torch.int64)[:, None] * block_size + torch.arange(block_size, device=src.device)
        for layer in range(num_layers):
            key = key_layers.caches[layer][src].reshape(n * block_size, num_heads, head_dim)
            value = value_layers.caches[layer][src].reshape(n * block_size, num_heads, head_dim)
            encode_store_reference(
                key, value, slots.reshape(-1), *(t[layer] for t in caches), k_codec, v_codec
            )
        return
    strides = (key_layers.base.stride(), value_layers.base.stride())
    _launch(key_layers.base, value_layers.base, strides, src_blocks, dst_blocks, n * block_size, caches,
            k_codec, v_codec, config, True, (key_layers, value_layers))  # fmt: skip


def _check_caches(key, value, caches, k_codec, v_codec, **indices) -> None:
    k_packed, k_norms, v_packed, v_norms = caches
    num_heads, head_dim = key.shape[-2], key.shape[-1]
    check_codec("k_codec", k_codec, head_dim)
    check_codec("v_codec", v_codec, head_dim)
    check_cache("k", k_packed, k_norms, k_codec, num_heads)
    check_cache("v", v_packed, v_norms, v_codec, num_heads)
    if k_packed.shape[:2] != v_packed.shape[:2]:
        raise ValueError(f"k and v caches differ in blocks: {k_packed.shape[:2]} vs {v_packed.shape[:2]}")
    check_same_device(key=key, value=value, k_packed=k_packed, v_packed=v_packed, **indices)


def _launch(
    key, value, strides, src, slots, num_tokens, caches, k_codec, v_codec, config, gather, layers=None
) -> None:
    """One launch of _encode_store_kernel; caches [L, NB, BS, H, P] / [L, NB, BS, H]; strides: (b, t, h, d)
    of key and of value (b unused unless gather); layers: (keys, values) PagedLayers whose bases are key and
    value (None: one layer)."""
    k_packed, k_norms, v_packed, v_norms = caches
    num_layers = 1 if layers is None else layers[0].num_layers
    layered = num_layers > 1
    k_off, v_off = (layers[0].offsets, layers[1].offsets) if layered else (src, src)  # src: any tensor
    k_align, v_align = (layers[0].align, layers[1].align) if layered else (1, 1)
    num_heads, head_dim = key.shape[-2], key.shape[-1]
    kt, vt = kernel_tables(k_codec, key.device), kernel_tables(v_codec, key.device)
    k_rot, v_rot = _rotation_pieces(kt, key.dtype), _rotation_pieces(vt, key.dtype)
    pieces = k_rot.shape[0]
    bt = config.block_tokens
    items = num_layers * -(-num_tokens // bt) * num_heads
    grid = (max(1, min(items, config.programs_per_sm * num_sms(key.device))), 2)
    LAST_COMPILED["encode"] = _encode_store_kernel[grid](
        key, k_off, *strides[0], value, v_off, *strides[1],
        src, slots, num_tokens, num_heads, num_layers,
        k_packed, *k_packed.stride(), k_norms, *k_norms.stride(),
        v_packed, *v_packed.stride(), v_norms, *v_norms.stride(),
        k_rot, kt.grid, kt.grid_scale, kt.grid_origin, kt.grid_last, kt.codebook,
        v_rot, vt.grid, vt.grid_scale, vt.grid_origin, vt.grid_last, vt.codebook,
        BLOCK_SIZE=k_packed.shape[2], D=head_dim, BT=bt, NPIECE=pieces,
        K_BITS=kt.bits, K_PG=kt.per_group, K_BPG=kt.bytes_per_group, K_NG=kt.num_groups,
        V_BITS=vt.bits, V_PG=vt.per_group, V_BPG=vt.bytes_per_group, V_NG=vt.num_groups,
        UPCAST=interpreting(), GATHER=gather, LAYERED=layered, K_ALIGN=k_align, V_ALIGN=v_align,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip


def _rotation_pieces(tables, dtype: torch.dtype) -> torch.Tensor:
    # 16-bit inputs: the f32 rotation split in 16-bit terms of the input's type (three bfloat16, two float16)
    # gives f32-accurate products on the tensor cores; f32 inputs take one IEEE dot.
    if dtype == torch.bfloat16:
        return tables.rot_t_perm_bf16x3
    if dtype == torch.float16:
        return tables.rot_t_perm_f16x2
    return tables.rot_t_perm.unsqueeze(0)
