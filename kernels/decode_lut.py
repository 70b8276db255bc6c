"""The Gluon decode kernel's dispatch and launch (see _decode_lut_kernel.py): where it applies, its split
planning, and one call (query rotation, the split kernel, the merge). Launch choices: the lut_* fields of a
DecodeLaunchConfig, passed to every function here.

Provides:
    lut_mode_of(query, k_packed, v_packed, k_codec, v_codec, group, block_size, config) -> key mode or 0
    lut_value_mode(v_bits) -> 4 or 8               the value mode (values of 1–4 bits or of 5–8)
    lut_serves(k_bits, v_bits, head_dim) -> bool   the widths and head_dims the Gluon kernel is built for:
        keys and values of 1–8 bits at head_dim 64 and 128 (widths off NATIVE_WIDTHS on sm_90+, by TMA)
    lut_takes(k_bits, v_bits, head_dim, config) -> bool   those it takes under a launch config
    lut_takes_pages(k_bits, v_bits, head_dim, num_kv_heads, config) -> bool   those it takes over primary
        mode's pages (tiercache.pages)
    lut_partials(batch, num_kv_heads, max_tokens, device, config, head_dim) -> partials per query head it
        needs
    launch_lut(..., workspace, out, key_mode, config) -> out          raises LutUnsupported before launching
    lut_compile_failed(device, config, widths, head_dim), note_lut_compile_failure(device, config, widths,
        head_dim, err)   the memo below
    lut_programs_per_sm, lut_splits, lut_combines, lut_item_steps, lut_pdl    its launch arithmetic

Compile-failure memo: before the first launch of a configuration, launch_lut compiles the kernel and checks
its shared memory (_check_lut_compile); where a Triton compiles it to something its inline PTX cannot rely
on, it raises LutUnsupported. tq_decode_attention then notes the failure here, keyed by the device's
capability, the widths and head_dim, and the config fields the kernel's compile-time parameters come from,
and takes the Triton kernels for that key from then on. This caches a compile failure of one launch
configuration on one kind of device for the process; it changes no setting, and other configurations still
try the Gluon kernel.
"""

from __future__ import annotations

import functools
import logging

import torch

from ._backend import HAVE_TRITON, cuda_index, interpreting, num_sms
from ._decode_launch import LAST_COMPILED, check_capacity, merge, plan_splits, rotate_queries, use_pdl
from ._decode_lut_ptx import key_pieces, value_pieces
from ._tables import UNIFORM8_ASM, decode_lut_table, kernel_tables
from ._tensor_map import box_map, flat_rows
from .launch_config import DecodeLaunchConfig

_LOG = logging.getLogger(__name__)
HAVE_GLUON = COMBINE_COMPILES = False
if HAVE_TRITON:
    try:  # Gluon is experimental: a Triton without it (or with another API) keeps the Triton kernels
        from . import _decode_lut_kernel as _lut
        from ._decode_lut_reduce import COMBINE_COMPILES

        HAVE_GLUON = True
    except (ImportError, AttributeError):
        pass


# (key bits, value bits) whose words the operands take as they are (nibbles or bytes)
NATIVE_WIDTHS = ((4, 4), (8, 4), (4, 8), (8, 8))


def lut_serves(k_bits: int, v_bits: int, head_dim: int) -> bool:
    """Whether the Gluon kernel is built for these widths and head_dim: keys and values of 1–8 bits at
    head_dim 128 and 64 (other head_dims decode on the Triton kernel). Widths other than NATIVE_WIDTHS need
    TMA (sm_90+), whose boxes take rows of a multiple of 16 bytes: a packed row is head_dim·bits/8 bytes,
    8·bits at head_dim 64, so odd widths there (rows of 8, 24, 40, 56 bytes) take boxes of a token's row of
    all heads (_tensor_map's flat form), which need the heads packed densely and 16-byte aligned token and
    block strides (lut_mode_of)."""
    return 1 <= k_bits <= 8 and 1 <= v_bits <= 8 and head_dim in (64, 128)


def lut_takes(k_bits: int, v_bits: int, head_dim: int, config: DecodeLaunchConfig) -> bool:
    """Whether decodes of these widths and head_dim take the Gluon kernel under `config` (where the device,
    dtypes and caches allow: lut_mode_of): lut_serves, at a head_dim of config.lut_head_dims."""
    return head_dim in config.lut_head_dims and lut_serves(k_bits, v_bits, head_dim)


def lut_takes_pages(
    k_bits: int, v_bits: int, head_dim: int, num_kv_heads: int, config: DecodeLaunchConfig
) -> bool:
    """lut_takes over primary mode's pages, whose sections hold a token's heads densely (tokens H·P bytes
    apart): rows of a multiple of 16 bytes always, other rows (odd widths at head_dim 64) only where a
    token's row of heads is one too (the flat TMA boxes' pitch: H·bits even), else the Triton kernel."""
    rows = (head_dim * k_bits // 8, head_dim * v_bits // 8)
    fits = all(row % 16 == 0 or num_kv_heads * row % 16 == 0 for row in rows)
    return fits and lut_takes(k_bits, v_bits, head_dim, config)


def lut_value_mode(v_bits: int) -> int:
    """The Gluon kernel's value mode: 4 (nibble operands, values of 1–4 bits) or 8 (byte operands, 5–8)."""
    return 4 if v_bits <= 4 else 8


def lut_mode_of(
    query, k_packed, v_packed, k_codec, v_codec, group: int, block_size: int, config: DecodeLaunchConfig
) -> int:
    """The Gluon kernel's key mode where it applies (4: nibble operands, keys of 1–4 bits; 8: byte operands,
    5–8 bits; 9: uniform 8-bit keys by arithmetic), else 0; its value mode follows from the value width
    (lut_value_mode). Where: config.lut_kernel, CUDA (sm_80+), 16-bit queries, lut_serves' widths and
    head_dim, G ≤ 8, a power-of-two block size of at least 8 tokens (a block piece is a register dimension of
    the kernel's layouts: 8 tokens, an MMA row group, at least), and packed caches: NATIVE_WIDTHS where it
    can copy them in its pieces (_decode_lut_ptx: keys 16 bytes, or 8 at head_dim 64 in key mode 4; values
    an eighth of a token's operand words); other widths only with TMA staging (sm_90+, config.lut_tma, caches
    that take TMA boxes: _takes_boxes; boxes of ≥ 8 rows at a pitch of a multiple of 16 bytes: 128-byte
    aligned slots)."""
    if not (config.lut_kernel and HAVE_GLUON and query.is_cuda and not interpreting()):
        return 0
    if query.dtype not in (torch.float16, torch.bfloat16) or group > 8:
        return 0
    if block_size < 8 or block_size & (block_size - 1):
        return 0
    head_dim = query.shape[-1]
    if not lut_takes(k_codec.bits, v_codec.bits, head_dim, config):
        return 0
    if _capability(cuda_index(query.device)) < (8, 0):
        return 0
    key_mode = 4 if k_codec.bits <= 4 else 8
    if (k_codec.bits, v_codec.bits) in NATIVE_WIDTHS:
        key_piece = key_pieces(16, key_mode, head_dim)[1]
        value_piece = value_pieces(16, lut_value_mode(v_codec.bits), head_dim)[1]
        if not (_aligned_words(k_packed, key_piece) and _aligned_words(v_packed, value_piece)):
            return 0
    elif not _use_tma(k_packed, v_packed, config):
        return 0
    if key_mode == 8 and kernel_tables(k_codec, query.device).uniform_step is not None:
        return 9
    return key_mode


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


def lut_programs_per_sm(
    device: torch.device, key_mode: int, value_mode: int, config: DecodeLaunchConfig, head_dim: int = 128
) -> int:
    """Programs of the Gluon kernel resident per SM: config.lut_programs_per_sm, or (None) as many as its
    shared memory (_decode_lut_ptx.shared_bytes: 64 KiB + warps · tile · head_dim to 2·head_dim bytes, and
    1 KiB reserved per program), registers (lut_maxnreg, else 255) and warps allow."""
    if config.lut_programs_per_sm is not None:
        return config.lut_programs_per_sm
    warps, tile = config.lut_warps, config.lut_tile
    smem_sm, threads_sm = _sm_limits(cuda_index(device))
    by_smem = smem_sm // (_lut.shared_bytes(warps, tile, key_mode, value_mode, head_dim) + 1024)
    regs = -(-(config.lut_maxnreg or 255) * 32 // 256) * 256 * warps  # allocated per warp in units of 256
    return max(1, min(by_smem, _REGISTERS_PER_SM // regs, threads_sm // (32 * warps)))


def _use_tma(k_packed: torch.Tensor, v_packed: torch.Tensor, config: DecodeLaunchConfig) -> bool:
    """TMA staging: on sm_90+ (and config.lut_tma) where both caches take TMA boxes (else cp.async)."""
    tma_device = config.lut_tma and _capability(cuda_index(k_packed.device)) >= (9, 0)
    return tma_device and _takes_boxes(k_packed) and _takes_boxes(v_packed)


def _takes_boxes(packed: torch.Tensor) -> bool:
    """Whether `packed` [NB, BS, H, P] uint8 takes TMA boxes of one block and kv head (_tensor_map): in the
    native form (P a multiple of 16) where its address and strides are 16-byte aligned; in the flat form
    (other P) where its heads are dense (head stride P) and its address, token and block strides are."""
    if not flat_rows(packed):
        return _aligned_words(packed, 16)
    dense = packed.stride(3) == 1 and packed.stride(2) == packed.shape[3]
    aligned = packed.stride(1) % 16 == 0 and packed.stride(0) % 16 == 0 and packed.data_ptr() % 16 == 0
    return dense and aligned


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


def lut_splits(
    batch: int, num_kv_heads: int, max_tokens: int, device: torch.device, per_sm: int,
    config: DecodeLaunchConfig,
) -> int:  # fmt: skip
    step = config.lut_warps * config.lut_tile
    return plan_splits(
        batch * num_kv_heads, -(-max_tokens // step), per_sm * num_sms(device), config.lut_min_wave_fill,
        config.split_overhead_tiles,
    )  # fmt: skip


def lut_combines(max_tokens: int, splits: int, config: DecodeLaunchConfig) -> bool:
    """Whether the Gluon kernel combines its warps' partials into one per item (through shared memory, at
    the item's end): where an item walks at most config.lut_combine_max_steps tile steps, on a Triton that
    compiles the combine (_decode_lut_reduce.COMBINE_COMPILES: 3.6, not 3.8). The combine saves per item the
    warps' partial writes and the merge's reads of them (see benchmarks/RESULTS.md)."""
    steps = lut_item_steps(max_tokens, splits, config)
    return COMBINE_COMPILES and steps <= config.lut_combine_max_steps


def lut_item_steps(max_tokens: int, splits: int, config: DecodeLaunchConfig) -> int:
    """Tile steps of W·T tokens an item walks: its split's share of the cache's token capacity."""
    return -(-max_tokens // (splits * config.lut_warps * config.lut_tile))


def lut_pdl(items: int, programs: int, steps: int, config: DecodeLaunchConfig) -> bool:
    """Whether the Gluon kernel is launched dependent on the query rotation (PDL: it fills its table and
    stages its first tile while the rotation runs), for `items` of `steps` tile steps on `programs`: where
    every program takes one item of at most config.lut_pdl_max_steps steps (0: never, None: always; see
    benchmarks/RESULTS.md)."""
    limit = config.lut_pdl_max_steps
    return limit is None or (items <= programs and steps <= limit)


def lut_partials(
    batch: int, num_kv_heads: int, max_tokens: int, device: torch.device, config: DecodeLaunchConfig,
    head_dim: int = 128,
) -> int:  # fmt: skip
    """Partials per query head of the Gluon kernel (per split: one, or one per warp), the most any key and
    value mode needs at this head_dim; 0 where it cannot run."""
    if not (HAVE_GLUON and device.type == "cuda"):
        return 0
    per_sm = {lut_programs_per_sm(device, k, v, config, head_dim) for k in (4, 8, 9) for v in (4, 8)}
    splits = (lut_splits(batch, num_kv_heads, max_tokens, device, n, config) for n in per_sm)
    return max(n if lut_combines(max_tokens, n, config) else n * config.lut_warps for n in splits)


def launch_lut(
    query, k_packed, k_norms, v_packed, v_norms, block_tables, context_lens, k_codec, v_codec, scale,
    workspace, out, key_mode, config: DecodeLaunchConfig,
) -> torch.Tensor:  # fmt: skip
    """Query rotation, the Gluon split kernel (partials in natural rotated order) and the merge."""
    batch, num_q_heads, head_dim = query.shape
    num_kv_heads, block_size = k_packed.shape[2], k_packed.shape[1]
    group = num_q_heads // num_kv_heads
    dev = query.device
    kt, vt = kernel_tables(k_codec, dev), kernel_tables(v_codec, dev)
    max_tokens = block_tables.shape[1] * block_size
    value_mode = lut_value_mode(v_codec.bits)
    modes = (key_mode, value_mode)
    per_sm = lut_programs_per_sm(dev, *modes, config, head_dim)
    splits = lut_splits(batch, num_kv_heads, max_tokens, dev, per_sm, config)
    warps, tile = config.lut_warps, config.lut_tile
    step = warps * tile
    combine = lut_combines(max_tokens, splits, config)
    partials = splits if combine else splits * warps
    check_capacity(workspace, partials)
    q = query if query.stride(-1) == 1 else query.contiguous()
    items = batch * num_kv_heads * splits
    grid = (min(items, per_sm * num_sms(dev)),)
    steps = lut_item_steps(max_tokens, splits, config)
    split_tokens = steps * step
    pdl = lut_pdl(items, grid[0], steps, config) and use_pdl(dev, config)
    rotate_queries(q, kt.rot_t_bf16x3, workspace.q_rot_f16, scale, split16=True, pdl=pdl)
    table, k_off, v_off = decode_lut_table(k_codec, v_codec, key_mode, dev)
    k_asm = _lut.k4_asm(k_off) if key_mode == 4 else _lut.k8_asm(k_off) if key_mode == 8 else UNIFORM8_ASM
    v_asm = _lut.v4_asm(v_off) if value_mode == 4 else _lut.v8_asm(v_off)
    kw, vw = k_packed.view(torch.int32), v_packed.view(torch.int32)
    use_tma = _use_tma(k_packed, v_packed, config)
    maps = _tensor_maps(k_packed, v_packed, min(block_size, tile)) if use_tma else None
    tma = maps is not None
    widths = (k_codec.bits, v_codec.bits)
    if tma:  # stage: the boxes, the mbarrier init, the key and value read-backs
        init = _lut.tma_init_asm(warps, tile, *modes, head_dim)
        unstage = _lut.tma_unstage_asm(warps, tile, *modes, *widths, head_dim)
        stage = (_lut.tma_stage_asm(warps, tile, *modes, head_dim), init, *unstage)
    elif widths not in NATIVE_WIDTHS:
        raise LutUnsupported(f"K{widths[0]}V{widths[1]} needs TMA staging, and the driver made no tensor map")
    else:
        maps, stage = (0, 0), _lut.staging_asm(tile, *modes, head_dim)
    args = (
        workspace.q_rot_f16, kw, *kw.stride()[:3], k_norms, *k_norms.stride(),
        vw, *vw.stride()[:3], v_norms, *v_norms.stride(), table, *maps,
        block_tables, *block_tables.stride(), context_lens, workspace.partial_out, workspace.partial_lse,
        num_kv_heads, num_q_heads, group, splits, workspace.capacity, split_tokens, items,
        block_tables.shape[1], kt.uniform_step or 1.0,
    )  # fmt: skip
    constexprs = dict(
        BLOCK_SIZE=block_size, BS_SHIFT=block_size.bit_length() - 1, K_MODE=key_mode, K_ASM=k_asm,
        V_MODE=value_mode, V_ASM=v_asm, K_BITS=widths[0], V_BITS=widths[1], D=head_dim, W=warps, T=tile,
        K_STAGE=stage[0], V_STAGE=stage[1], K_UNSTAGE=stage[2], V_UNSTAGE=stage[3], TMA=tma,
        K_FLAT=tma and flat_rows(k_packed), V_FLAT=tma and flat_rows(v_packed), COMBINE=combine, PDL=pdl,
        num_warps=warps, maxnreg=config.lut_maxnreg, **({"launch_pdl": True} if pdl else {}),
    )  # fmt: skip
    capability = _capability(cuda_index(dev))
    strides = (*kw.stride()[1:3], *k_norms.stride()[1:], *vw.stride()[1:3], *v_norms.stride()[1:])
    shared = _lut.shared_bytes(warps, tile, *modes, head_dim)
    _check_lut_compile(args, constexprs, grid, shared, (capability, strides))
    LAST_COMPILED["split"] = _lut._decode_lut_kernel[grid](*args, **constexprs)
    return merge(workspace, partials, vt.rot, out, config)


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


# The compile-failure memo (see the module docstring): compile key → the failure, kept for the process. A key
# is the device's capability (its type off CUDA), the (key, value) widths, the head_dim, and the config fields
# that the Gluon kernel's compile-time parameters come from: W, T, maxnreg and TMA directly, COMBINE and PDL
# through the step limits and pdl.
_FAILED_COMPILES: dict[tuple, str] = {}
_COMPILE_FIELDS = ("lut_warps", "lut_tile", "lut_maxnreg", "lut_tma", "lut_combine_max_steps",
                   "lut_pdl_max_steps", "pdl")  # fmt: skip


def _compile_key(
    device: torch.device, config: DecodeLaunchConfig, widths: tuple[int, int], head_dim: int
) -> tuple:  # fmt: skip
    kind = _capability(cuda_index(device)) if device.type == "cuda" else device.type
    return kind, widths, head_dim, *(getattr(config, name) for name in _COMPILE_FIELDS)


def lut_compile_failed(
    device: torch.device, config: DecodeLaunchConfig, widths: tuple[int, int], head_dim: int
) -> bool:  # fmt: skip
    """Whether the Gluon kernel of this launch configuration, (key, value) widths and head_dim already failed
    its compile check on a device like `device` in this process (the caller then takes the Triton kernels
    without trying again)."""
    return _compile_key(device, config, widths, head_dim) in _FAILED_COMPILES


def note_lut_compile_failure(
    device: torch.device, config: DecodeLaunchConfig, widths: tuple[int, int], head_dim: int,
    err: LutUnsupported,
) -> None:  # fmt: skip
    """Remember that this launch configuration's Gluon kernel does not compile as it must for these widths
    and head_dim on devices like `device`; one warning line the first time for each key."""
    key = _compile_key(device, config, widths, head_dim)
    if key in _FAILED_COMPILES:
        return
    _FAILED_COMPILES[key] = str(err)
    fields = ", ".join(f"{name}={value!r}" for name, value in zip(_COMPILE_FIELDS, key[3:], strict=True))
    _LOG.warning("decode: %s; the Triton kernels serve K%dV%d at head_dim %d under launch configuration (%s) "
                 "on %s from now on, in this process", err, *widths, head_dim, fields, key[0])  # fmt: skip
