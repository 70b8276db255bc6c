"""Shared pieces of the decode launchers: split planning, the query rotation, the split-K merge and the
workspace capacity check. Launch choices arrive as a DecodeLaunchConfig (launch_config.py)."""

from __future__ import annotations

import functools
import math

import torch

from ._backend import HAVE_TRITON, interpreting, next_pow2, num_sms, pdl_supported
from .launch_config import DecodeLaunchConfig

if HAVE_TRITON:
    from ._decode_kernel import _rotate_query_kernel
    from ._decode_merge_kernel import _decode_merge_kernel, _decode_merge_rows_kernel

LOG2E = 1.4426950408889634
_ROTATE_COLUMNS = 32  # output columns per query-rotation program (more programs for small batches)
_ROTATE_ROWS = 16  # query rows per query-rotation program, any sequences and heads (benchmarks/RESULTS.md)
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


def merge(
    workspace, splits: int, rot: torch.Tensor, out: torch.Tensor, config: DecodeLaunchConfig
) -> torch.Tensor:
    """Log-sum-exp merge of the first `splits` partials and the rotation back (rot: Π, or Π[perm, :] for
    field-major partials), config.merge_rows rows a program (each program reads Π once for its rows; None:
    16 at ≥ 4 rows per SM, else 1)."""
    batch, num_q_heads, head_dim = out.shape
    pdl = use_pdl(out.device, config)
    rows = batch * num_q_heads
    block = config.merge_rows
    if block is None:
        block = 16 if rows >= 4 * num_sms(out.device) else 1
    args = (workspace.partial_out, workspace.partial_lse, rot, out, out.stride(0), out.stride(1))
    launch = {"PDL": pdl, "num_warps": 4, **({"launch_pdl": True} if pdl else {})}
    if block == 1:
        preload = config.merge_preload
        preload = rows <= num_sms(out.device) if preload is None else preload
        _decode_merge_kernel[(rows,)](
            *args, num_q_heads, splits, workspace.capacity, D=head_dim, SP=next_pow2(splits),
            SC=min(64, next_pow2(splits)), JC=32, PRELOAD=preload, **launch,
        )  # fmt: skip
    else:  # [block, chunk, D] partials a chunk in registers
        _decode_merge_rows_kernel[(-(-rows // block),)](
            *args, rows, num_q_heads, splits, workspace.capacity, D=head_dim, BM=block,
            SC=min(64 // block, next_pow2(splits)), JC=32, **launch,
        )  # fmt: skip
    return out


def check_capacity(workspace, partials: int) -> None:
    if workspace.capacity < partials:
        raise ValueError(
            f"workspace holds {workspace.capacity} partials per head, this call needs {partials}: allocate "
            "it with DecodeWorkspace.allocate(query, block_tables, block_size, num_kv_heads, config=config), "
            "with the call's launch configuration"
        )


def use_pdl(device: torch.device, config: DecodeLaunchConfig) -> bool:
    return config.pdl and pdl_supported(device)
