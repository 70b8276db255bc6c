"""Worker-side tier pools: VRAM tier in the kernels' 5-D format, pinned DRAM tier, same bytes per block.

Provides:
    KVBlocks                   four tensors of n blocks: k_packed, v_packed [L, n, BS, H, P] uint8,
                               k_norms, v_norms [L, n, BS, H] float32 (the pools' read/write unit);
                               .select(positions) takes some of them
    VramPool(layout, num_blocks, device)   contiguous 5-D tensors on the device (CPU allowed)
    DramPool(layout, num_blocks, pin=None, chunk_bytes=…)   one block-major host buffer
        .buffer [NB, stride] uint8; 5-D views .k_packed … over it; pinned (cudaHostRegister, in chunks of
        < 512 GiB) when CUDA is present, plain memory otherwise
    block_views(rows, layout) -> KVBlocks   the sections of [n, stride] block-major rows, as views
    available_host_bytes()

Formats (one rank's KV-head shard; tensor-parallel ranks hold their own shards at the same slots):
    VRAM:  k_packed, v_packed : [L, NB, BS, H, P] uint8      k_norms, v_norms : [L, NB, BS, H] float32
    DRAM:  buffer [NB, stride] uint8, block b = buffer[b]: k_packed [L, BS, H, Pk] ‖ v_packed ‖ k_norms ‖
           v_norms (offsets from BlockLayout.sections()). The 5-D views index exactly like the VRAM tensors.
A DRAM block is one contiguous byte range, so a run of consecutive DRAM slots is one DMA.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

import torch

from tiercache.errors import PoolAllocationError
from tiercache.layout import BlockLayout
from tiercache.units import format_bytes

logger = logging.getLogger(__name__)
SECTIONS = ("k_packed", "v_packed", "k_norms", "v_norms")
MAX_REGISTRATION = 256 * 2**30  # single cudaHostRegister calls of ≥ 512 GiB fail; stay well below
_DTYPES = {"uint8": torch.uint8, "float32": torch.float32}


@dataclass
class KVBlocks:
    k_packed: torch.Tensor  # [L, n, BS, H, Pk] uint8
    v_packed: torch.Tensor  # [L, n, BS, H, Pv] uint8
    k_norms: torch.Tensor  # [L, n, BS, H] float32
    v_norms: torch.Tensor  # [L, n, BS, H] float32

    def tensors(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in SECTIONS}

    def to(self, device) -> KVBlocks:
        return KVBlocks(*(t.to(device) for t in self.tensors().values()))

    def select(self, positions: list[int]) -> KVBlocks:
        """The blocks at these positions, in this order (a copy)."""
        idx = torch.as_tensor(positions, dtype=torch.int64, device=self.k_packed.device)
        return KVBlocks(*(t.index_select(1, idx) for t in self.tensors().values()))

    def equal(self, other: KVBlocks) -> bool:
        return all(
            torch.equal(a.cpu(), b.cpu())
            for a, b in zip(self.tensors().values(), other.tensors().values(), strict=True)
        )


class _Pool:
    layout: BlockLayout
    num_blocks: int
    k_packed: torch.Tensor
    v_packed: torch.Tensor
    k_norms: torch.Tensor
    v_norms: torch.Tensor

    def views(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in SECTIONS}

    def sections(self) -> KVBlocks:
        """The pool's own [L, NB, …] tensors (views: writing them writes the pool)."""
        return KVBlocks(*self.views().values())

    def slot_index(self, slots) -> torch.Tensor:
        """[n] int64 on the pool's device; IndexError for a slot outside [0, num_blocks)."""
        return _index(slots, self.k_packed.device, self.num_blocks)

    def read(self, slots) -> KVBlocks:
        """Copy of the given blocks, [L, n, …] per section, on the pool's device."""
        idx = self.slot_index(slots)
        return KVBlocks(*(t.index_select(1, idx) for t in self.views().values()))

    def write(self, slots, blocks: KVBlocks) -> None:
        """Write n blocks ([L, n, …] per section, same device) into the given slots."""
        idx = self.slot_index(slots)
        for name, dst in self.views().items():
            src = getattr(blocks, name)
            if src.shape[0] != dst.shape[0] or src.shape[2:] != dst.shape[2:] or src.dtype != dst.dtype:
                raise ValueError(
                    f"write: {name} must be {dst.dtype} [{dst.shape[0]}, n, "
                    f"{', '.join(map(str, dst.shape[2:]))}], got {src.dtype} {list(src.shape)}"
                )
            dst.index_copy_(1, idx, src)


class VramPool(_Pool):
    """The VRAM tier: contiguous tensors in the kernels' format, directly attendable by the fused kernel."""

    def __init__(self, layout: BlockLayout, num_blocks: int, device: torch.device | str = "cuda") -> None:
        self.layout = layout
        self.num_blocks = num_blocks
        self.device = torch.device(device)
        L, BS, H = layout.num_layers, layout.block_size, layout.num_kv_heads
        asked = num_blocks * layout.block_bytes
        try:
            self.k_packed = torch.zeros(
                L, num_blocks, BS, H, layout.k_packed_dim, dtype=torch.uint8, device=device
            )
            self.v_packed = torch.zeros(
                L, num_blocks, BS, H, layout.v_packed_dim, dtype=torch.uint8, device=device
            )
            self.k_norms = torch.zeros(L, num_blocks, BS, H, dtype=torch.float32, device=device)
            self.v_norms = torch.zeros(L, num_blocks, BS, H, dtype=torch.float32, device=device)
        except (RuntimeError, MemoryError) as exc:  # torch.OutOfMemoryError is a RuntimeError
            have = (
                torch.cuda.mem_get_info(self.device)[0]
                if self.device.type == "cuda"
                else available_host_bytes()
            )
            raise PoolAllocationError(
                f"VRAM tier: could not allocate {format_bytes(asked)} ({asked:,} bytes) on {self.device}; "
                f"{format_bytes(have or 0)} available ({exc.__class__.__name__}); lower tiers.vram"
            ) from None
        logger.info(
            "tiercache: VRAM tier: %s on %s (per rank), %d blocks of %d B",
            format_bytes(asked), self.device, num_blocks, layout.block_bytes,
        )  # fmt: skip

    @property
    def nbytes(self) -> int:
        return self.num_blocks * self.layout.block_bytes


class DramPool(_Pool):
    """The DRAM tier: one block-major host buffer, pinned in chunks when CUDA is present."""

    def __init__(
        self,
        layout: BlockLayout,
        num_blocks: int,
        pin: bool | None = None,
        chunk_bytes: int = MAX_REGISTRATION,
    ) -> None:
        self.layout = layout
        self.num_blocks = num_blocks
        self.stride = layout.dram_stride
        self.pinned = torch.cuda.is_available() if pin is None else pin
        asked = num_blocks * self.stride
        have = available_host_bytes()
        if have is not None and asked > have:
            raise PoolAllocationError(
                f"DRAM tier: {format_bytes(asked)} ({asked:,} bytes) asked but only {format_bytes(have)} "
                f"({have:,} bytes) of host memory is available; lower tiers.dram"
            )
        try:
            self.buffer = torch.empty(num_blocks, self.stride, dtype=torch.uint8)  # [NB, stride]
        except (RuntimeError, MemoryError) as exc:
            raise PoolAllocationError(
                f"DRAM tier: could not allocate {format_bytes(asked)} ({asked:,} bytes); "
                f"{format_bytes(have or 0)} available ({exc}); lower tiers.dram"
            ) from None
        self.chunk_blocks = max(1, min(num_blocks, chunk_bytes // self.stride)) if num_blocks else 1
        self._registered: list[int] = []
        if self.pinned and num_blocks:
            self._register(asked, have)
        self._make_views()
        logger.info(
            "tiercache: DRAM tier: %s %s (per rank), %d blocks of %d B (stride %d), %d registration chunk(s)",
            format_bytes(asked), "pinned" if self.pinned else "plain memory", num_blocks,
            layout.block_bytes, self.stride, len(self._registered),
        )  # fmt: skip

    @property
    def nbytes(self) -> int:
        return self.num_blocks * self.stride

    def chunk_end(self, slot: int) -> int:
        """First slot of the next registration chunk: a DMA run must not cross it."""
        return (slot // self.chunk_blocks + 1) * self.chunk_blocks

    def close(self) -> None:
        """Unregister the pinned chunks (also done at garbage collection)."""
        if self._registered:
            cudart = torch.cuda.cudart()
            for ptr in self._registered:
                cudart.cudaHostUnregister(ptr)
            self._registered = []

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def _make_views(self) -> None:
        for name, view in block_views(self.buffer, self.layout).tensors().items():
            setattr(self, name, view)

    def _register(self, asked: int, have: int | None) -> None:
        cudart = torch.cuda.cudart()
        base = self.buffer.data_ptr()
        step = self.chunk_blocks * self.stride
        for offset in range(0, asked, step):
            size = min(step, asked - offset)
            err = cudart.cudaHostRegister(base + offset, size, 0)
            code = int(getattr(err, "value", err))
            if code != 0:
                self.close()
                raise PoolAllocationError(
                    f"DRAM tier: pinning {format_bytes(asked)} ({asked:,} bytes) failed at chunk offset "
                    f"{offset:,} (cudaHostRegister error {code}); {format_bytes(have or 0)} of host memory "
                    f"available; lower tiers.dram or raise the locked-memory limit (ulimit -l)"
                )
            self._registered.append(base + offset)


def block_views(rows: torch.Tensor, layout: BlockLayout) -> KVBlocks:
    """rows: [n, stride] uint8, block-major (the DRAM format; any row stride ≥ dram_stride). The blocks'
    sections as views ([L, n, …] like the VRAM tier), no copy."""
    n = rows.shape[0]
    parts = []
    for _, offset, shape, dtype in layout.sections():
        size = _numel(shape) * (4 if dtype == "float32" else 1)
        raw = rows[:, offset : offset + size]  # [n, bytes], row stride = rows.stride(0)
        typed = raw.view(_DTYPES[dtype]) if dtype != "uint8" else raw
        parts.append(typed.view(n, *shape).transpose(0, 1))
    return KVBlocks(*parts)


def available_host_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (what can be allocated without swapping), else None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _index(slots, device: torch.device, limit: int) -> torch.Tensor:
    idx = slots if isinstance(slots, torch.Tensor) else torch.as_tensor(list(slots), dtype=torch.int64)
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= limit):
        raise IndexError(f"slots must be in [0, {limit}), got min {int(idx.min())} max {int(idx.max())}")
    return idx.to(device=device, dtype=torch.int64, non_blocking=True)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
