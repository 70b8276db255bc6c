"""Primary mode's attention layer implementation: writes new tokens into the TurboQuant pages and attends
over them (tiercache.worker.paged_attention), on vLLM's tensors.

Provides:
    PrimaryAttentionImpl(num_heads, head_size, scale, num_kv_heads, alibi_slopes, sliding_window,
                         kv_cache_dtype, logits_soft_cap=None, attn_type="decoder", …)
        do_kv_cache_update(layer, key, value, kv_cache, slot_mapping)   before forward, every step
        forward(layer, query, key, value, kv_cache, attn_metadata, output, …) -> output

kv_cache: the layer's view vLLM hands the backend, [num_blocks, H, block_size, token_head_bytes] uint8 in
any layout whose blocks are contiguous (the backend's customize_spec sized it). query/output [T, Hq, D] (T
padded); key/value [T, H, D] (strided views of the fused projection are fine).
An exact layer (codec.exact_layers; vLLM builds it with kv_cache_dtype "auto" while the others have a one-byte
dtype, connectors/attention/exact_layers.py) gets vLLM's dense page, [num_blocks, H, block_size, 2·D] in the
model dtype, and is served by tiercache.worker.exact_attention: the same metadata, no quantization.
"""

from __future__ import annotations

import functools
import logging

import torch
from vllm.v1.attention.backend import AttentionImpl, AttentionType

from tiercache.pages import PageFormat, as_pages
from tiercache.worker.exact_attention import ExactPagedAttention
from tiercache.worker.paged_attention import PagedAttention

from .cache_dtypes import check_fit, sizes_pages
from .metadata import PrimaryMetadata
from .selection import current

_LOG = logging.getLogger(__name__)


class PrimaryAttentionImpl(AttentionImpl[PrimaryMetadata]):
    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int | None = None,
        alibi_slopes: list[float] | None = None,
        sliding_window: int | None = None,
        kv_cache_dtype: str = "auto",
        logits_soft_cap: float | None = None,
        attn_type: str = AttentionType.DECODER,
        kv_sharing_target_layer_name: str | None = None,
        **unsupported,
    ) -> None:
        _refuse(alibi_slopes=alibi_slopes, sliding_window=sliding_window, logits_soft_cap=logits_soft_cap,
                kv_sharing_target_layer_name=kv_sharing_target_layer_name,
                **{k: v for k, v in unsupported.items() if v is not None})  # fmt: skip
        if attn_type != AttentionType.DECODER:
            raise NotImplementedError(
                f"tiercache primary mode serves decoder attention only, not {attn_type}"
            )
        decision = current()
        assert decision is not None and decision.primary, "the backend decides before building layers"
        self.num_heads, self.head_size, self.scale = num_heads, head_size, float(scale)
        self.num_kv_heads = num_kv_heads or num_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.attn_type = attn_type
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self.spec = decision.config.codec
        # vLLM gives the layers it skips (exact_layers.resolve checked they are the exact ones) dtype "auto"
        self.exact = bool(decision.exact_layers) and kv_cache_dtype == "auto"
        self._exact = ExactPagedAttention(num_heads, self.num_kv_heads, head_size, self.scale)
        if not sizes_pages() and not self.exact:  # vLLM 0.26: the page is what --kv-cache-dtype gives
            check_fit(self.spec, kv_cache_dtype, head_size, decision.model_dtype)
        self.codec = None if self.exact else _codec(self.spec, head_size, decision.model_dtype)
        if self.codec is not None and torch.cuda.is_available():
            _note_decode_speed(self.spec, head_size, self.num_kv_heads, torch.cuda.get_device_capability())
        self._attention: PagedAttention | None = None  # built at the first call: the block size is known then

    def attention(self, block_size: int) -> PagedAttention:
        if self._attention is None or self._attention.format.block_size != block_size:
            fmt = PageFormat.from_spec(self.spec, self.num_kv_heads, self.head_size, block_size)
            self._attention = PagedAttention(
                fmt, self.codec.keys, self.codec.values, self.num_heads, self.scale
            )
        return self._attention

    def layer_attention(self, kv_cache: torch.Tensor):
        """(attention, the cache as it reads it): exact pages as they are, TurboQuant pages as byte rows."""
        if self.exact:
            return self._exact, kv_cache
        attention = self.attention(kv_cache.shape[2])
        return attention, as_pages(kv_cache, attention.format.page_bytes)

    def do_kv_cache_update(
        self, layer, key, value, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
    ) -> None:
        attention, pages = self.layer_attention(kv_cache)
        n = slot_mapping.shape[0]
        attention.write(pages, key[:n], value[:n], slot_mapping)

    def forward(
        self,
        layer,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: PrimaryMetadata | None,
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("tiercache primary mode does not fuse output quantization")
        if attn_metadata is None:  # profiling and warm-up runs
            return output
        m = attn_metadata
        attention, pages = self.layer_attention(kv_cache)
        q = query.view(-1, self.num_heads, self.head_size)
        out = output.view(-1, self.num_heads, self.head_size)
        flash = query.is_cuda and query.dtype in (torch.float16, torch.bfloat16)
        varlen = _flash_varlen(self.head_size) if flash else None  # else SDPA per sequence
        nd = m.num_decodes
        if nd and self.exact:
            attention.decode(pages, q[:nd], m.block_table[:nd], m.decode_seq_lens, out[:nd], varlen=varlen,
                             query_start_loc=m.query_start_loc[: nd + 1])  # fmt: skip
        elif nd:
            attention.decode(pages, q[:nd], m.block_table[:nd], m.decode_seq_lens, out[:nd])
        if nd < m.seq_lens.shape[0]:
            starts = m.query_start_loc_cpu[nd:] - m.query_start_loc_cpu[nd]
            attention.prefill(
                pages, q[nd : m.num_tokens], starts, m.seq_lens_cpu[nd:], m.block_table[nd:],
                out[nd : m.num_tokens], varlen=varlen, seq_lens_device=m.seq_lens[nd:],
                query_start_loc_device=m.query_start_loc[nd:] - m.query_start_loc[nd],
            )  # fmt: skip
        return output


@functools.cache
def _flash_varlen(head_size: int):
    """vLLM's FlashAttention varlen over paged K/V (CUDA builds of vLLM), as a PagedAttention `varlen`."""
    from vllm.v1.attention.backends.fa_utils import flash_attn_varlen_func, get_flash_attn_version

    version = get_flash_attn_version(head_size=head_size)

    def varlen(q, k, v, out, cu_seqlens_q, max_seqlen_q, seqused_k, max_seqlen_k, block_table, scale):
        flash_attn_varlen_func(
            q=q, k=k, v=v, out=out, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q,
            seqused_k=seqused_k, max_seqlen_k=max_seqlen_k, softmax_scale=scale, causal=True,
            block_table=block_table, fa_version=version,
        )  # fmt: skip

    return varlen


@functools.cache
def _note_decode_speed(spec, head_size: int, num_kv_heads: int, capability: tuple[int, int]) -> None:
    """One warning per codec, model shape and device kind where decode runs on the Triton split kernel
    (measured 2–35× slower per byte read than the Gluon kernel's K4V4 on an H200: benchmarks/RESULTS.md,
    issue 35): head_dims other than 128 and 64, odd widths at 64 with an odd number of KV heads, and widths
    off the Gluon kernel's native ones before Hopper."""
    from tiercache.kernels import DecodeLaunchConfig
    from tiercache.kernels.decode_lut import NATIVE_WIDTHS, lut_takes_pages

    widths = (spec.key_bits, spec.value_bits)
    taken = lut_takes_pages(*widths, head_size, num_kv_heads, DecodeLaunchConfig())
    if not taken or (widths not in NATIVE_WIDTHS and capability < (9, 0)):
        _LOG.warning(
            "tiercache primary mode: codec %s (K%dV%d, head_dim %d) decodes on the Triton split kernel on "
            "this GPU (sm_%d%d, %d KV heads), measured 2-35x slower per byte read than K4V4 on an H200; the "
            "fast decode kernel serves K4V4, K8V4, K4V8 and K8V8 at head_dim 128 and 64, and on sm_90+ keys "
            "and values of 1-8 bits (at head_dim 64 odd widths where KV heads x bits is even)",
            spec.name, *widths, head_size, *capability, num_kv_heads,
        )  # fmt: skip


@functools.cache
def _codec(spec, head_size: int, dtype: torch.dtype):
    """One built codec per (spec, head size) for all layers: its rotation and tables are built once."""
    return spec.build(head_size, dtype)


def _refuse(**features) -> None:
    used = {name: value for name, value in features.items() if value}
    if used:
        raise NotImplementedError(
            f"tiercache primary mode does not support {', '.join(used)} (got {used}); serve this model with "
            "vLLM's own attention (no --attention-backend CUSTOM) and the connector in offload mode"
        )
