"""Argument checks shared by the kernel launchers; each error names what was expected."""

from __future__ import annotations

import torch

from .codec import TurboQuantCodec

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def check_codec(name: str, codec: object, head_dim: int) -> TurboQuantCodec:
    if not isinstance(codec, TurboQuantCodec):
        raise TypeError(f"{name} must be a TurboQuantCodec, got {type(codec).__name__}")
    if codec.head_dim != head_dim:
        raise ValueError(f"{name}.head_dim is {codec.head_dim} but the tensors have head_dim {head_dim}")
    return codec


def check_cache(
    name: str, packed: torch.Tensor, norms: torch.Tensor, codec: TurboQuantCodec, num_heads: int | None = None
) -> None:
    """packed [NB, BS, H, P] uint8 and norms [NB, BS, H] float32 of one layer."""
    if packed.dtype != torch.uint8 or packed.ndim != 4:
        raise ValueError(
            f"{name}_packed must be uint8 [num_blocks, block_size, num_kv_heads, packed_dim], "
            f"got {packed.dtype} {tuple(packed.shape)} (pass one layer: cache[layer])"
        )
    if packed.shape[-1] != codec.packed_dim:
        raise ValueError(
            f"{name}_packed last dimension is {packed.shape[-1]}, expected packed_dim={codec.packed_dim} "
            f"for {codec!r}"
        )
    if norms.dtype != torch.float32 or tuple(norms.shape) != tuple(packed.shape[:3]):
        raise ValueError(
            f"{name}_norms must be float32 {tuple(packed.shape[:3])}, got {norms.dtype} {tuple(norms.shape)}"
        )
    if num_heads is not None and packed.shape[2] != num_heads:
        raise ValueError(f"{name}_packed has {packed.shape[2]} kv heads, expected {num_heads}")
    if norms.device != packed.device:
        raise ValueError(f"{name}_norms is on {norms.device} but {name}_packed on {packed.device}")


def check_layered_cache(
    name: str,
    packed: torch.Tensor,
    norms: torch.Tensor,
    codec: TurboQuantCodec,
    num_layers: int,
    num_heads: int | None = None,
) -> None:
    """packed [L, NB, BS, H, P] uint8 and norms [L, NB, BS, H] float32 of num_layers layers."""
    if not isinstance(packed, torch.Tensor) or packed.ndim != 5 or packed.shape[0] != num_layers:
        raise ValueError(
            f"{name}_packed must be uint8 [{num_layers} layers, num_blocks, block_size, num_kv_heads, "
            f"packed_dim], got {describe(packed)}"
        )
    if not isinstance(norms, torch.Tensor) or norms.ndim != 4:
        raise ValueError(f"{name}_norms must be float32 {tuple(packed.shape[:4])}, got {describe(norms)}")
    if norms.shape[0] != num_layers:
        raise ValueError(f"{name}_norms has {norms.shape[0]} layers, expected {num_layers}")
    check_cache(name, packed[0], norms[0], codec, num_heads)


def describe(x: object) -> str:
    """A tensor's dtype and shape, or another value's type: for error messages."""
    return f"{x.dtype} {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__


def check_float(name: str, x: torch.Tensor, ndim: int) -> None:
    if not isinstance(x, torch.Tensor) or x.dtype not in FLOAT_DTYPES or x.ndim != ndim:
        got = f"{x.dtype} {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name} must be a {ndim}-D float16/bfloat16/float32 tensor, got {got}")


def check_index(name: str, x: torch.Tensor, ndim: int) -> None:
    if not isinstance(x, torch.Tensor) or x.dtype not in (torch.int32, torch.int64) or x.ndim != ndim:
        got = f"{x.dtype} {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name} must be a {ndim}-D int32 or int64 tensor, got {got}")


def check_same_device(**tensors: torch.Tensor) -> None:
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        raise ValueError(f"all tensors must be on one device, got {devices}")


def triton_layout_ok(head_dim: int) -> bool:
    """The Triton kernels need a power-of-two head_dim (64, 128, 256); others use the reference."""
    return head_dim >= 16 and head_dim & (head_dim - 1) == 0
