"""Launch configurations of the kernel launchers: frozen values passed to each call (None: the defaults).

Provides:
    DecodeLaunchConfig        tq_decode_attention, DecodeWorkspace.allocate, plan_num_splits
    EncodeLaunchConfig        tq_encode_store
    DequantizeLaunchConfig    tq_dequantize_blocks
    resolve_config(config, kind) -> kind    `config`, or the defaults for None; TypeError for anything else

A field chooses how a kernel is launched (which kernel, tile shapes, warps, registers, split planning), not
what it computes. A configuration is checked when it is built: a bad value raises ValueError naming the
field, the value and the valid values. Change one with dataclasses.replace(DecodeLaunchConfig(), tile=32).
The decode defaults are the best of benchmarks/decode_attention.py --sweep; benchmarks/encode_store.py --sweep
times the encode and dequantize choices. The figures behind them are in benchmarks/RESULTS.md
("Launch-configuration notes moved from kernels/" and the sessions it cites).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TypeVar

Config = TypeVar("Config")  # one of the three launch-configuration types


@dataclass(frozen=True)
class DecodeLaunchConfig:
    """How tq_decode_attention launches its kernels. The lut_* fields choose the Gluon kernel's launch
    (decode_lut.py); the others the Triton split kernels, their split planning and the merge
    (decode_attention.py, _decode_launch.py)."""

    lut: str = "prmt"
    """perfield kernel's lookups with 16-bit operands: "prmt" (4-bit centroids by register permutes; byte
    LUTs for 2-bit and under the interpreter), "gather" (byte LUTs for 2/4-bit), "none" (codebook lookups)."""
    tile: int = 64
    """Tokens per tile of the Triton split kernel (a power of two ≥ 16)."""
    programs_per_sm: int = 5
    """Triton split programs resident per SM, for split planning (96 registers × 128 threads: 5 fit)."""
    min_wave_fill: float = 1.0
    """Split planning: a plan fills at least this fraction of one wave of programs (unless every tile
    already has its own program)."""
    split_overhead_tiles: float = 2.0
    """Split planning: the fixed cost of one program (prologue, partial write, its share of the merge), in
    tile steps."""
    num_warps: int = 4
    """Warps per Triton split program."""
    num_stages: int = 1
    """Software-pipelining stages of the Triton split kernel."""
    rotate_in_split: bool = False
    """Each split rotates its queries (one launch fewer; 16-bit queries only), instead of a separate
    rotation launch."""
    maxnreg: int | None = 96
    """perfield kernel: register cap per thread (more programs per SM); None: the compiler's choice. Not
    applied to values of 1, 3, 5 or 7 bits (decode_attention._register_cap)."""
    pdl: bool = True
    """Programmatic dependent launch of the split and merge kernels where the device has it (Hopper+, not
    interpreted)."""
    merge_preload: bool | None = None
    """The merge loads the rotation back whole first (at one row a program): True, False, or None: where it
    runs at most one program per SM (each reads all of Π)."""
    merge_rows: int | None = None
    """Rows (sequence, query head) per merge program, 1 or 16, or None: 16 where there are at least 4 rows
    per SM, else 1. Each program reads Π (64 KiB at head_dim 128) once for its rows: at 256 × 1K, 16 rows a
    program take K4V4's decode from 196 to 165 µs on an H200; at 4 × 8K (128 rows, 8 programs) they cost
    1.19× (benchmarks/RESULTS.md)."""
    lut_kernel: bool = True
    """The Gluon kernel (_decode_lut_kernel) where it applies (decode_lut.lut_mode_of)."""
    lut_min_work: int = 1 << 18
    """The Gluon kernel only for B · H · max_blocks · block_size ≥ this (below: the Triton kernels; the Gluon
    kernel fills a 64 KiB table per program)."""
    lut_warps: int = 8
    """Gluon kernel: warps per program, a power of two from 2 to 16 (threads fill whole table rows, a warp's
    output whole 8 KiB chunks)."""
    lut_tile: int = 16
    """Gluon kernel: tokens per warp and step (16, 32 or 64)."""
    lut_maxnreg: int | None = 128
    """Gluon kernel: register cap per thread (128: 2 programs of 8 warps per SM); None: the compiler's."""
    lut_combine_max_steps: int = 32
    """Gluon kernel: its warps' partials are combined in the kernel (one per item) where an item walks at
    most this many tile steps (decode_lut.lut_combines)."""
    lut_tma: bool = True
    """Gluon kernel: packed words arrive by TMA boxes on sm_90+ (else, and on sm_80, by cp.async)."""
    lut_head_dims: tuple[int, ...] = (64, 128)
    """Gluon kernel: the head_dims whose decodes it takes, of those it is built for (decode_lut.lut_serves:
    128 and 64); leave one out to send its decodes to the Triton kernels."""
    lut_min_wave_fill: float = 0.9
    """Gluon kernel: its split planning's min_wave_fill."""
    lut_pdl_max_steps: int | None = 8
    """Gluon kernel: launched dependent on the query rotation where every program takes one item of at most
    this many tile steps (0: never, None: always; decode_lut.lut_pdl)."""
    lut_programs_per_sm: int | None = None
    """Gluon kernel: programs per SM; None: as many as fit (decode_lut.lut_programs_per_sm)."""

    def __post_init__(self) -> None:
        _one_of(self, "lut", ("prmt", "gather", "none"))
        _power_of_two(self, "tile", 16)
        _integer(self, "programs_per_sm", 1)
        _number(self, "min_wave_fill", 0.0, 1.0)
        _number(self, "split_overhead_tiles", 0.0)
        _power_of_two(self, "num_warps", 1, 32)
        _integer(self, "num_stages", 1)
        for flag in ("rotate_in_split", "pdl", "lut_kernel", "lut_tma"):
            _one_of(self, flag, (False, True))
        _integer(self, "maxnreg", 16, 255, optional=True)
        _one_of(self, "merge_preload", (None, False, True))
        _one_of(self, "merge_rows", (None, 1, 16))
        _integer(self, "lut_min_work", 0)
        _power_of_two(self, "lut_warps", 2, 16)
        _one_of(self, "lut_tile", (16, 32, 64))
        _integer(self, "lut_maxnreg", 16, 255, optional=True)
        _integer(self, "lut_combine_max_steps", 0)
        _number(self, "lut_min_wave_fill", 0.0, 1.0)
        _integer(self, "lut_pdl_max_steps", 0, optional=True)
        _integer(self, "lut_programs_per_sm", 1, optional=True)
        dims = self.lut_head_dims
        if not (isinstance(dims, tuple) and dims and all(d in (64, 128) and type(d) is int for d in dims)):
            _fail(self, "lut_head_dims", "a non-empty tuple of head_dims from (64, 128)")


@dataclass(frozen=True)
class EncodeLaunchConfig:
    """How tq_encode_store launches _encode_store_kernel."""

    block_tokens: int = 64
    """Tokens per work item (one token tile of one kv head)."""
    programs_per_sm: int = 2
    """Programs per SM of the persistent grid (each loads its rotation once)."""
    num_warps: int = 4
    """Warps per program."""
    num_stages: int = 1
    """Software-pipelining stages of the item loop."""

    def __post_init__(self) -> None:
        _power_of_two(self, "block_tokens", 16)
        _integer(self, "programs_per_sm", 1)
        _power_of_two(self, "num_warps", 1, 32)
        _integer(self, "num_stages", 1)


@dataclass(frozen=True)
class DequantizeLaunchConfig:
    """How tq_dequantize_blocks launches _dequantize_kernel."""

    rows: int = 64
    """(offset, head) rows per work item."""
    programs_per_sm: int = 8
    """Programs per SM of the persistent grid (each loads the rotation once). H100, 32 layers × 1,024
    blocks, K8 and V4 into bf16: 1.64 ms at 8 and 16, 1.93 ms at 4 (more programs than fit at once
    spread the items)."""
    verify_programs_per_sm: int = 8
    """The same when the load verifies each piece's checksum (an item is a whole piece, summed then
    decoded): 2.09 ms at 8 and 16 in the same run, 2.25 ms at 4."""
    num_warps: int = 4
    """Warps per program."""
    num_stages: int = 3
    """Software-pipelining stages of the item loop."""

    def __post_init__(self) -> None:
        _power_of_two(self, "rows", 16)
        _integer(self, "programs_per_sm", 1)
        _integer(self, "verify_programs_per_sm", 1)
        _power_of_two(self, "num_warps", 1, 32)
        _integer(self, "num_stages", 1)


def resolve_config(config: Config | None, kind: type[Config]) -> Config:
    """`config` itself, or (None) the defaults of `kind`."""
    if config is None:
        return _defaults(kind)
    if not isinstance(config, kind):
        raise TypeError(
            f"config must be {kind.__name__}(...) or None (the defaults), got {type(config).__name__}: "
            f"build one with dataclasses.replace({kind.__name__}(), **changes)"
        )
    return config


@functools.cache
def _defaults(kind: type[Config]) -> Config:
    return kind()


def _fail(config: object, name: str, valid: str) -> None:
    raise ValueError(f"{type(config).__name__}.{name} is {getattr(config, name)!r}: use {valid}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _one_of(config: object, name: str, valid: tuple) -> None:
    value = getattr(config, name)
    if not any(type(value) is type(v) and value == v for v in valid):
        _fail(config, name, "one of " + ", ".join(map(repr, valid)))


def _integer(config: object, name: str, low: int, high: int | None = None, optional: bool = False) -> None:
    value = getattr(config, name)
    if optional and value is None:
        return
    if not (_is_int(value) and low <= value and (high is None or value <= high)):
        bounds = f"≥ {low}" if high is None else f"from {low} to {high}"
        _fail(config, name, f"{'None or ' if optional else ''}an integer {bounds}")


def _power_of_two(config: object, name: str, low: int, high: int | None = None) -> None:
    value = getattr(config, name)
    if not (_is_int(value) and low <= value and (high is None or value <= high) and not value & (value - 1)):
        _fail(config, name, f"a power of two {f'≥ {low}' if high is None else f'from {low} to {high}'}")


def _number(config: object, name: str, low: float, high: float = math.inf) -> None:
    value = getattr(config, name)
    if not (isinstance(value, int | float) and not isinstance(value, bool) and low <= value <= high):
        _fail(config, name, f"a number ≥ {low}" if high == math.inf else f"a number from {low} to {high}")
