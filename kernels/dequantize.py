"""Public launcher: dequantize listed TurboQuant blocks into a float cache (the connector's load path).

Provides:
    tq_dequantize_blocks(packed, norms, block_ids, codec, out, *, out_blocks=None, config=None) -> out
        out_blocks None: out [N, BS, H, D] receives the listed blocks in order; out_blocks [N]: out is a
        paged cache [NB, BS, H, D] (any strides, e.g. one side of one layer of vLLM's cache) and block i
        goes to out[out_blocks[i]]
    tq_dequantize_layers(packed, norms, block_ids, codec, out, out_blocks, *, ok=None, verify=None,
                         config=None)
        the same for L layers in one launch: packed [L, NB, BS, H, P], norms [L, NB, BS, H], out a
        PagedLayers (paged_layers.py: every layer's paged cache) — the connector's load path: no temporary,
        no second scatter, one launch per side for the whole model. ok [N] bool: only blocks i with ok[i]
        are written (the others' destinations keep their bytes). verify (expected, got), [N, L, 2] int64
        each: each piece (layer l of listed block i: its packed bytes, then its norms — checksum.py's piece
        of one side) is summed first, its sums stored in got[i, l], and only pieces whose sums equal
        expected[i, l] are written: the checksum verified in the same pass that decodes, before any byte
        is written, without the host waiting. Needs pieces laid out contiguously (verifiable()).
    verifiable(packed, norms) -> bool       tq_dequantize_layers can verify these pieces (each (layer,
                                            block) piece contiguous and 4-byte aligned)
config: a DequantizeLaunchConfig (launch_config.py), None for the defaults.

Triton on CUDA (and under TRITON_INTERPRET=1); the PyTorch reference elsewhere. A float32 `out`
is computed with split-TF32 (tf32x3) products (≤ 1e-6 relative to the codec); a 16-bit `out` with
float16 codebook and rotation operands and float32 accumulation (error well under the output's rounding).
"""

from __future__ import annotations

import torch

from ._backend import HAVE_TRITON, next_pow2, num_sms, use_triton
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
from .reference import dequantize_blocks_reference, piece_checksums_reference

CHECK_TILE = 4096  # at most this many words a VERIFY program loads per step (a whole K8 d128 piece: one step)
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
    verify: tuple[torch.Tensor, torch.Tensor] | None = None,  # (expected, got) [N, L, 2] int64
    config: DequantizeLaunchConfig | None = None,
) -> None:
    """For every layer l and every i with ok[i] (every i when ok is None; with verify, every (i, l) whose
    piece's sums equal expected[i, l]): layer l of out, block out_blocks[i] := decode(packed[l,
    block_ids[i]], norms[l, block_ids[i]]). Listed destinations must be distinct (two writes to one block
    race)."""
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
    if verify is not None:
        _check_verify(verify, ok, packed, norms, block_ids.shape[0])
        extra = {"expected": verify[0], "got": verify[1]}
    check_same_device(
        packed=packed, norms=norms, block_ids=block_ids, out=out.base, out_blocks=out_blocks, **extra
    )
    if block_ids.shape[0] == 0:
        return
    if not (use_triton(packed) and triton_layout_ok(head_dim)):
        _layers_reference(packed, norms, block_ids, codec, out, out_blocks, ok, verify)
        return
    _launch(packed, norms, block_ids, out_blocks, ok, codec, out.base, out, config, verify)


def verifiable(packed: torch.Tensor, norms: torch.Tensor) -> bool:
    """Whether each (layer, block) piece of packed [L, NB, BS, H, P] uint8 and norms [L, NB, BS, H] f32 is
    contiguous and starts on a 4-byte boundary, with P a multiple of 4: what verify reads as words."""
    if packed.dtype != torch.uint8 or norms.dtype != torch.float32 or packed.ndim != 5 or norms.ndim != 4:
        return False
    h, p = packed.shape[3:]
    return (
        p % 4 == 0
        and (packed.stride(2), packed.stride(3), packed.stride(4)) == (h * p, p, 1)
        and (norms.stride(2), norms.stride(3)) == (h, 1)
        and packed.stride(0) % 4 == 0
        and packed.stride(1) % 4 == 0
        and packed.data_ptr() % 4 == 0
    )


def _check_verify(verify, ok, packed, norms, n: int) -> None:
    layers = packed.shape[0]
    if ok is not None:
        raise ValueError("give ok or verify, not both: verify decides which pieces are written")
    if not (isinstance(verify, tuple) and len(verify) == 2):
        raise ValueError(f"verify must be (expected, got), got {describe(verify)}")
    for name, t in zip(("expected", "got"), verify, strict=True):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int64 or tuple(t.shape) != (n, layers, 2):
            raise ValueError(
                f"verify's {name} must be an int64 tensor [{n}, {layers}, 2] (sums per listed block and "
                f"layer), got {describe(t)}"
            )
    if verify[0].stride(2) != 1 or verify[1].stride(2) != 1:
        raise ValueError("verify's tensors need a contiguous last dimension: (S1, S2) pairs")
    if not verifiable(packed, norms):
        raise ValueError(
            "verify needs each (layer, block) piece contiguous and 4-byte aligned (verifiable(packed, "
            "norms)); compare the checksums in a separate pass (kernels.piece_checksums) and pass ok instead"
        )


def _layers_reference(packed, norms, block_ids, codec, out, out_blocks, ok, verify) -> None:
    """The CPU path of tq_dequantize_layers: the checksums of verify through the reference, then the
    intact pieces (or the ok blocks) decoded layer by layer."""
    if verify is not None:
        expected, got = verify
        got.copy_(piece_checksums_reference([[packed, norms]], block_ids)[:, 0])
        intact = (got == expected).all(2)  # [N, L]
    for layer, cache in enumerate(out.caches):
        keep = intact[:, layer] if verify is not None else slice(None) if ok is None else ok
        ids, dst = block_ids[keep], out_blocks[keep]
        dequantize_blocks_reference(packed[layer], norms[layer], ids, codec, cache, dst)


def _launch(packed, norms, block_ids, out_blocks, ok, codec, out, layers, config, verify=None) -> None:
    """One launch of _dequantize_kernel; packed [L, NB, BS, H, P]; layers: the PagedLayers whose base is out
    (None: one layer); verify: (expected, got) [N, L, 2] int64."""
    t = kernel_tables(codec, packed.device)
    ieee = out.dtype == torch.float32
    codebook, rot = (t.codebook, t.rot_perm) if ieee else (t.codebook_f16, t.rot_perm_f16)
    num_layers, block_size, num_heads = packed.shape[0], packed.shape[2], packed.shape[3]
    layered = layers is not None and layers.offsets is not None
    rows = config.rows
    items = num_layers * block_ids.shape[0]
    if verify is None:
        items *= -(-block_size * num_heads // rows)
    per_sm = config.programs_per_sm if verify is None else config.verify_programs_per_sm
    grid = (max(1, min(items, per_sm * num_sms(packed.device))),)
    expected, got = verify if verify is not None else (block_ids, block_ids)  # any tensor when unused
    pwords = block_size * num_heads * packed.shape[4] // 4  # 32-bit words of one piece's packed bytes
    sums_strides = (0, 0, 0, 0)
    if verify is not None:
        sums_strides = (expected.stride(0), expected.stride(1), got.stride(0), got.stride(1))
    LAST_COMPILED["dequantize"] = _dequantize_kernel[grid](
        packed, *packed.stride(), norms, *norms.stride(),
        block_ids, block_ids if out_blocks is None else out_blocks,
        block_ids if ok is None else ok.view(torch.uint8), block_ids.shape[0], num_heads, num_layers,
        expected, sums_strides[0], sums_strides[1], got, sums_strides[2], sums_strides[3],
        pwords,
        codebook, rot,
        out, layers.offsets if layered else block_ids, *out.stride(),
        BLOCK_SIZE=block_size, D=out.shape[-1], ROWS=rows, IEEE=ieee,
        BITS=t.bits, PG=t.per_group, BPG=t.bytes_per_group, NG=t.num_groups, OUT_IDS=out_blocks is not None,
        LAYERED=layered, ALIGN=layers.align if layered else 1, CHECKED=ok is not None,
        VERIFY=verify is not None, PTILE=min(CHECK_TILE, next_pow2(pwords)),
        NTILE=min(CHECK_TILE, next_pow2(block_size * num_heads)),
        num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
