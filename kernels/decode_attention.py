"""Public launcher: fused paged decode attention over a TurboQuant VRAM tier.

Provides:
    tq_decode_attention(query, k_packed, k_norms, v_packed, v_norms, block_tables, context_lens,
                        k_codec, v_codec, scale=None, *, workspace=None, out=None, config=None) -> [B, Hq, D]
    DecodeWorkspace.allocate(query, block_tables, block_size, num_kv_heads, *, config=None)   split-K buffers
    plan_num_splits(batch, num_kv_heads, max_tokens, device, *, config=None) -> int
config: a DecodeLaunchConfig (launch_config.py), None for the defaults; a workspace is allocated for the
launch configuration of the calls it serves.

Three launches (two with rotate_in_split), no host synchronisation: the query rotation, the split kernel
(rotated-domain scoring, each K/V byte read once per kv head for all its query heads, online softmax over
TILE-token tiles) and the merge kernel (log-sum-exp merge of the splits, one rotation back).
Split kernels: on CUDA with 16-bit queries, head_dim 128 (keys and values of 1–8 bits) or 64 (of 2, 4, 6 or
8 bits) and enough work (config.lut_min_work), the Gluon kernel _decode_lut_kernel, launched by
decode_lut.py (mma.sync, lookups in shared memory; widths other than K4V4, K8V4, K4V8 and K8V8 on sm_90+
only; GPU only: its PTX text is emulated in tests/kernels/test_decode_lut_ptx.py, test_gpu.py runs it).
Where its compile check fails, the Triton kernels serve that launch configuration and widths on that kind of
device from then on (decode_lut's compile-failure memo). Shared launch pieces (split planning, rotation,
merge) are in _decode_launch.py.
Otherwise the Triton _decode_perfield_kernel (every width 1–8 for K and V),
whose 4-bit lookup on the GPU is inline PTX (register permutes) that the interpreter replaces by a table
gather (test_decode_tables.py).
With a workspace (and `out`) passed in, the call allocates nothing, so it can be captured in a CUDA graph.
The number of splits depends only on shapes.
Precision: float32 queries use IEEE float32 products (≤ 1e-4 relative to a float64 reference); bfloat16 /
float16 queries use 16-bit operands with float32 accumulation, like bf16 SDPA (bfloat16 in the Triton
kernels, float16 centroids, queries and probabilities in the Gluon kernel, whose value norms must stay
below float16's 65504).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ._backend import HAVE_TRITON, interpreting, next_pow2, num_sms, use_triton
from ._checks import check_cache, check_codec, check_float, check_index, check_same_device, triton_layout_ok
from ._decode_launch import LAST_COMPILED, LOG2E, check_capacity, merge, plan_splits, rotate_queries, use_pdl
from ._tables import UNIFORM8_ASM, kernel_tables
from .codec import TurboQuantCodec
from .decode_lut import (
    LutUnsupported,
    launch_lut,
    lut_compile_failed,
    lut_mode_of,
    lut_partials,
    note_lut_compile_failure,
)
from .launch_config import DecodeLaunchConfig, resolve_config
from .reference import decode_attention_reference

if HAVE_TRITON:
    from ._decode_perfield_kernel import _decode_perfield_kernel


def plan_num_splits(
    batch: int, num_kv_heads: int, max_tokens: int, device: torch.device, *,
    config: DecodeLaunchConfig | None = None,
) -> int:  # fmt: skip
    """Splits per (sequence, kv head) of the Triton split kernels: the fewest that minimise the tile steps on
    the critical path.

    With config.programs_per_sm programs resident per SM, the grid runs in waves of that many programs per
    SM; a program walks ceil(tiles / splits) tiles plus a fixed cost (config.split_overhead_tiles: prologue,
    partial write, its share of the merge), so the time is ~ waves × (tiles per program + overhead). Plans
    that fill less than config.min_wave_fill of one wave are skipped unless every tile has its own program.
    """
    config = resolve_config(config, DecodeLaunchConfig)
    tiles = -(-max_tokens // config.tile)
    capacity = config.programs_per_sm * num_sms(device)
    return plan_splits(
        batch * num_kv_heads, tiles, capacity, config.min_wave_fill, config.split_overhead_tiles
    )


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
        cls, query: torch.Tensor, block_tables: torch.Tensor, block_size: int, num_kv_heads: int,
        *, config: DecodeLaunchConfig | None = None,
    ) -> DecodeWorkspace:  # fmt: skip
        """Room for the partials of any call of this shape under launch configuration `config`."""
        config = resolve_config(config, DecodeLaunchConfig)
        batch, num_q_heads, head_dim = query.shape
        tokens = block_tables.shape[1] * block_size
        partials = max(
            plan_num_splits(batch, num_kv_heads, tokens, query.device, config=config),
            lut_partials(batch, num_kv_heads, tokens, query.device, config, head_dim),
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
    config: DecodeLaunchConfig | None = None,
) -> torch.Tensor:
    """Attention of one new query per sequence over its cached tokens → [B, Hq, D] in query's dtype."""
    config = resolve_config(config, DecodeLaunchConfig)
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
        workspace = DecodeWorkspace.allocate(query, block_tables, block_size, num_kv_heads, config=config)
    _check_workspace(workspace, query)
    group = num_q_heads // num_kv_heads
    max_tokens = block_tables.shape[1] * block_size
    lut_mode = 0
    if batch * num_kv_heads * max_tokens >= config.lut_min_work:
        lut_mode = lut_mode_of(query, k_packed, v_packed, k_codec, v_codec, group, block_size, config)
    widths = (k_codec.bits, v_codec.bits)
    if lut_mode and not lut_compile_failed(query.device, config, widths, head_dim):
        try:
            return launch_lut(query, k_packed, k_norms, v_packed, v_norms, block_tables, context_lens,
                               k_codec, v_codec, scale, workspace, out, lut_mode, config)  # fmt: skip
        except LutUnsupported as err:  # this Triton compiles it differently: a compile failure, remembered
            note_lut_compile_failure(query.device, config, widths, head_dim, err)
    splits = plan_num_splits(batch, num_kv_heads, max_tokens, query.device, config=config)
    check_capacity(workspace, splits)
    tiles = -(-max_tokens // config.tile)
    split_tokens = config.tile * -(-tiles // splits)
    kt, vt = kernel_tables(k_codec, query.device), kernel_tables(v_codec, query.device)
    ieee = query.dtype == torch.float32
    q = query if query.stride(-1) == 1 else query.contiguous()
    q_rot = workspace.q_rot_f32 if ieee else workspace.q_rot_bf16
    _launch_perfield(q, q_rot, k_packed, k_norms, v_packed, v_norms, block_tables, context_lens,
                     kt, vt, workspace, scale, splits, split_tokens, block_size, group, ieee,
                     config)  # fmt: skip
    return merge(workspace, splits, vt.rot_perm, out, config)


def _launch_perfield(
    q, q_rot, k_packed, k_norms, v_packed, v_norms, block_tables, context_lens,
    kt, vt, workspace, scale, splits, split_tokens, block_size, group, ieee, config,
) -> None:  # fmt: skip
    """The split kernel with one dot per packed field (every width); partials in field-major order."""
    batch, num_q_heads, head_dim = q.shape
    num_kv_heads = k_packed.shape[2]
    k_lut, v_lut = _lut_mode(kt, ieee, True, config.lut), _lut_mode(vt, ieee, False, config.lut)
    ktab = kt.codebook if ieee else kt.byte_lut_bf16 if k_lut else kt.codebook_bf16
    vtab = vt.codebook if ieee else vt.byte_lut_bf16 if v_lut else vt.codebook_bf16
    rotate_in_split = config.rotate_in_split and not ieee  # bf16 tensor-core rotation in each split
    pdl = use_pdl(q.device, config)
    if not rotate_in_split:
        rot = kt.rot_t_perm if ieee else kt.rot_t_perm_bf16x3
        rotate_queries(q, rot, q_rot, scale, split16=not ieee, pdl=pdl)
    LAST_COMPILED["split"] = _decode_perfield_kernel[(batch * num_kv_heads, splits)](
        q_rot, q, q.stride(0), q.stride(1), kt.rot_t_perm_bf16x3, scale * LOG2E,
        k_packed, *k_packed.stride(), k_norms, *k_norms.stride(),
        v_packed, *v_packed.stride(), v_norms, *v_norms.stride(),
        ktab, vtab, block_tables, *block_tables.stride(), context_lens,
        workspace.partial_out, workspace.partial_lse,
        num_kv_heads, num_q_heads, group, workspace.capacity, split_tokens,
        BLOCK_SIZE=block_size, D=head_dim, GP=_dot_size(group), TILE=config.tile, IEEE=ieee,
        UPCAST=interpreting(), ROTATE_Q=rotate_in_split,
        K_BITS=kt.bits, K_PG=kt.per_group, K_BPG=kt.bytes_per_group, K_NG=kt.num_groups,
        K_NGP=_dot_size(kt.num_groups), K_LUT=k_lut, K_ASM=_asm(kt, k_lut),
        V_BITS=vt.bits, V_PG=vt.per_group, V_BPG=vt.bytes_per_group, V_NG=vt.num_groups,
        V_NGP=_dot_size(vt.num_groups), V_LUT=v_lut, V_ASM=_asm(vt, v_lut),
        PDL=pdl, k_step=kt.uniform_step or 1.0,
        num_warps=config.num_warps, num_stages=config.num_stages, maxnreg=_register_cap(vt, config),
        **({"launch_pdl": True} if pdl else {}),
    )  # fmt: skip


def _register_cap(value_tables, config: DecodeLaunchConfig) -> int | None:
    """config.maxnreg, except for values of 8 fields per group (1, 3, 5 and 7 bits): their 8 accumulators
    spill under the cap (1.5-2.5x slower on an H200: benchmarks/RESULTS.md), so the compiler chooses."""
    return config.maxnreg if value_tables.per_group <= 4 else None


def _dot_size(n: int) -> int:
    """The smallest tl.dot dimension holding n: a power of two, at least 16 (padded rows or columns are
    masked)."""
    return max(16, next_pow2(n))


def _asm(tables, lut_mode: int) -> str:
    return UNIFORM8_ASM if lut_mode == 3 else tables.prmt_asm


def _lut_mode(tables, ieee: bool, keys: bool, lut: str) -> int:
    """The perfield kernel's lookup mode under config.lut = `lut`: 0: one codebook lookup per index; 1: one
    byte-LUT lookup per byte; 2: 4-bit byte-LUT entries from prmt; 3 (keys): a symmetric uniform 8-bit
    codebook by arithmetic. Modes 2 and 3 are inline PTX, which the interpreter cannot run (it takes mode 0
    or 1, which compute the same centroids)."""
    if ieee or lut == "none":
        return 0
    if tables.bits == 8:
        return 3 if keys and tables.uniform_step is not None and not interpreting() else 0
    if tables.bits not in (2, 4):
        return 0
    if lut == "prmt" and tables.bits == 4 and not interpreting():
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
            "DecodeWorkspace.allocate(query, block_tables, block_size, num_kv_heads, config=config)"
        )
