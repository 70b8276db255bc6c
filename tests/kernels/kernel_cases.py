"""Shared builders for the kernel tests: codecs, random TQ caches, block tables, poison values."""

from __future__ import annotations

import functools

import torch

from tiercache.kernels import TurboQuantCodec
from tiercache.kernels.packing import unpack_indices

# Every bit width 1–8 appears for K and for V; K4V4 and K8V4 (the Gluon kernel's), K5V3 and K6V4 (presets)
# first.
BIT_PAIRS = [(4, 4), (8, 4), (5, 3), (6, 4), (2, 3), (3, 2), (4, 8), (7, 1), (1, 7), (3, 6), (6, 5)]
POISON_BYTE = 0xA5
POISON_FLOAT = float("nan")


@functools.cache
def codec(head_dim: int, bits: int, seed: int = 0) -> TurboQuantCodec:
    return TurboQuantCodec(head_dim, bits, seed=seed)


def random_cache(
    num_blocks: int, block_size: int, num_heads: int, c: TurboQuantCodec, gen: torch.Generator, device="cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random packed bytes and norms, with packed viewed out of a wider buffer (non-trivial strides)."""
    wide = torch.randint(0, 256, (num_blocks, block_size, num_heads, c.packed_dim + 3), generator=gen)
    packed = wide.to(torch.uint8)[..., : c.packed_dim]
    norms = torch.rand(num_blocks, block_size, num_heads, generator=gen) * 4 + 0.5
    return packed.to(device), norms.to(device)


def random_block_tables(
    context_lens: list[int], block_size: int, num_blocks: int, gen: torch.Generator
) -> torch.Tensor:
    """Distinct random physical blocks per sequence, padded with block 0: [B, max_blocks] int32."""
    need = [-(-n // block_size) for n in context_lens]
    width = max(need)
    perm = torch.randperm(num_blocks, generator=gen)
    assert sum(need) <= num_blocks
    table = torch.zeros(len(context_lens), width, dtype=torch.int32)
    used = 0
    for b, n in enumerate(need):
        table[b, :n] = perm[used : used + n].to(torch.int32)
        used += n
    return table


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double().cpu(), ref.double().cpu()
    assert not torch.isnan(out).any(), "output has unwritten (NaN-poisoned) elements"
    return float((out - ref).norm() / ref.norm())


def near_boundary(x: torch.Tensor, c: TurboQuantCodec) -> torch.Tensor:
    """Coordinates whose rotated value lies within 1e-6 of a codebook boundary (float64, on x's device):
    the only ones whose encoded index may differ between implementations."""
    x64 = x.double()
    u = x64 / x64.norm(dim=-1, keepdim=True).clamp_min(1e-300)
    y = u @ c.rotation.to(x.device, torch.float64).t()
    return (y.unsqueeze(-1) - c.boundaries.to(x.device, torch.float64)).abs().min(-1).values < 1e-6


def scales_of(x: torch.Tensor, packed: torch.Tensor, c: TurboQuantCodec) -> torch.Tensor:
    """The unbiased scale γ/⟨u, ŷ⟩ (float64) of rows x [N, D] whose indices are `packed` [N, P], whichever
    encoder chose them (an index may differ between encoders within rounding of a boundary, and the scale
    follows it): the value a kernel's stored norm must be within float32 rounding of."""
    x64 = x.double()
    gamma = x64.norm(dim=-1)
    u = x64 / gamma.clamp_min(1e-300).unsqueeze(-1)
    y = u @ c.rotation.to(x.device, torch.float64).t()
    centroids = c.codebook.to(x.device, torch.float64)[unpack_indices(packed, c.bits, c.head_dim)]
    scale = gamma / (y * centroids).sum(-1)
    gamma32 = x.float().norm(dim=-1).double()  # where float32's norm under- or overflows: scale 0 or inf
    return torch.where((gamma32 == 0) | gamma32.isinf(), gamma32, scale)
