"""Public launcher: dequantize listed TurboQuant blocks into a float cache (the connector's load path).

Provides:
    tq_dequantize_blocks(packed, norms, block_ids, codec, out, *, out_blocks=None, config=None) -> out
        out_blocks None: out [N, BS, H, D] receives the listed blocks in order; out_blocks [N]: out is a
        paged cache [NB, BS, H, D] (any strides, e.g. one side of one layer of vLLM's cache) and block i
        goes to out[out_blocks[i]] (the connector's load path: no temporary, no second scatter)
config: a DequantizeLaunchConfig (launch_config.py), None for the defaults.

Triton on CUDA (and under TRITON_INTERPRET=1); the PyTorch reference elsewhere. A float32 `out`
is computed with split-TF32 (tf32x3) products (≤ 1e-6 relative to the codec); a 16-bit `out` with
float16 codebook and rotation operands and float32 accumulation (error well under the output's rounding).
"""

from __future__ import annotations

import torch

from ._backend import HAVE_TRITON, num_sms, use_triton
from ._checks import check_cache, check_codec, check_float, check_index, check_same_device, triton_layout_ok
from ._tables import kernel_tables
from .codec import TurboQuantCodec
from .launch_config import DequantizeLaunchConfig, resolve_config
from .reference import dequantize_blocks_reference

LAST_COMPILED: dict = {}  # the last compiled kernel (register and spill report in the benchmark)

if HAVE_TRITON:
    from ._dequantize_kernel import _dequantize_kernel


def tq_dequantize_blocks(
    packed: torch.Tensor,  # [NB, BS, H, P] uint8 (one layer)
    norms: torch.Tensor,  # [NB, BS, H] f32
    block_ids: torch.Tensor,  # [N] int
    codec: TurboQuantCodec,
    out: torch.Tensor,  # [N, BS, H, D] float16/bfloat16/float32 ([NB, BS, H, D] with out_blocks)
    *,
    out_blocks: torch.Tensor | None = None,  # [N] int
    config: DequantizeLaunchConfig | None = None,
) -> torch.Tensor:
    """out[i] (out[out_blocks[i]]) = decode(packed[block_ids[i]], norms[block_ids[i]]) for every i; returns
    out. Listed destinations must be distinct (two writes to one block race)."""
    config = resolve_config(config, DequantizeLaunchConfig)
    check_float("out", out, 4)
    head_dim = out.shape[-1]
    check_codec("codec", codec, head_dim)
    check_cache("", packed, norms, codec)
    check_index("block_ids", block_ids, 1)
    if out_blocks is None:
        expected = (block_ids.shape[0], *packed.shape[1:3], head_dim)
        if tuple(out.shape) != expected:
            raise ValueError(
                f"out must have shape {expected} (len(block_ids), BS, H, D), got {tuple(out.shape)}"
            )
    else:
        check_index("out_blocks", out_blocks, 1)
        if out_blocks.shape != block_ids.shape:
            raise ValueError(f"out_blocks has {len(out_blocks)} entries for {len(block_ids)} block_ids")
        if tuple(out.shape[1:]) != (*packed.shape[1:3], head_dim):
            raise ValueError(
                f"out must be a paged cache [NB, {packed.shape[1]}, {packed.shape[2]}, {head_dim}] (BS, H, D "
                f"of packed), got {tuple(out.shape)}"
            )
    extra = {} if out_blocks is None else {"out_blocks": out_blocks}
    check_same_device(packed=packed, norms=norms, block_ids=block_ids, out=out, **extra)
    if block_ids.shape[0] == 0:
        return out
    if not (use_triton(packed) and triton_layout_ok(head_dim)):
        return dequantize_blocks_reference(packed, norms, block_ids, codec, out, out_blocks)
    t = kernel_tables(codec, packed.device)
    ieee = out.dtype == torch.float32
    codebook, rot = (t.codebook, t.rot_perm) if ieee else (t.codebook_f16, t.rot_perm_f16)
    block_size, num_heads = packed.shape[1], packed.shape[2]
    rows = config.rows
    items = block_ids.shape[0] * -(-block_size * num_heads // rows)
    grid = (max(1, min(items, config.programs_per_sm * num_sms(packed.device))),)
    LAST_COMPILED["dequantize"] = _dequantize_kernel[grid](
        packed, *packed.stride(), norms, *norms.stride(),
        block_ids, block_ids if out_blocks is None else out_blocks, block_ids.shape[0], num_heads,
        codebook, rot,
        out, *out.stride(),
        BLOCK_SIZE=block_size, D=head_dim, ROWS=rows, IEEE=ieee,
        BITS=t.bits, PG=t.per_group, BPG=t.bytes_per_group, NG=t.num_groups, OUT_IDS=out_blocks is not None,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
    return out
