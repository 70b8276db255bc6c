"""Primary mode's page: the bytes of one block of one layer in vLLM's own KV cache, holding TurboQuant tokens.

Provides:
    PageFormat(block_size, num_kv_heads, k_packed_dim, v_packed_dim)
        .token_head_bytes     Pk + Pv + 8: what one token of one KV head costs (136 for K4V4 at d128,
                              200 for K8V4; vLLM's state_content_bytes)
        .page_bytes           block_size × num_kv_heads × token_head_bytes
        .sections()           [(name, byte offset in the page, bytes)]
        .views(pages) -> PageViews   the kernels' four tensors over a [num_blocks, ≥ page_bytes] uint8 cache
                              (a longer row, where vLLM's page is larger than the codec needs, ends in
                              padding)
        from_spec(spec, num_kv_heads, head_dim, block_size)
    PageViews(k_packed, k_norms, v_packed, v_norms)   [NB, BS, H, Pk] uint8, [NB, BS, H] f32, …
    as_pages(kv_cache, page_bytes) -> [NB, bytes] uint8   one layer of vLLM's cache as rows of page bytes

A page is section-major, like a tier block of one layer (tiercache.layout):
    k_packed [BS, H, Pk] uint8 ‖ v_packed [BS, H, Pv] uint8 ‖ k_norms [BS, H] f32 ‖ v_norms [BS, H] f32
so each section is one dense run per block (the decode kernel reads a block's key bytes as one run), and a
page is a plain byte copy between vLLM's cache and the tiers. vLLM sees only its size: it never reads inside.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tiercache.codecs import NORM_BYTES, KVCodecSpec


@dataclass(frozen=True)
class PageViews:
    k_packed: torch.Tensor  # [NB, BS, H, Pk] uint8
    k_norms: torch.Tensor  # [NB, BS, H] float32
    v_packed: torch.Tensor  # [NB, BS, H, Pv] uint8
    v_norms: torch.Tensor  # [NB, BS, H] float32


@dataclass(frozen=True)
class PageFormat:
    block_size: int
    num_kv_heads: int
    k_packed_dim: int
    v_packed_dim: int

    def __post_init__(self) -> None:
        for name in ("block_size", "num_kv_heads", "k_packed_dim", "v_packed_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"PageFormat.{name} must be a positive integer, got {value!r}")
        if (self.block_size * self.num_kv_heads * (self.k_packed_dim + self.v_packed_dim)) % NORM_BYTES:
            raise ValueError(
                f"PageFormat: the packed sections ({self.block_size}×{self.num_kv_heads}×"
                f"({self.k_packed_dim}+{self.v_packed_dim}) bytes) must end on a 4-byte boundary (norms)"
            )

    @classmethod
    def from_spec(cls, spec: KVCodecSpec, num_kv_heads: int, head_dim: int, block_size: int) -> PageFormat:
        if spec.key_bits is None or spec.value_bits is None:
            raise ValueError(
                f"primary mode needs TurboQuant keys and values; codec {spec.name!r} has a lossless side. "
                "Use a preset such as k8v4 or tq4 (lossless tiers work in offload mode)"
            )
        pk, pv = spec.packed_dims(head_dim)
        return cls(block_size, num_kv_heads, pk, pv)

    @property
    def token_head_bytes(self) -> int:
        return self.k_packed_dim + self.v_packed_dim + 2 * NORM_BYTES

    @property
    def page_bytes(self) -> int:
        return self.block_size * self.num_kv_heads * self.token_head_bytes

    def sections(self) -> list[tuple[str, int, int]]:
        """(name, byte offset in the page, bytes) of k_packed, v_packed, k_norms, v_norms."""
        cells = self.block_size * self.num_kv_heads
        sizes = (cells * self.k_packed_dim, cells * self.v_packed_dim, cells * NORM_BYTES, cells * NORM_BYTES)
        out, offset = [], 0
        for name, size in zip(("k_packed", "v_packed", "k_norms", "v_norms"), sizes, strict=True):
            out.append((name, offset, size))
            offset += size
        return out

    def views(self, pages: torch.Tensor) -> PageViews:
        """The kernels' tensors over pages [NB, ≥ page_bytes] uint8 (rows strided, each row contiguous)."""
        if pages.dtype != torch.uint8 or pages.ndim != 2 or pages.shape[1] < self.page_bytes:
            got = f"{pages.dtype} {tuple(pages.shape)}"
            raise ValueError(f"pages must be uint8 [num_blocks, ≥ {self.page_bytes}], got {got}")
        if pages.stride(1) != 1 or pages.stride(0) % NORM_BYTES:
            raise ValueError(
                f"each page must be one contiguous, 4-byte-aligned run; strides {pages.stride()}"
            )
        nb, bs, h = pages.shape[0], self.block_size, self.num_kv_heads
        part = {name: pages[:, offset : offset + size] for name, offset, size in self.sections()}
        return PageViews(
            part["k_packed"].view(nb, bs, h, self.k_packed_dim),
            part["k_norms"].view(torch.float32).view(nb, bs, h),
            part["v_packed"].view(nb, bs, h, self.v_packed_dim),
            part["v_norms"].view(torch.float32).view(nb, bs, h),
        )


def as_pages(kv_cache: torch.Tensor, page_bytes: int) -> torch.Tensor:
    """One layer of vLLM's cache, [NB, H, BS, C] of any dtype and any stride order within a block, as pages
    [NB, bytes] uint8: each block must be one dense run of at least page_bytes bytes (vLLM 0.26's
    dtype-sized pages may be larger)."""
    cache = kv_cache if kv_cache.dtype == torch.uint8 else kv_cache.view(torch.uint8)
    inner = sorted(zip(cache.stride()[1:], cache.shape[1:], strict=True))
    dense = all(stride == math.prod(size for _, size in inner[:i]) for i, (stride, _) in enumerate(inner))
    row = math.prod(cache.shape[1:])
    if not dense or row < page_bytes:
        raise ValueError(
            f"tiercache primary mode: a block of the KV cache must be one dense page of ≥ {page_bytes} "
            f"bytes; got shape {tuple(cache.shape)} strides {cache.stride()}"
        )
    return cache.as_strided((cache.shape[0], row), (cache.stride(0), 1))
