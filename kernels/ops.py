"""torch.library registration of the three kernels, so torch.compile sees each as one opaque op.

Provides (after import):
    torch.ops.tiercache.tq_encode_store(key, value, slot_mapping, k_packed, k_norms, v_packed, v_norms,
                                        head_dim, k_bits, k_seed, k_rotation, v_bits, v_seed, v_rotation)
    torch.ops.tiercache.tq_dequantize_blocks(packed, norms, block_ids, out, head_dim, bits, seed, rotation)
    torch.ops.tiercache.tq_decode_attention(query, k_packed, k_norms, v_packed, v_norms, block_tables,
                                            context_lens, head_dim, k_bits, k_seed, k_rotation,
                                            v_bits, v_seed, v_rotation, scale) -> Tensor
    codec_args(codec) -> (bits, seed, rotation)      the codec as op arguments
Codecs travel as (head_dim, bits, seed, rotation) and are rebuilt from a cache inside the op.
"""

from __future__ import annotations

import functools

import torch

from .codec import TurboQuantCodec
from .decode_attention import tq_decode_attention
from .dequantize import tq_dequantize_blocks
from .encode_store import tq_encode_store


@functools.cache
def _codec(head_dim: int, bits: int, seed: int, rotation: str) -> TurboQuantCodec:
    return TurboQuantCodec(head_dim, bits, seed, rotation)


def codec_args(codec: TurboQuantCodec) -> tuple[int, int, str]:
    return codec.bits, codec.seed, codec.rotation_kind


_CACHE_ARGS = ("k_packed", "k_norms", "v_packed", "v_norms")


@torch.library.custom_op("tiercache::tq_encode_store", mutates_args=_CACHE_ARGS)
def _encode_store_op(
    key: torch.Tensor,
    value: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_packed: torch.Tensor,
    k_norms: torch.Tensor,
    v_packed: torch.Tensor,
    v_norms: torch.Tensor,
    head_dim: int,
    k_bits: int,
    k_seed: int,
    k_rotation: str,
    v_bits: int,
    v_seed: int,
    v_rotation: str,
) -> None:
    k_codec = _codec(head_dim, k_bits, k_seed, k_rotation)
    v_codec = _codec(head_dim, v_bits, v_seed, v_rotation)
    tq_encode_store(key, value, slot_mapping, k_packed, k_norms, v_packed, v_norms, k_codec, v_codec)


@torch.library.custom_op("tiercache::tq_dequantize_blocks", mutates_args=("out",))
def _dequantize_blocks_op(
    packed: torch.Tensor,
    norms: torch.Tensor,
    block_ids: torch.Tensor,
    out: torch.Tensor,
    head_dim: int,
    bits: int,
    seed: int,
    rotation: str,
) -> None:
    tq_dequantize_blocks(packed, norms, block_ids, _codec(head_dim, bits, seed, rotation), out)


@torch.library.custom_op("tiercache::tq_decode_attention", mutates_args=())
def _decode_attention_op(
    query: torch.Tensor,
    k_packed: torch.Tensor,
    k_norms: torch.Tensor,
    v_packed: torch.Tensor,
    v_norms: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    head_dim: int,
    k_bits: int,
    k_seed: int,
    k_rotation: str,
    v_bits: int,
    v_seed: int,
    v_rotation: str,
    scale: float,
) -> torch.Tensor:
    k_codec = _codec(head_dim, k_bits, k_seed, k_rotation)
    v_codec = _codec(head_dim, v_bits, v_seed, v_rotation)
    return tq_decode_attention(
        query, k_packed, k_norms, v_packed, v_norms, block_tables, context_lens, k_codec, v_codec, scale
    )


@_decode_attention_op.register_fake
def _(query, k_packed, k_norms, v_packed, v_norms, block_tables, context_lens, *args) -> torch.Tensor:
    return torch.empty_like(query)
