"""Bit packing of quantization indices: one little-endian bitstream per vector.

Provides:
    pack_indices(idx, bits) -> uint8 [..., n * bits // 8]
    unpack_indices(packed, bits, head_dim) -> int64 [..., head_dim]
    group_shape(bits) -> (indices_per_group, bytes_per_group)

Index j of a vector occupies bits j·b … j·b+b−1 of its bitstream, byte 0 holding bits 0–7. So 4-bit puts two
indices in a byte (low nibble first), 2-bit four, 1-bit eight, 8-bit one, and 3-bit eight indices in three
bytes. Indices are processed in groups of 8/gcd(b, 8) that fill exactly b/gcd(b, 8) bytes (at most 56 bits),
so each group is assembled in one int64 without crossing group boundaries.
"""

from __future__ import annotations

import math

import torch

VALID_BITS = tuple(range(1, 9))


def group_shape(bits: int) -> tuple[int, int]:
    """(indices per group, bytes per group) for a bit width: e.g. 3 → (8, 3), 4 → (2, 1), 6 → (4, 3)."""
    _check_bits(bits)
    g = math.gcd(bits, 8)
    return 8 // g, bits // g


def pack_indices(idx: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack integer indices in [0, 2**bits) along the last dimension into uint8 bitstreams."""
    per_group, bytes_per_group = group_shape(bits)
    if idx.dtype.is_floating_point or idx.dtype == torch.bool or idx.dtype.is_complex:
        raise ValueError(f"pack_indices needs an integer tensor, got {idx.dtype}")
    n = idx.shape[-1]
    if n % per_group:
        raise ValueError(
            f"pack_indices: the last dimension ({n}) must be a multiple of {per_group} for {bits}-bit indices"
        )
    lead = idx.shape[:-1]
    if bytes_per_group == 1:
        # 1, 2, 4, 8 bits: whole indices per byte, assembled in uint8 with one OR per index position.
        groups = idx.to(torch.uint8).reshape(*lead, n // per_group, per_group)
        out = groups[..., 0].clone()
        for k in range(1, per_group):
            out |= groups[..., k] << (k * bits)
        return out
    groups = idx.to(torch.int64).reshape(*lead, n // per_group, per_group)
    shifts = torch.arange(per_group, device=idx.device, dtype=torch.int64) * bits
    words = (groups << shifts).sum(dim=-1, keepdim=True)  # disjoint bit ranges: sum == bitwise or
    byte_shifts = torch.arange(bytes_per_group, device=idx.device, dtype=torch.int64) * 8
    out = (words >> byte_shifts) & 0xFF
    return out.reshape(*lead, n // per_group * bytes_per_group).to(torch.uint8)


def unpack_indices(packed: torch.Tensor, bits: int, head_dim: int) -> torch.Tensor:
    """Inverse of pack_indices: uint8 [..., head_dim * bits // 8] → int64 [..., head_dim]."""
    per_group, bytes_per_group = group_shape(bits)
    if packed.dtype != torch.uint8:
        raise ValueError(f"unpack_indices needs a uint8 tensor, got {packed.dtype}")
    if head_dim % per_group:
        raise ValueError(
            f"unpack_indices: head_dim ({head_dim}) must be a multiple of {per_group} at {bits} bits"
        )
    expected = head_dim * bits // 8
    if packed.shape[-1] != expected:
        raise ValueError(
            f"unpack_indices: last dimension is {packed.shape[-1]} bytes, expected {expected} "
            f"for head_dim={head_dim} at {bits} bits"
        )
    lead = packed.shape[:-1]
    if bytes_per_group == 1:
        shifts = torch.arange(0, 8, bits, device=packed.device, dtype=torch.uint8)
        return ((packed.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)).reshape(*lead, head_dim).to(torch.int64)
    groups = packed.to(torch.int64).reshape(*lead, head_dim // per_group, bytes_per_group)
    byte_shifts = torch.arange(bytes_per_group, device=packed.device, dtype=torch.int64) * 8
    words = (groups << byte_shifts).sum(dim=-1, keepdim=True)
    shifts = torch.arange(per_group, device=packed.device, dtype=torch.int64) * bits
    return ((words >> shifts) & ((1 << bits) - 1)).reshape(*lead, head_dim)


def _check_bits(bits: int) -> None:
    if not isinstance(bits, int) or isinstance(bits, bool) or bits not in VALID_BITS:
        raise ValueError(f"bits must be an integer in 1..8, got {bits!r}")
