"""TMA tensor maps of packed caches, for the Gluon decode kernel's TMA staging: encoded on the host by the
CUDA driver (`cuTensorMapEncodeTiled`, through ctypes) and copied to device memory, where the kernel's
`cp.async.bulk.tensor` reads them by address.

Provides:
    box_map(packed, rows) -> device tensor map    boxes of `rows` tokens of one block and kv head
    flat_rows(packed) -> bool                     whether its map takes the flat form (below)
    map_geometry(packed, rows) -> (dims, strides, box, swizzle)   what box_map encodes

Two forms of a cache [NB, BS, H, P] uint8 (a TMA box's inner size and a tensor's strides are multiples of 16
bytes): native (P a multiple of 16): dims (P, H, BS, NB), a box [rows, P] bytes of one head, coordinates
{0, head, offset in block, block}, 64- and 128-byte rows swizzled; flat (other P, heads dense: head stride
P): dims (H·P, BS, NB, 1) over a token's row of all heads, a box [rows, B] bytes (B: P rounded up to 16)
from x = head·P rounded down to 16 (a box's inner coordinate must be 16-byte aligned: the kernel's read-back
adds the shift, head·P mod 16), coordinates {x, offset, block, 0}, unswizzled: each row the bytes x … x + B
of the token's heads (zeros past the last head: the TMA fills out-of-bounds bytes with zeros)."""

from __future__ import annotations

import ctypes
import functools

import torch

from ._decode_lut_ptx import box_pitch

_MAP_BYTES = 128  # sizeof(CUtensorMap)
_UINT8 = 0  # CU_TENSOR_MAP_DATA_TYPE_UINT8
_SWIZZLE = {64: 2, 128: 3}  # native rows' bytes → CU_TENSOR_MAP_SWIZZLE_64B, _128B; others: _NONE (0)
_L2_PROMOTION_128B = 2
# (address, shape, strides, rows, device) → (pinned map, device map), kept for the process: a captured CUDA
# graph holds the device map's address (256 bytes per cache view; caches are allocated once). The shape and
# strides determine the form.
_CACHE: dict = {}


def box_map(packed: torch.Tensor, rows: int) -> torch.Tensor:
    """The tensor map of `packed` [NB, BS, H, P] uint8 whose boxes are `rows` tokens of one block and kv head
    (map_geometry; native form: P a multiple of 16 up to 256, 16-byte aligned address and strides; flat form:
    heads dense, 16-byte aligned address, token and block strides), as 128 bytes of device memory (copied
    before this returns; under CUDA-graph capture, by a captured copy on the current stream)."""
    key = (packed.data_ptr(), tuple(packed.shape), packed.stride(), rows, packed.device)
    if key in _CACHE:
        return _CACHE[key][1]
    host = torch.empty(_MAP_BYTES, dtype=torch.uint8, pin_memory=True)
    _encode_tiled(host, packed, rows)
    device = torch.empty(_MAP_BYTES, dtype=torch.uint8, device=packed.device)
    device.copy_(host, non_blocking=torch.cuda.is_current_stream_capturing())
    _CACHE[key] = (host, device)  # the pinned copy stays alive for any graph replaying the copy
    return device


def flat_rows(packed: torch.Tensor) -> bool:
    """Whether the tensor map of `packed` [NB, BS, H, P] takes the flat form: P not a multiple of 16."""
    return packed.shape[3] % 16 != 0


def map_geometry(packed: torch.Tensor, rows: int) -> tuple[tuple, tuple, tuple, int]:
    """(dims, byte strides of dims 1 … 3, box, swizzle) of the 4-D map of `packed` [NB, BS, H, P] uint8 with
    boxes of `rows` tokens, dims and box innermost first (the forms: the module docstring)."""
    num_blocks, block_size, heads, row_bytes = packed.shape
    if flat_rows(packed):
        dims = (heads * row_bytes, block_size, num_blocks, 1)
        strides = (packed.stride(1), packed.stride(0), packed.stride(0) * num_blocks)
        return dims, strides, (box_pitch(row_bytes), rows, 1, 1), 0
    dims = (row_bytes, heads, block_size, num_blocks)
    strides = (packed.stride(2), packed.stride(1), packed.stride(0))
    return dims, strides, (row_bytes, 1, rows, 1), _SWIZZLE.get(row_bytes, 0)


def _encode_tiled(out: torch.Tensor, packed: torch.Tensor, rows: int) -> None:
    dims, strides, box, swizzle = map_geometry(packed, rows)
    u64, u32 = ctypes.c_uint64, ctypes.c_uint32
    unit = (u32 * 4)(1, 1, 1, 1)
    result = _driver().cuTensorMapEncodeTiled(
        ctypes.c_void_p(out.data_ptr()), _UINT8, u32(4), ctypes.c_void_p(packed.data_ptr()), (u64 * 4)(*dims),
        (u64 * 3)(*strides), (u32 * 4)(*box), unit, 0, swizzle, _L2_PROMOTION_128B, 0,
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
