"""Public launcher: fused paged decode attention over a TurboQuant VRAM tier.

Provides:
    tq_decode_attention(query, k_packed, k_norms, v_packed, v_norms, block_tables, context_lens,
                        k_codec, v_codec, scale=None, *, workspace=None, out=None) -> [B, Hq, D]
    DecodeWorkspace.allocate(query, block_tables, block_size, num_kv_heads)   preallocated split-K buffers
    plan_num_splits(batch, num_kv_heads, max_tokens, device) -> int

Three launches (two with rotate_in_split), no host synchronisation: the query rotation, the split kernel
(rotated-domain scoring, each K/V byte read once per kv head for all its query heads, online softmax over
TILE-token tiles) and the merge kernel (log-sum-exp merge of the splits, one rotation back).
Split kernels: on CUDA with 16-bit queries, head_dim 128, 4-bit values, 4/8-bit keys and enough work
(`lut_min_work`), the Gluon kernel _decode_lut_kernel (mma.sync, lookups in shared memory; GPU only: its PTX
text is emulated in tests/kernels/test_decode_lut_ptx.py, test_gpu.py runs it). Otherwise the Triton
_decode_perfield_kernel (2/4/8-bit; 3-bit uses _decode_split_kernel), whose 4-bit lookup on the GPU is
inline PTX (register permutes) that the interpreter replaces by a table gather (test_decode_tables.py).
With a workspace (and `out`) passed in, the call allocates nothing, so it can be captured in a CUDA graph.
The number of splits depends only on shapes.
Precision: float32 queries use IEEE float32 products (≤ 1e-4 relative to a float64 reference); bfloat16 /
float16 queries use 16-bit operands with float32 accumulation, like bf16 SDPA (bfloat16 in the Triton
kernels, float16 centroids, queries and probabilities in the Gluon kernel, whose value norms must stay
below float16's 65504).
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass

import torch

from ._backend import HAVE_TRITON, interpreting, next_pow2, num_sms, pdl_supported, use_triton
from ._checks import check_cache, check_codec, check_float, check_index, check_same_device, triton_layout_ok
from ._tables import UNIFORM8_ASM, decode_lut_table, kernel_tables
from .codec import TurboQuantCodec
from .reference import decode_attention_reference

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
    "lut_kernel": True,  # the Gluon kernel (_decode_lut_kernel) where it applies, see _lut_mode_of
    "lut_min_work": 1 << 18,  # ... and for B · H · max_blocks · block_size ≥ this (below, its 64 KiB table
    # fill per program costs more than it saves: H200, K4V4 1×4K 26 µs vs 20 µs for the Triton kernel)
    "lut_warps": 8,  # its warps per program (a power of two)
    "lut_tile": 32,  # its tokens per warp and step (32 or 64)
    "lut_maxnreg": 128,  # its register cap per thread
    "lut_prefetch": False,  # it loads the next tile while computing this one
    "lut_programs_per_sm": 2,  # its programs resident per SM (64 KiB of shared memory each)
}
_LOG = logging.getLogger(__name__)
_LOG2E = 1.4426950408889634
_ROTATE_COLUMNS = 32  # output columns per query-rotation program (more programs for small batches)
LAST_COMPILED: dict = {}  # the last compiled split kernel (register and spill report in the benchmark)

HAVE_GLUON = False
if HAVE_TRITON:
    from ._decode_kernel import _decode_split_kernel, _rotate_query_kernel
    from ._decode_merge_kernel import _decode_merge_kernel
    from ._decode_perfield_kernel import _decode_perfield_kernel

    try:  # Gluon is experimental: a Triton without it (or with another API) keeps the Triton kernels
        from . import _decode_lut_kernel as _lut

        HAVE_GLUON = True
    except (ImportError, AttributeError):
        pass


def plan_num_splits(batch: int, num_kv_heads: int, max_tokens: int, device: torch.device) -> int:
    """Splits per (sequence, kv head): the fewest that minimise the tile steps on the critical path.

    With `programs_per_sm` programs resident per SM, the grid runs in waves of that many programs per SM;
    a program walks ceil(tiles / splits) tiles plus a fixed cost (`split_overhead_tiles`: prologue, partial
    write, its share of the merge), so the time is ~ waves × (tiles per program + overhead). Plans that fill
    less than `min_wave_fill` of one wave are skipped unless every tile already has its own program.
    """
    tiles = -(-max_tokens // CONFIG["tile"])
    capacity = CONFIG["programs_per_sm"] * num_sms(device)
    return _plan_splits(
        batch * num_kv_heads, tiles, capacity, CONFIG["min_wave_fill"], CONFIG["split_overhead_tiles"]
    )


@functools.lru_cache(maxsize=1024)
def _plan_splits(rows: int, tiles: int, capacity: int, min_fill: float, overhead: float) -> int:
    best_cost, best = math.inf, tiles
    for splits in range(1, tiles + 1):
        programs = rows * splits
        if programs < min_fill * capacity and splits < tiles:
            continue
        cost = -(-programs // capacity) * (-(-tiles // splits) + overhead)
        if cost < best_cost:
            best_cost, best = cost, splits
    return best


@dataclass
class DecodeWorkspace:
    """Split-K scratch of one decode shape: partial outputs and their log-sum-exps (float32)."""

    partial_out: torch.Tensor  # [B, Hq, P, D] f32: room for P partials per query head
    partial_lse: torch.Tensor  # [B, Hq, P] f32
    q_rot_f32: torch.Tensor  # [B, Hq, D] rotated query (float32 queries)
    q_rot_bf16: torch.Tensor  # [B, Hq, D] rotated query (16-bit queries, Triton kernels)
    q_rot_f16: torch.Tensor  # [B, Hq, D] rotated query (16-bit queries, Gluon kernel)

    @property
    def capacity(self) -> int:
        return self.partial_lse.shape[2]

    @classmethod
    def allocate(
        cls, query: torch.Tensor, block_tables: torch.Tensor, block_size: int, num_kv_heads: int
    ) -> DecodeWorkspace:
        batch, num_q_heads, head_dim = query.shape
        tokens = block_tables.shape[1] * block_size
        partials = max(
            plan_num_splits(batch, num_kv_heads, tokens, query.device),
            _lut_partials(batch, num_kv_heads, tokens, query.device),
        )
        dev = query.device
        return cls(
            torch.empty(batch, num_q_heads, partials, head_dim, device=dev, dtype=torch.float32),
            torch.empty(batch, num_q_heads, partials, device=dev, dtype=torch.float32),
            torch.empty(batch, num_q_heads, head_dim, device=dev, dtype=torch.float32),
            torch.empty(batch, num_q_heads, head_dim, device=dev, dtype=torch.bfloat16),
            torch.empty(batch, num_q_heads, head_dim, device=dev, dtype=torch.float16),
        )


def tq_decode_attention(
    query: torch.Tensor,  # [B, Hq, D] float
    k_packed: torch.Tensor,  # [NB, BS, H, Pk] uint8 (one layer)
    k_norms: torch.Tensor,  # [NB, BS, H] f32
    v_packed: torch.Tensor,  # [NB, BS, H, Pv] uint8
    v_norms: torch.Tensor,  # [NB, BS, H] f32
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    context_lens: torch.Tensor,  # [B] int32, each ≥ 1
    k_codec: TurboQuantCodec,
    v_codec: TurboQuantCodec,
    scale: float | None = None,
    *,
    workspace: DecodeWorkspace | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of one new query per sequence over its cached tokens → [B, Hq, D] in query's dtype."""
    batch, num_q_heads, head_dim, num_kv_heads, block_size = _check(
        query, k_packed, k_norms, v_packed, v_norms, block_tables, context_lens, k_codec, v_codec
    )
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    if out is None:
        out = torch.empty_like(query)
    elif out.shape != query.shape or out.dtype != query.dtype or out.stride(-1) != 1:
        raise ValueError(f"out must be {query.dtype} {tuple(query.shape)} with last stride 1")
    if not (use_triton(query) and triton_layout_ok(head_dim)):
        ref = decode_attention_reference(
            query, k_packed, k_norms, v_packed, v_norms, block_tables, context_lens, k_codec, v_codec, scale
        )
        return out.copy_(ref)
    if workspace is None:
        workspace = DecodeWorkspace.allocate(query, block_tables, block_size, num_kv_heads)
    _check_workspace(workspace, query)
    group = num_q_heads // num_kv_heads
    work = batch * num_kv_heads * block_tables.shape[1] * block_size
    lut_mode = 0
    if work >= CONFIG["lut_min_work"]:
        lut_mode = _lut_mode_of(query, k_packed, v_packed, k_codec, v_codec, group, block_size)
    if lut_mode:
        try:
            return _launch_lut(query, k_packed, k_norms, v_packed, v_norms, block_tables, context_lens,
                               k_codec, v_codec, scale, workspace, out, lut_mode)  # fmt: skip
        except _LutUnsupported as err:  # this Triton compiles the kernel differently: use the Triton kernels
            CONFIG["lut_kernel"] = False
            _LOG.warning("decode: %s; falling back to the Triton kernels (CONFIG['lut_kernel'] = False)", err)
    splits = plan_num_splits(batch, num_kv_heads, block_tables.shape[1] * block_size, query.device)
    _check_capacity(workspace, splits)
    tile = CONFIG["tile"]
    tiles = -(-block_tables.shape[1] * block_size // tile)
    split_tokens = tile * -(-tiles // splits)
    kt, vt = kernel_tables(k_codec, query.device), kernel_tables(v_codec, query.device)
    ieee = query.dtype == torch.float32
    k_lut, v_lut = not ieee and kt.bytes_per_group == 1, not ieee and vt.bytes_per_group == 1
    ktab = kt.codebook if ieee else kt.byte_lut_bf16 if k_lut else kt.codebook_bf16
    vtab = vt.codebook if ieee else vt.byte_lut_bf16 if v_lut else vt.codebook_bf16
    gp = max(16, next_pow2(group))
    q = query if query.stride(-1) == 1 else query.contiguous()
    q_rot = workspace.q_rot_f32 if ieee else workspace.q_rot_bf16
    layout = CONFIG["layout"]
    if layout == "perfield" and kt.bits in (2, 4, 8) and vt.bits in (2, 4, 8):
        _launch_perfield(q, q_rot, k_packed, k_norms, v_packed, v_norms, block_tables, context_lens,
                         kt, vt, workspace, scale, splits, split_tokens, block_size, group, gp,
                         ieee)  # fmt: skip
        return _merge(workspace, splits, vt.rot_perm, out)
    if layout == "perfield":  # 3-bit K or V
        layout = "reshape"
    # "reshape": field-major tiles; "natural": natural order + byte LUTs
    fields = layout == "reshape"
    if fields:
        k_lut = v_lut = False
        ktab, vtab = (kt.codebook, vt.codebook) if ieee else (kt.codebook_bf16, vt.codebook_bf16)
    rot_q = kt.rot_t_perm if fields else kt.rot_t
    rotate_in_split = CONFIG["rotate_in_split"]
    if not rotate_in_split:
        _rotate_queries(q, rot_q, q_rot, num_kv_heads, scale)
    LAST_COMPILED["split"] = _decode_split_kernel[(batch * num_kv_heads, splits)](
        q_rot, q, q.stride(0), q.stride(1), rot_q, scale * _LOG2E,
        k_packed, *k_packed.stride(), k_norms, *k_norms.stride(),
        v_packed, *v_packed.stride(), v_norms, *v_norms.stride(),
        ktab, vtab, block_tables, *block_tables.stride(), context_lens,
        workspace.partial_out, workspace.partial_lse,
        num_kv_heads, num_q_heads, group, workspace.capacity, split_tokens,
        BLOCK_SIZE=block_size, D=head_dim, GP=gp, TILE=tile, IEEE=ieee, UPCAST=interpreting(),
        PREFETCH=CONFIG["prefetch"], FIELD_MAJOR=fields, ROTATE_Q=rotate_in_split,
        K_BITS=kt.bits, K_PG=kt.per_group, K_BPG=kt.bytes_per_group, K_NG=kt.num_groups, K_LUT=k_lut,
        V_BITS=vt.bits, V_PG=vt.per_group, V_BPG=vt.bytes_per_group, V_NG=vt.num_groups, V_LUT=v_lut,
        num_warps=CONFIG["num_warps"], num_stages=CONFIG["num_stages"],
    )  # fmt: skip
    return _merge(workspace, splits, vt.rot_perm if fields else vt.rot, out)


def _rotate_queries(
    q: torch.Tensor, rot: torch.Tensor, q_rot: torch.Tensor, num_kv_heads: int, scale: float,
    split16: bool = False, pdl: bool = False,
) -> None:  # fmt: skip
    """q_rot ← q·rot·scale·log2 e. rot: Πᵀ in any coordinate order, f32 [D, D] or (split16) bf16 [3, D, D]"""
    batch, num_q_heads, head_dim = q.shape
    group = num_q_heads // num_kv_heads
    _rotate_query_kernel[(batch * num_kv_heads, head_dim // _ROTATE_COLUMNS)](
        q, q.stride(0), q.stride(1), rot, q_rot,
        num_kv_heads, num_q_heads, group, scale * _LOG2E, D=head_dim, GP=max(16, next_pow2(group)),
        DC=_ROTATE_COLUMNS, SPLIT16=split16, UPCAST=interpreting(), PDL=pdl, num_warps=4,
    )  # fmt: skip


def _merge(workspace: DecodeWorkspace, splits: int, rot: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Log-sum-exp merge of the first `splits` partials and the rotation back (rot: Π, or Π[perm, :] for
    field-major partials)."""
    batch, num_q_heads, head_dim = out.shape
    pdl = _pdl(out.device)
    _decode_merge_kernel[(batch * num_q_heads,)](
        workspace.partial_out, workspace.partial_lse, rot, out, out.stride(0), out.stride(1),
        num_q_heads, splits, workspace.capacity, D=head_dim, SP=next_pow2(splits),
        SC=min(64, next_pow2(splits)), JC=32,
        PDL=pdl, num_warps=4, **({"launch_pdl": True} if pdl else {}),
    )  # fmt: skip
    return out


def _launch_perfield(
    q, q_rot, k_packed, k_norms, v_packed, v_norms, block_tables, context_lens,
    kt, vt, workspace, scale, splits, split_tokens, block_size, group, gp, ieee,
) -> None:  # fmt: skip
    """The split kernel with one dot per packed field (2/4/8-bit K and V); partials in field-major order."""
    batch, num_q_heads, head_dim = q.shape
    num_kv_heads = k_packed.shape[2]
    k_lut, v_lut = _lut_mode(kt, ieee, keys=True), _lut_mode(vt, ieee, keys=False)
    ktab = kt.codebook if ieee else kt.byte_lut_bf16 if k_lut else kt.codebook_bf16
    vtab = vt.codebook if ieee else vt.byte_lut_bf16 if v_lut else vt.codebook_bf16
    rotate_in_split = CONFIG["rotate_in_split"] and not ieee  # bf16 tensor-core rotation in each split
    pdl = _pdl(q.device)
    if not rotate_in_split:
        rot = kt.rot_t_perm if ieee else kt.rot_t_perm_bf16x3
        _rotate_queries(q, rot, q_rot, num_kv_heads, scale, split16=not ieee, pdl=pdl)
    LAST_COMPILED["split"] = _decode_perfield_kernel[(batch * num_kv_heads, splits)](
        q_rot, q, q.stride(0), q.stride(1), kt.rot_t_perm_bf16x3, scale * _LOG2E,
        k_packed, *k_packed.stride(), k_norms, *k_norms.stride(),
        v_packed, *v_packed.stride(), v_norms, *v_norms.stride(),
        ktab, vtab, block_tables, *block_tables.stride(), context_lens,
        workspace.partial_out, workspace.partial_lse,
        num_kv_heads, num_q_heads, group, workspace.capacity, split_tokens,
        BLOCK_SIZE=block_size, D=head_dim, GP=gp, TILE=CONFIG["tile"], IEEE=ieee, UPCAST=interpreting(),
        ROTATE_Q=rotate_in_split,
        K_BITS=kt.bits, K_PG=kt.per_group, K_NG=kt.num_groups, K_LUT=k_lut, K_ASM=_asm(kt, k_lut),
        V_BITS=vt.bits, V_PG=vt.per_group, V_NG=vt.num_groups, V_LUT=v_lut, V_ASM=_asm(vt, v_lut),
        PDL=pdl, k_step=kt.uniform_step or 1.0,
        num_warps=CONFIG["num_warps"], num_stages=CONFIG["num_stages"], maxnreg=CONFIG["maxnreg"],
        **({"launch_pdl": True} if pdl else {}),
    )  # fmt: skip


def _lut_mode_of(query, k_packed, v_packed, k_codec, v_codec, group: int, block_size: int) -> int:
    """The Gluon kernel's key mode (4: 4-bit, 8: 8-bit Lloyd-Max, 9: 8-bit uniform) where it applies, else 0:
    CUDA (sm_80+), 16-bit queries, head_dim 128, 4-bit values, 4/8-bit keys, G ≤ 8, a power-of-two block
    size and packed caches readable as int32 words."""
    if not (CONFIG["lut_kernel"] and HAVE_GLUON and query.is_cuda and not interpreting()):
        return 0
    if query.dtype not in (torch.float16, torch.bfloat16) or query.shape[-1] != 128 or group > 8:
        return 0
    if v_codec.bits != 4 or k_codec.bits not in (4, 8) or block_size & (block_size - 1):
        return 0
    if _capability(query.device.index if query.device.index is not None else torch.cuda.current_device()) < (
        8,
        0,
    ):
        return 0
    if not (_int32_words(k_packed) and _int32_words(v_packed)):
        return 0
    if k_codec.bits == 4:
        return 4
    return 9 if kernel_tables(k_codec, query.device).uniform_step is not None else 8


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def _int32_words(packed: torch.Tensor) -> bool:
    """Whether the kernel can read `packed` as int32 words with int32 offsets."""
    if packed.stride(-1) != 1 or any(s % 4 for s in packed.stride()[:-1]) or packed.data_ptr() % 4:
        return False
    extent = 1 + sum((n - 1) * s for n, s in zip(packed.shape, packed.stride(), strict=True))
    return extent // 4 < 2**31


def _lut_splits(batch: int, num_kv_heads: int, max_tokens: int, device: torch.device) -> int:
    step = CONFIG["lut_warps"] * CONFIG["lut_tile"]
    capacity = CONFIG["lut_programs_per_sm"] * num_sms(device)
    return _plan_splits(
        batch * num_kv_heads, -(-max_tokens // step), capacity, CONFIG["min_wave_fill"],
        CONFIG["split_overhead_tiles"],
    )  # fmt: skip


def _lut_partials(batch: int, num_kv_heads: int, max_tokens: int, device: torch.device) -> int:
    """Partials per query head of the Gluon kernel (splits × its warps); 0 where it cannot run."""
    if not (HAVE_GLUON and device.type == "cuda"):
        return 0
    return _lut_splits(batch, num_kv_heads, max_tokens, device) * CONFIG["lut_warps"]


def _launch_lut(
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
    splits = _lut_splits(batch, num_kv_heads, max_tokens, dev)
    warps, tile = CONFIG["lut_warps"], CONFIG["lut_tile"]
    step = warps * tile
    _check_capacity(workspace, splits * warps)
    q = query if query.stride(-1) == 1 else query.contiguous()
    _rotate_queries(q, kt.rot_t, workspace.q_rot_f16, num_kv_heads, scale)
    table, k_off, v_off = decode_lut_table(k_codec, v_codec, key_mode, dev)
    k_asm = _lut.k4_asm(k_off) if key_mode == 4 else _lut.k8_asm(k_off) if key_mode == 8 else _lut.K8U_ASM
    kw, vw = k_packed.view(torch.int32), v_packed.view(torch.int32)
    items = batch * num_kv_heads * splits
    split_tokens = step * -(-max_tokens // (splits * step))
    kernel = _lut._decode_lut_kernel[(min(items, CONFIG["lut_programs_per_sm"] * num_sms(dev)),)](
        workspace.q_rot_f16, kw, *kw.stride()[:3], k_norms, *k_norms.stride(),
        vw, *vw.stride()[:3], v_norms, *v_norms.stride(), table,
        block_tables, *block_tables.stride(), context_lens, workspace.partial_out, workspace.partial_lse,
        num_kv_heads, num_q_heads, group, splits, workspace.capacity, split_tokens, items,
        block_tables.shape[1], kt.uniform_step or 1.0,
        BLOCK_SIZE=block_size, BS_SHIFT=block_size.bit_length() - 1, K_MODE=key_mode, K_ASM=k_asm,
        V_ASM=_lut.v4_asm(v_off), W=warps, T=tile, PREFETCH=CONFIG["lut_prefetch"], num_warps=warps,
        maxnreg=CONFIG["lut_maxnreg"],
    )  # fmt: skip
    LAST_COMPILED["split"] = kernel
    if kernel.metadata.shared != _lut.LUT_BYTES:  # the PTX reads the table at offset 0 of shared memory
        raise _LutUnsupported(
            f"_decode_lut_kernel compiled to {kernel.metadata.shared} bytes of shared memory, not only its "
            f"{_lut.LUT_BYTES}-byte table"
        )
    return _merge(workspace, splits * warps, vt.rot, out)


class _LutUnsupported(RuntimeError):
    """The Gluon kernel compiled to something its inline PTX cannot rely on (its output is discarded)."""


def _check_capacity(workspace: DecodeWorkspace, partials: int) -> None:
    if workspace.capacity < partials:
        raise ValueError(
            f"workspace holds {workspace.capacity} partials per head, this call needs {partials}: allocate "
            "it with DecodeWorkspace.allocate(query, block_tables, block_size, num_kv_heads)"
        )


def _asm(tables, lut_mode: int) -> str:
    return UNIFORM8_ASM if lut_mode == 3 else tables.prmt_asm


def _pdl(device: torch.device) -> bool:
    return bool(CONFIG["pdl"]) and pdl_supported(device)


def _lut_mode(tables, ieee: bool, keys: bool) -> int:
    """0: one codebook lookup per index; 1: one byte-LUT lookup per byte; 2: 4-bit byte-LUT entries from
    prmt; 3 (keys): a symmetric uniform 8-bit codebook by arithmetic. Modes 2 and 3 are inline PTX, which
    the interpreter cannot run (it takes mode 0 or 1, which compute the same centroids)."""
    mode = CONFIG["lut"]
    if ieee or mode == "none":
        return 0
    if tables.bits == 8:
        return 3 if keys and tables.uniform_step is not None and not interpreting() else 0
    if tables.bits not in (2, 4):
        return 0
    if mode == "prmt" and tables.bits == 4 and not interpreting():
        return 2
    return 1


def _check(query, k_packed, k_norms, v_packed, v_norms, block_tables, context_lens, k_codec, v_codec):
    check_float("query", query, 3)
    batch, num_q_heads, head_dim = query.shape
    check_codec("k_codec", k_codec, head_dim)
    check_codec("v_codec", v_codec, head_dim)
    check_cache("k", k_packed, k_norms, k_codec)
    num_kv_heads, block_size = k_packed.shape[2], k_packed.shape[1]
    check_cache("v", v_packed, v_norms, v_codec, num_kv_heads)
    if num_q_heads % num_kv_heads:
        raise ValueError(f"query heads ({num_q_heads}) must be a multiple of kv heads ({num_kv_heads})")
    check_index("block_tables", block_tables, 2)
    check_index("context_lens", context_lens, 1)
    if block_tables.shape[0] != batch or context_lens.shape[0] != batch:
        raise ValueError(
            f"block_tables {tuple(block_tables.shape)} and context_lens {tuple(context_lens.shape)} "
            f"must have batch {batch} rows"
        )
    check_same_device(query=query, k_packed=k_packed, v_packed=v_packed, block_tables=block_tables,
                      context_lens=context_lens)  # fmt: skip
    return batch, num_q_heads, head_dim, num_kv_heads, block_size


def _check_workspace(workspace: DecodeWorkspace, query: torch.Tensor) -> None:
    batch, num_q_heads, head_dim = query.shape
    po, pl = workspace.partial_out, workspace.partial_lse
    if (
        po.shape[:2] != (batch, num_q_heads)
        or po.shape[3] != head_dim
        or pl.shape != po.shape[:3]
        or po.dtype != torch.float32
        or pl.dtype != torch.float32
        or not po.is_contiguous()
        or not pl.is_contiguous()
        or po.device != query.device
    ):
        raise ValueError(
            "workspace does not fit this call: allocate it with "
            "DecodeWorkspace.allocate(query, block_tables, block_size, num_kv_heads)"
        )
