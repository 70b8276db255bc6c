"""TMA tensor maps of packed caches, for the Gluon decode kernel's TMA staging: encoded on the host by the
CUDA driver (`cuTensorMapEncodeTiled`, through ctypes) and copied to device memory, where the kernel's
`cp.async.bulk.tensor` reads them by address."""

from __future__ import annotations

import ctypes
import functools

import torch

_MAP_BYTES = 128  # sizeof(CUtensorMap)
_UINT8 = 0  # CU_TENSOR_MAP_DATA_TYPE_UINT8
_SWIZZLE = {64: 2, 128: 3}  # row bytes → CU_TENSOR_MAP_SWIZZLE_64B, _128B; other rows: _NONE (0)
_L2_PROMOTION_128B = 2
# (address, shape, strides, rows, device) → (pinned map, device map), kept for the process: a captured CUDA
# graph holds the device map's address (256 bytes per cache view; caches are allocated once)
_CACHE: dict = {}


def box_map(packed: torch.Tensor, rows: int) -> torch.Tensor:
    """The tensor map of `packed` [NB, BS, H, P] uint8 (P a multiple of 16 up to 256, 16-byte aligned address
    and strides) whose boxes are `rows` tokens of one block and kv head, [rows, P] bytes, swizzled by P
    bytes where P is 64 or 128 (else not swizzled); as 128
    bytes of device memory (copied before this returns; under CUDA-graph capture, by a captured copy on the
    current stream)."""
    key = (packed.data_ptr(), tuple(packed.shape), packed.stride(), rows, packed.device)
    if key in _CACHE:
        return _CACHE[key][1]
    host = torch.empty(_MAP_BYTES, dtype=torch.uint8, pin_memory=True)
    _encode_tiled(host, packed, rows)
    device = torch.empty(_MAP_BYTES, dtype=torch.uint8, device=packed.device)
    device.copy_(host, non_blocking=torch.cuda.is_current_stream_capturing())
    _CACHE[key] = (host, device)  # the pinned copy stays alive for any graph replaying the copy
    return device


def _encode_tiled(out: torch.Tensor, packed: torch.Tensor, rows: int) -> None:
    num_blocks, block_size, heads, row_bytes = packed.shape
    u64, u32 = ctypes.c_uint64, ctypes.c_uint32
    dims = (u64 * 4)(row_bytes, heads, block_size, num_blocks)  # innermost first
    strides = (u64 * 3)(packed.stride(2), packed.stride(1), packed.stride(0))  # bytes, of dims 1 … 3
    box = (u32 * 4)(row_bytes, 1, rows, 1)
    unit = (u32 * 4)(1, 1, 1, 1)
    result = _driver().cuTensorMapEncodeTiled(
        ctypes.c_void_p(out.data_ptr()), _UINT8, u32(4), ctypes.c_void_p(packed.data_ptr()), dims, strides,
        box, unit, 0, _SWIZZLE.get(row_bytes, 0), _L2_PROMOTION_128B, 0,
    )  # fmt: skip
    if result != 0:
        raise RuntimeError(
            f"cuTensorMapEncodeTiled failed (CUresult {result}) for a cache of shape {tuple(packed.shape)}, "
            f"strides {packed.stride()}, address {packed.data_ptr():#x}, boxes of {rows} rows"
        )


@functools.cache
def _driver() -> ctypes.CDLL:
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuTensorMapEncodeTiled.restype = ctypes.c_int
    return lib
