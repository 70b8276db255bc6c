"""The Gluon decode kernel's dispatch and launch (see _decode_lut_kernel.py): where it applies, its split
planning, and one call (query rotation, the split kernel, the merge)."""

from __future__ import annotations

import functools
import logging

import torch

from ._backend import HAVE_TRITON, cuda_index, interpreting, num_sms
from ._decode_launch import CONFIG, LAST_COMPILED, check_capacity, merge, plan_splits, rotate_queries, use_pdl
from ._tables import UNIFORM8_ASM, decode_lut_table, kernel_tables
from ._tensor_map import box_map

_LOG = logging.getLogger(__name__)
HAVE_GLUON = False
if HAVE_TRITON:
    try:  # Gluon is experimental: a Triton without it (or with another API) keeps the Triton kernels
        from . import _decode_lut_kernel as _lut

        HAVE_GLUON = True
    except (ImportError, AttributeError):
        pass


def lut_mode_of(query, k_packed, v_packed, k_codec, v_codec, group: int, block_size: int) -> int:
    """The Gluon kernel's key mode (4: 4-bit, 8: 8-bit Lloyd-Max, 9: 8-bit uniform) where it applies, else 0:
    CUDA (sm_80+), 16-bit queries, head_dim 128, 4-bit values, 4/8-bit keys, G ≤ 8, a power-of-two block
    size, and packed caches it can copy in 16-byte (keys) and 8-byte (values) pieces."""
    if not (CONFIG["lut_kernel"] and HAVE_GLUON and query.is_cuda and not interpreting()):
        return 0
    if query.dtype not in (torch.float16, torch.bfloat16) or query.shape[-1] != 128 or group > 8:
        return 0
    if v_codec.bits != 4 or k_codec.bits not in (4, 8) or block_size & (block_size - 1):
        return 0
    if _capability(cuda_index(query.device)) < (8, 0):
        return 0
    if not (_aligned_words(k_packed, 16) and _aligned_words(v_packed, 8)):
        return 0
    if k_codec.bits == 4:
        return 4
    return 9 if kernel_tables(k_codec, query.device).uniform_step is not None else 8


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def _aligned_words(packed: torch.Tensor, align: int) -> bool:
    """Whether the kernel can copy `packed` in `align`-byte pieces of int32 words, with int32 offsets."""
    if packed.stride(-1) != 1 or any(s % align for s in packed.stride()[:-1]) or packed.data_ptr() % align:
        return False
    extent = 1 + sum((n - 1) * s for n, s in zip(packed.shape, packed.stride(), strict=True))
    return extent // 4 < 2**31


_REGISTERS_PER_SM = 65536  # every CUDA architecture the kernel runs on (sm_80+)


def lut_programs_per_sm(device: torch.device, key_mode: int) -> int:
    """Programs of the Gluon kernel resident per SM: CONFIG's `lut_programs_per_sm`, or (None) as many as its
    shared memory (1 KiB reserved per program), registers (`lut_maxnreg`, else 255) and warps allow."""
    if CONFIG["lut_programs_per_sm"] is not None:
        return CONFIG["lut_programs_per_sm"]
    warps, tile = CONFIG["lut_warps"], CONFIG["lut_tile"]
    smem_sm, threads_sm = _sm_limits(cuda_index(device))
    by_smem = smem_sm // (_lut.shared_bytes(warps, tile, key_mode) + 1024)
    regs = -(-(CONFIG["lut_maxnreg"] or 255) * 32 // 256) * 256 * warps  # allocated per warp in units of 256
    return max(1, min(by_smem, _REGISTERS_PER_SM // regs, threads_sm // (32 * warps)))


def _use_tma(k_packed: torch.Tensor, v_packed: torch.Tensor) -> bool:
    """TMA staging: on sm_90+ (and CONFIG's `lut_tma`) where both caches' addresses and strides are 16-byte
    aligned (else cp.async)."""
    tma_device = bool(CONFIG["lut_tma"]) and _capability(cuda_index(k_packed.device)) >= (9, 0)
    return tma_device and _aligned_words(k_packed, 16) and _aligned_words(v_packed, 16)


def _tensor_maps(k_packed: torch.Tensor, v_packed: torch.Tensor, rows: int) -> tuple[int, int] | None:
    """The device addresses of the caches' tensor maps; None (stage by cp.async) where the driver refuses."""
    try:
        return box_map(k_packed, rows).data_ptr(), box_map(v_packed, rows).data_ptr()
    except (OSError, AttributeError, RuntimeError) as err:
        _LOG.warning("decode: no TMA tensor map (%s); staging by cp.async", err)
        return None


@functools.cache
def _sm_limits(index: int) -> tuple[int, int]:
    props = torch.cuda.get_device_properties(index)
    return props.shared_memory_per_multiprocessor, props.max_threads_per_multi_processor


def lut_splits(batch: int, num_kv_heads: int, max_tokens: int, device: torch.device, per_sm: int) -> int:
    step = CONFIG["lut_warps"] * CONFIG["lut_tile"]
    return plan_splits(
        batch * num_kv_heads, -(-max_tokens // step), per_sm * num_sms(device), CONFIG["lut_min_wave_fill"],
        CONFIG["split_overhead_tiles"],
    )  # fmt: skip


def lut_combines(max_tokens: int, splits: int) -> bool:
    """Whether the Gluon kernel combines its warps' partials into one per item (through shared memory, at
    the item's end): where an item walks at most CONFIG's `lut_combine_max_steps` tile steps. The combine
    saves per item the warps' partial writes and the merge's reads of them; it costs ~4 % per step, since
    ptxas then allocates the tile loop's registers differently (H200, K4V4, graph µs: 1×32K, 8 steps: 33
    against 46; 16×4K, 16 steps: 49 against 54; 16×32K, 128 steps: 208 against 202)."""
    return lut_item_steps(max_tokens, splits) <= CONFIG["lut_combine_max_steps"]


def lut_item_steps(max_tokens: int, splits: int) -> int:
    """Tile steps of W·T tokens an item walks: its split's share of the cache's token capacity."""
    return -(-max_tokens // (splits * CONFIG["lut_warps"] * CONFIG["lut_tile"]))


def lut_pdl(items: int, programs: int, steps: int) -> bool:
    """Whether the Gluon kernel is launched dependent on the query rotation (PDL: it fills its table and
    stages its first tile while the rotation runs), for `items` of `steps` tile steps on `programs`: where
    every program takes one item of at most CONFIG's `lut_pdl_max_steps` steps (0: never, None: always).
    The overlap saves a few µs once per program; the PDL launch costs more than that where items are long
    (H200, K4V4 graph µs, PDL against none in one sweep: 1×32K, 8 steps: 31.2 against 33.1; 16×32K, 128
    steps: 207.0 against 199.3)."""
    limit = CONFIG["lut_pdl_max_steps"]
    return limit is None or (items <= programs and steps <= limit)


def lut_partials(batch: int, num_kv_heads: int, max_tokens: int, device: torch.device) -> int:
    """Partials per query head of the Gluon kernel (per split: one, or one per warp), the most any key mode
    needs; 0 where it cannot run."""
    if not (HAVE_GLUON and device.type == "cuda"):
        return 0
    per_sm = {lut_programs_per_sm(device, mode) for mode in (4, 8, 9)}
    splits = (lut_splits(batch, num_kv_heads, max_tokens, device, n) for n in per_sm)
    return max(n if lut_combines(max_tokens, n) else n * CONFIG["lut_warps"] for n in splits)


def launch_lut(
    query, k_packed, k_norms, v_packed, v_norms, block_tables, context_lens, k_codec, v_codec, scale,
    workspace, out, key_mode,
) -> torch.Tensor:  # fmt: skip
    """Query rotation, the Gluon split kernel (partials in natural rotated order) and the merge."""
    batch, num_q_heads, _ = query.shape
    num_kv_heads, block_size = k_packed.shape[2], k_packed.shape[1]
    group = num_q_heads // num_kv_heads
    dev = query.device
    kt, vt = kernel_tables(k_codec, dev), kernel_tables(v_codec, dev)
    max_tokens = block_tables.shape[1] * block_size
    per_sm = lut_programs_per_sm(dev, key_mode)
    splits = lut_splits(batch, num_kv_heads, max_tokens, dev, per_sm)
    warps, tile = CONFIG["lut_warps"], CONFIG["lut_tile"]
    if not 2 <= warps <= 16 or warps & (warps - 1):
        raise ValueError(
            f"CONFIG['lut_warps'] is {warps}: use a power of two from 2 to 16 (threads fill whole table "
            "rows, warp outputs whole 8 KiB chunks)"
        )
    step = warps * tile
    combine = lut_combines(max_tokens, splits)
    partials = splits if combine else splits * warps
    check_capacity(workspace, partials)
    q = query if query.stride(-1) == 1 else query.contiguous()
    items = batch * num_kv_heads * splits
    grid = (min(items, per_sm * num_sms(dev)),)
    steps = lut_item_steps(max_tokens, splits)
    split_tokens = steps * step
    pdl = lut_pdl(items, grid[0], steps) and use_pdl(dev)
    rotate_queries(q, kt.rot_t_bf16x3, workspace.q_rot_f16, scale, split16=True, pdl=pdl)
    table, k_off, v_off = decode_lut_table(k_codec, v_codec, key_mode, dev)
    k_asm = _lut.k4_asm(k_off) if key_mode == 4 else _lut.k8_asm(k_off) if key_mode == 8 else UNIFORM8_ASM
    kw, vw = k_packed.view(torch.int32), v_packed.view(torch.int32)
    maps = _tensor_maps(k_packed, v_packed, min(block_size, tile)) if _use_tma(k_packed, v_packed) else None
    tma = maps is not None
    if tma:  # stage: the boxes, the mbarrier init, the key and value read-backs
        init, unstage = _lut.tma_init_asm(warps, tile, key_mode), _lut.tma_unstage_asm(warps, tile, key_mode)
        stage = (_lut.tma_stage_asm(warps, tile, key_mode), init, *unstage)
    else:
        maps, stage = (0, 0), _lut.staging_asm(tile, key_mode)
    args = (
        workspace.q_rot_f16, kw, *kw.stride()[:3], k_norms, *k_norms.stride(),
        vw, *vw.stride()[:3], v_norms, *v_norms.stride(), table, *maps,
        block_tables, *block_tables.stride(), context_lens, workspace.partial_out, workspace.partial_lse,
        num_kv_heads, num_q_heads, group, splits, workspace.capacity, split_tokens, items,
        block_tables.shape[1], kt.uniform_step or 1.0,
    )  # fmt: skip
    constexprs = dict(
        BLOCK_SIZE=block_size, BS_SHIFT=block_size.bit_length() - 1, K_MODE=key_mode, K_ASM=k_asm,
        V_ASM=_lut.v4_asm(v_off), W=warps, T=tile, K_STAGE=stage[0], V_STAGE=stage[1], K_UNSTAGE=stage[2],
        V_UNSTAGE=stage[3], TMA=tma, COMBINE=combine, PDL=pdl, num_warps=warps,
        maxnreg=CONFIG["lut_maxnreg"], **({"launch_pdl": True} if pdl else {}),
    )  # fmt: skip
    capability = _capability(cuda_index(dev))
    strides = (*kw.stride()[1:3], *k_norms.stride()[1:], *vw.stride()[1:3], *v_norms.stride()[1:])
    shared = _lut.shared_bytes(warps, tile, key_mode)
    _check_lut_compile(args, constexprs, grid, shared, (capability, strides))
    LAST_COMPILED["split"] = _lut._decode_lut_kernel[grid](*args, **constexprs)
    return merge(workspace, partials, vt.rot, out)


_LUT_CHECKED: set = set()


def _check_lut_compile(args, constexprs: dict, grid, expected_shared: int, specialization) -> None:
    """Before the first launch of each configuration (constexprs, and `specialization`: the device capability
    and the constexpr strides): compile it and check that its shared memory is exactly the buffer its PTX
    addresses from offset 0 (the table and the staging slots), else raise."""
    settings = sorted((k, v) for k, v in constexprs.items() if not k.endswith("ASM") and "STAGE" not in k)
    key = (specialization, *settings)
    if key in _LUT_CHECKED:
        return
    kernel = _lut._decode_lut_kernel.warmup(*args, grid=grid, **constexprs)
    if kernel.metadata.shared != expected_shared:
        raise LutUnsupported(
            f"_decode_lut_kernel compiled to {kernel.metadata.shared} bytes of shared memory, not only its "
            f"{expected_shared}-byte buffer"
        )
    _LUT_CHECKED.add(key)


class LutUnsupported(RuntimeError):
    """The Gluon kernel compiled to something its inline PTX cannot rely on (raised before any launch)."""
