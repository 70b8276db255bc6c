"""Read and write whole blocks of vLLM's per-layer KV caches as [n, block_size, num_kv_heads, head_dim],
for the layout of the running attention backend (derived, never assumed).

Provides:
    BlockAccess               one side (K or V) of one layer: read(block_ids) -> [n, BS, H, D], write(ids, x);
                              num_blocks, shape ([BS, H, D]), dtype, device
    kv_access(kv_cache, backend_name, block_size, num_kv_heads, head_dim, cpu_isa=None) -> (K, V)
    cpu_block_map(dtype, block_size, num_kv_heads, head_dim, isa) -> (k_map, v_map)

Layouts (vLLM 0.32):
    CPU_ATTN      [NB, H, BS, 2·D] tensor whose bytes per block are laid out by the ISA's cache-update kernel
                  (e.g. "vec": per head, keys as [D, BS] then values as [BS, D]). The map is measured at
                  start-up by running vLLM's own cpu_attn_reshape_and_cache on a scratch block.
    FLASH_ATTN, TRITON_ATTN   [NB, H, BS, 2·D] logical (HND or NHD strides): K‖V per token on the last dim
    5-D caches (other versions): [2, NB, BS, H, D] or [NB, 2, BS, H, D], split on the size-2 dim
Anything else is refused at start-up with the shape.
"""

from __future__ import annotations

import torch

KV_LAST_DIM_BACKENDS = ("FLASH_ATTN", "TRITON_ATTN")
_DIGIT = 200  # exact integers in bf16/fp16 go past 200: the probe writes an index in base-200 digits


class BlockAccess:
    """A strided view [NB, BS, H, D] of the cache, or a flat cache [NB, E] with an element map [BS, H, D]."""

    def __init__(
        self, view: torch.Tensor | None = None, flat: torch.Tensor | None = None, index=None
    ) -> None:
        self.view, self.flat, self.index = view, flat, index
        self.shape = tuple(view.shape[1:]) if view is not None else tuple(index.shape)
        source = view if view is not None else flat
        self.num_blocks = source.shape[0]
        self.device, self.dtype = source.device, source.dtype

    def read(self, ids: torch.Tensor) -> torch.Tensor:
        if self.view is not None:
            return self.view.index_select(0, ids)
        return self.flat.index_select(0, ids)[:, self.index]

    def write(self, ids: torch.Tensor, x: torch.Tensor) -> None:
        if self.view is not None:
            self.view[ids] = x.to(self.dtype)
        else:
            self.flat[ids[:, None], self.index.reshape(1, -1)] = x.reshape(len(ids), -1).to(self.dtype)


def kv_access(
    kv_cache: torch.Tensor,
    backend_name: str,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    cpu_isa: str | None = None,
) -> tuple[BlockAccess, BlockAccess]:
    shape = tuple(kv_cache.shape)
    bs, h, d = block_size, num_kv_heads, head_dim
    if kv_cache.dim() == 4 and shape[1:] == (h, bs, 2 * d):
        if backend_name == "CPU_ATTN" and cpu_isa is not None and kv_cache.is_contiguous():
            k_map, v_map = cpu_block_map(kv_cache.dtype, bs, h, d, cpu_isa)
            flat = kv_cache.view(shape[0], -1)
            return BlockAccess(flat=flat, index=k_map), BlockAccess(flat=flat, index=v_map)
        if backend_name in KV_LAST_DIM_BACKENDS:
            per_token = kv_cache.transpose(1, 2)  # [NB, BS, H, 2·D]
            return BlockAccess(per_token[..., :d]), BlockAccess(per_token[..., d:])
    if kv_cache.dim() == 5:
        for kv_dim in (0, 1):
            rest = shape[:kv_dim] + shape[kv_dim + 1 :]
            if shape[kv_dim] == 2 and rest[1:] == (bs, h, d):
                return BlockAccess(kv_cache.select(kv_dim, 0)), BlockAccess(kv_cache.select(kv_dim, 1))
    raise ValueError(
        f"tiercache: unsupported KV cache layout for backend {backend_name!r}: shape {shape} "
        f"(block_size {bs}, kv heads {h}, head_dim {d}); supported: CPU_ATTN (contiguous, ISA known), "
        f"{', '.join(KV_LAST_DIM_BACKENDS)} [NB, H, BS, 2·D], and 5-D [2, NB, BS, H, D] / [NB, 2, BS, H, D]"
    )


def cpu_block_map(
    dtype: torch.dtype, block_size: int, num_kv_heads: int, head_dim: int, isa: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Where vLLM's CPU cache-update op puts each key and value element of a block: two [BS, H, D] long
    tensors of offsets into the block's flat [H·BS·2·D] elements. Measured with the op itself on a scratch
    one-block cache; raises ValueError unless K and V each land on distinct cells that cover the block."""
    from vllm import _custom_ops as ops

    bs, h, d = block_size, num_kv_heads, head_dim
    n = bs * h * d
    ids = torch.arange(n, dtype=torch.long)

    def scatter(key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        cache = torch.zeros(1, h, 2 * bs, d, dtype=dtype)
        slots = torch.arange(bs, dtype=torch.long)
        ops.cpu_attn_reshape_and_cache(
            key.view(bs, h, d).to(dtype), value.view(bs, h, d).to(dtype), cache[:, :, :bs], cache[:, :, bs:],
            slots, isa,
        )  # fmt: skip
        return cache.reshape(-1).to(torch.float32).round().long()

    side = scatter(torch.ones(n), torch.full((n,), 2.0))  # 1 = a key cell, 2 = a value cell
    index = torch.zeros_like(side)
    scale, rest = 1, n
    while rest > 0:  # decode the element index of every cell digit by digit
        digit = (ids // scale) % _DIGIT + 1
        index += (scatter(digit.float(), digit.float()) - 1) * scale
        scale, rest = scale * _DIGIT, rest // _DIGIT
    maps = []
    for marker in (1, 2):
        cells = (side == marker).nonzero().squeeze(1)
        found = torch.full((n,), -1, dtype=torch.long)
        found[index[cells].clamp(0, n - 1)] = cells
        if cells.numel() != n or (found < 0).any() or not torch.equal(index[found], ids):
            raise ValueError(
                f"tiercache: could not map vLLM's CPU KV cache layout ({dtype}, isa {isa}, block {bs}, "
                f"{h} heads, head_dim {d}): the cache-update op does not place each element once"
            )
        maps.append(found.view(bs, h, d))
    return maps[0], maps[1]
