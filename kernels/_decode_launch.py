"""Shared pieces of the decode launchers: the launch configuration, split planning, the query rotation,
the split-K merge and the workspace capacity check."""

from __future__ import annotations

import functools
import math

import torch

from ._backend import HAVE_TRITON, interpreting, next_pow2, num_sms, pdl_supported

if HAVE_TRITON:
    from ._decode_kernel import _rotate_query_kernel
    from ._decode_merge_kernel import _decode_merge_kernel

# Launch configuration, one for every shape: the best of `benchmarks/decode_attention.py --sweep` on an H200
# (geometric mean of K4V4 1×32K, 16×32K, 64×8K and K8V4 16×32K; see benchmarks/RESULTS.md).
CONFIG = {
    "layout": "perfield",  # also "reshape" (field-major tiles), "natural" (natural order, byte LUTs);
    # "perfield" (one 2-D dot per field) takes 2/4/8-bit, else "reshape"
    "lut": "prmt",  # perfield, 16-bit operands: 4-bit centroids by register permutes; "gather": byte LUTs
    # for 2-/4-bit ("prmt" falls back to it for 2-bit and under the interpreter); "none": codebook lookups
    "tile": 64,
    "programs_per_sm": 5,  # programs resident per SM (96 registers × 128 threads: 5 fit)
    "min_wave_fill": 1.0,  # split planning: fill at least this fraction of one wave of programs
    "split_overhead_tiles": 2.0,  # split planning: fixed cost of one program, in tile steps
    "num_warps": 4,
    "num_stages": 1,
    "prefetch": False,  # reshape/natural layouts: the next tile's bytes load during this one (perfield:
    # measured 2-8x slower under its register cap, so it has no such path)
    "rotate_in_split": False,  # each split rotates its queries (one launch fewer) vs a separate launch
    "maxnreg": 96,  # perfield: register cap per thread (more programs per SM; None: the compiler's choice)
    "pdl": True,  # programmatic dependent launch of the split and merge kernels (Hopper+, not interpreted)
    "merge_preload": None,  # the merge loads the rotation back whole first: True, False, or None: where it
    # runs at most one program per SM (each reads all of Π; H200, K4V4 graph µs, two runs: 1×4K 18.2-18.4
    # against 19.7-19.9, 1×32K 31.2-31.3 against 33.6-33.9)
    "lut_kernel": True,  # the Gluon kernel (_decode_lut_kernel) where it applies, see decode_lut.lut_mode_of
    "lut_min_work": 1 << 18,  # ... and for B · H · max_blocks · block_size ≥ this (below, its 64 KiB table
    # fill per program costs more than it saves: H200, K4V4 1×4K 26 µs vs 20 µs for the Triton kernel)
    "lut_warps": 8,  # its warps per program (a power of two)
    "lut_tile": 16,  # its tokens per warp and step (16, 32 or 64)
    "lut_maxnreg": 128,  # its register cap per thread (128: 2 programs of 8 warps per SM, no spills)
    "lut_combine_max_steps": 32,  # its warps' partials are combined in the kernel (one per item) where an
    # item walks at most this many tile steps (decode_lut.lut_combines)
    "lut_tma": True,  # its packed words arrive by TMA boxes on sm_90+ (else, and on sm_80, by cp.async)
    "lut_min_wave_fill": 0.9,  # its split planning's `min_wave_fill` (H200, K4V4 16×4K: 57 µs, 62 at 1.0)
    "lut_pdl_max_steps": 8,  # its launch dependent on the query rotation where every program takes one
    # item of at most this many tile steps (0: never, None: always; decode_lut.lut_pdl)
    "lut_programs_per_sm": None,  # its programs per SM; None: as many as fit (decode_lut.lut_programs_per_sm:
    # 2 on an H200, shared memory 64 KiB + warps · tile · 128 or 192 bytes)
}
LOG2E = 1.4426950408889634
_ROTATE_COLUMNS = 32  # output columns per query-rotation program (more programs for small batches)
_ROTATE_ROWS = 16  # query rows per query-rotation program (any sequences and heads; H200, B·Hq = 2048:
# 4.4 µs, 17.6 µs with one program per kv head)
LAST_COMPILED: dict = {}  # the last compiled split kernel (register and spill report in the benchmark)


@functools.lru_cache(maxsize=1024)
def plan_splits(rows: int, tiles: int, capacity: int, min_fill: float, overhead: float) -> int:
    best_cost, best = math.inf, tiles
    for splits in range(1, tiles + 1):
        programs = rows * splits
        if programs < min_fill * capacity and splits < tiles:
            continue
        cost = -(-programs // capacity) * (-(-tiles // splits) + overhead)
        if cost < best_cost:
            best_cost, best = cost, splits
    return best


def rotate_queries(
    q: torch.Tensor, rot: torch.Tensor, q_rot: torch.Tensor, scale: float, split16: bool = False,
    pdl: bool = False,
) -> None:  # fmt: skip
    """q_rot ← q·rot·scale·log2 e. rot: Πᵀ in any coordinate order, f32 [D, D] or (split16) bf16 [3, D, D]"""
    batch, num_q_heads, head_dim = q.shape
    rows = batch * num_q_heads
    _rotate_query_kernel[(-(-rows // _ROTATE_ROWS), head_dim // _ROTATE_COLUMNS)](
        q, q.stride(0), q.stride(1), rot, q_rot, rows, num_q_heads, scale * LOG2E,
        D=head_dim, BM=_ROTATE_ROWS, DC=_ROTATE_COLUMNS, SPLIT16=split16, UPCAST=interpreting(), PDL=pdl,
        num_warps=4,
    )  # fmt: skip


def merge(workspace, splits: int, rot: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Log-sum-exp merge of the first `splits` partials and the rotation back (rot: Π, or Π[perm, :] for
    field-major partials)."""
    batch, num_q_heads, head_dim = out.shape
    pdl = use_pdl(out.device)
    programs = batch * num_q_heads
    preload = CONFIG["merge_preload"]
    preload = programs <= num_sms(out.device) if preload is None else preload
    _decode_merge_kernel[(programs,)](
        workspace.partial_out, workspace.partial_lse, rot, out, out.stride(0), out.stride(1),
        num_q_heads, splits, workspace.capacity, D=head_dim, SP=next_pow2(splits),
        SC=min(64, next_pow2(splits)), JC=32, PDL=pdl, PRELOAD=preload, num_warps=4,
        **({"launch_pdl": True} if pdl else {}),
    )  # fmt: skip
    return out


def check_capacity(workspace, partials: int) -> None:
    if workspace.capacity < partials:
        raise ValueError(
            f"workspace holds {workspace.capacity} partials per head, this call needs {partials}: allocate "
            "it with DecodeWorkspace.allocate(query, block_tables, block_size, num_kv_heads)"
        )


def use_pdl(device: torch.device) -> bool:
    return bool(CONFIG["pdl"]) and pdl_supported(device)
