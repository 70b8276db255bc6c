"""Public launcher: dequantize listed TurboQuant blocks into a float cache (the connector's load path).

Provides:
    tq_dequantize_blocks(packed, norms, block_ids, codec, out, *, out_blocks=None, config=None) -> out
        out_blocks None: out [N, BS, H, D] receives the listed blocks in order; out_blocks [N]: out is a
        paged cache [NB, BS, H, D] (any strides, e.g. one side of one layer of vLLM's cache) and block i
        goes to out[out_blocks[i]]
    tq_dequantize_layers(packed, norms, block_ids, codec, out, out_blocks, *, ok=None, config=None)
        the same for L layers in one launch: packed [L, NB, BS, H, P], norms [L, NB, BS, H], out a
        PagedLayers (paged_layers.py: every layer's paged cache); ok [N] bool: only blocks i with ok[i] are
        written (the others' destinations keep their bytes) — the connector's load path: no temporary, no
        second scatter, one launch per side for the whole model, and blocks refused by their checksums
        skipped without the host waiting for the verdict
config: a DequantizeLaunchConfig (launch_config.py), None for the defaults.

Triton on CUDA (and under TRITON_INTERPRET=1); the PyTorch reference elsewhere. A float32 `out`
is computed with split-TF32 (tf32x3) products (≤ 1e-6 relative to the codec); a 16-bit `out` with
float16 codebook and rotation operands and float32 accumulation (error well under the output's rounding).
"""

from __future__ import annotations

import torch

from ._backend import HAVE_TRITON, num_sms, use_triton
from ._checks import (
    check_cache,
    check_codec,
    check_float,
    check_index,
    check_layered_cache,
    check_same_device,
    describe,
    triton_layout_ok,
)
from ._tables import kernel_tables
from .codec import TurboQuantCodec
from .launch_config import DequantizeLaunchConfig, resolve_config
from .paged_layers import PagedLayers
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
    _launch(packed.unsqueeze(0), norms.unsqueeze(0), block_ids, out_blocks, None, codec, out, None, config)
    return out


def tq_dequantize_layers(
    packed: torch.Tensor,  # [L, NB, BS, H, P] uint8
    norms: torch.Tensor,  # [L, NB, BS, H] f32
    block_ids: torch.Tensor,  # [N] int
    codec: TurboQuantCodec,
    out: PagedLayers,  # L × [NB', BS, H, D] float16/bfloat16/float32
    out_blocks: torch.Tensor,  # [N] int
    *,
    ok: torch.Tensor | None = None,  # [N] bool
    config: DequantizeLaunchConfig | None = None,
) -> None:
    """For every layer l and every i with ok[i] (every i when ok is None): layer l of out, block
    out_blocks[i] := decode(packed[l, block_ids[i]], norms[l, block_ids[i]]). Listed destinations must be
    distinct (two writes to one block race)."""
    config = resolve_config(config, DequantizeLaunchConfig)
    if not isinstance(out, PagedLayers):
        raise ValueError(f"out must be a PagedLayers (kernels/paged_layers.py), got {type(out).__name__}")
    head_dim = out.shape[-1]
    check_codec("codec", codec, head_dim)
    check_layered_cache("", packed, norms, codec, out.num_layers)
    check_index("block_ids", block_ids, 1)
    check_index("out_blocks", out_blocks, 1)
    if out_blocks.shape != block_ids.shape:
        raise ValueError(f"out_blocks has {len(out_blocks)} entries for {len(block_ids)} block_ids")
    if ok is not None and (
        not isinstance(ok, torch.Tensor) or ok.dtype != torch.bool or ok.shape != block_ids.shape
    ):
        raise ValueError(
            f"ok must be a bool tensor [{len(block_ids)}] (one flag per listed block), got {describe(ok)}"
        )
    if tuple(out.shape[1:]) != (*packed.shape[2:4], head_dim):
        raise ValueError(
            f"out's layers must be paged caches [NB, {packed.shape[2]}, {packed.shape[3]}, {head_dim}] "
            f"(BS, H, D of packed), got {out.shape}"
        )
    extra = {} if ok is None else {"ok": ok}
    check_same_device(
        packed=packed, norms=norms, block_ids=block_ids, out=out.base, out_blocks=out_blocks, **extra
    )
    if block_ids.shape[0] == 0:
        return
    if not (use_triton(packed) and triton_layout_ok(head_dim)):
        keep = slice(None) if ok is None else ok
        ids, dst = block_ids[keep], out_blocks[keep]
        for layer, cache in enumerate(out.caches):
            dequantize_blocks_reference(packed[layer], norms[layer], ids, codec, cache, dst)
        return
    _launch(packed, norms, block_ids, out_blocks, ok, codec, out.base, out, config)


def _launch(packed, norms, block_ids, out_blocks, ok, codec, out, layers, config) -> None:
    """One launch of _dequantize_kernel; packed [L, NB, BS, H, P]; layers: the PagedLayers whose base is out
    (None: one layer)."""
    t = kernel_tables(codec, packed.device)
    ieee = out.dtype == torch.float32
    codebook, rot = (t.codebook, t.rot_perm) if ieee else (t.codebook_f16, t.rot_perm_f16)
    num_layers, block_size, num_heads = packed.shape[0], packed.shape[2], packed.shape[3]
    layered = layers is not None and layers.offsets is not None
    rows = config.rows
    items = num_layers * block_ids.shape[0] * -(-block_size * num_heads // rows)
    grid = (max(1, min(items, config.programs_per_sm * num_sms(packed.device))),)
    LAST_COMPILED["dequantize"] = _dequantize_kernel[grid](
        packed, *packed.stride(), norms, *norms.stride(),
        block_ids, block_ids if out_blocks is None else out_blocks,
        block_ids if ok is None else ok.view(torch.uint8), block_ids.shape[0], num_heads, num_layers,
        codebook, rot,
        out, layers.offsets if layered else block_ids, *out.stride(),
        BLOCK_SIZE=block_size, D=out.shape[-1], ROWS=rows, IEEE=ieee,
        BITS=t.bits, PG=t.per_group, BPG=t.bytes_per_group, NG=t.num_groups, OUT_IDS=out_blocks is not None,
        LAYERED=layered, ALIGN=layers.align if layered else 1, CHECKED=ok is not None,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
