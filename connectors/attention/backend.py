"""Primary mode's attention backends: what vLLM asks a backend class, answered for TurboQuant pages.

Provides:
    TierCacheAttentionBackend      registered as AttentionBackendEnum.CUSTOM (GPUs: --attention-backend
                                   CUSTOM)
    TierCacheCPUAttentionBackend   registered over CPU_ATTN (the CPU platform always asks for CPU_ATTN): it is
                                   vLLM's CPU attention unless CUSTOM was selected, then primary mode
    page_spec(spec) -> spec        the layer's KV cache spec with TurboQuant pages: uint8, token_head_bytes
                                   per (token, KV head) (136 for K4V4 at d128, 200 for K8V4); an exact layer's
                                   spec (codec.exact_layers: vLLM built it with kv_cache_dtype "auto") as is,
                                   vLLM's dense model-dtype page

vLLM builds a layer's impl (get_impl_cls, under its current config: where the process decides, see
selection.py), then its spec (customize_spec), then the builder (get_builder_cls). vLLM ≥ 0.32 sizes the
pages through customize_spec; vLLM 0.26 has no such hook: its page is what --kv-cache-dtype gives
(int4_per_token_head: exactly K4V4's 136 B at d128; fp8: 256 B, enough for K8V4's 200), and the backend
shapes it with get_kv_cache_shape / get_kv_cache_stride_order as [NB, H, BS, C] with blocks outermost.
Exact layers (connectors/attention/exact_layers.py) keep vLLM's dense page on every version: [NB, H, BS, 2·D]
in the model dtype (0.26: get_kv_cache_shape with cache_dtype_str "auto").
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

import torch
from vllm.config import get_current_vllm_config_or_none
from vllm.v1.attention.backend import AttentionBackend, MultipleOf
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

from tiercache.errors import ConfigError
from tiercache.kernels import SUPPORTED_HEAD_DIMS
from tiercache.pages import PageFormat

from .cache_dtypes import LEGACY_CACHE_DTYPES, legacy_page, sizes_pages, supported_cache_dtypes
from .exact_layers import is_exact_spec
from .impl import PrimaryAttentionImpl
from .metadata import PrimaryMetadataBuilder
from .selection import Decision, current, decide


def page_spec(spec, decision: Decision):
    """customize_spec for primary mode: pages of the configured codec (uint8 bytes vLLM never reads), or an
    exact layer's dense page."""
    if decision.exact_layers and is_exact_spec(spec):
        return spec
    fmt = PageFormat.from_spec(decision.config.codec, spec.num_kv_heads, spec.head_size, spec.block_size)
    return replace(spec, dtype=torch.uint8, state_content_bytes=fmt.token_head_bytes)


def _decide_here() -> Decision:
    """Decide for the model vLLM is building (its current config); no config in scope: not primary."""
    vllm_config = get_current_vllm_config_or_none()
    return Decision(False) if vllm_config is None else decide(vllm_config)


def _decision() -> Decision:
    """This process's decision; where none was taken yet (vLLM ≥ 0.32 sizing pages in the engine process
    before any layer is built, e.g. Platform._align_heterogeneous_kv_block_size), decide now."""
    return current() or _decide_here()


class TierCacheAttentionBackend(AttentionBackend):
    forward_includes_kv_cache_update: bool = False  # do_kv_cache_update writes the pages
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[str]] = list(
        supported_cache_dtypes() if sizes_pages() else LEGACY_CACHE_DTYPES
    )

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"

    @staticmethod
    def get_impl_cls() -> type[PrimaryAttentionImpl]:
        if not _decide_here().primary:  # CUSTOM is tiercache's: selecting it selects primary mode
            raise ConfigError(
                "tiercache: TierCacheAttentionBackend runs only with --attention-backend CUSTOM"
            )
        return PrimaryAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[PrimaryMetadataBuilder]:
        return PrimaryMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        return [MultipleOf(16)]

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return list(SUPPORTED_HEAD_DIMS)

    @classmethod
    def customize_spec(cls, spec):
        return page_spec(spec, _decision())

    @staticmethod
    def get_kv_cache_shape(
        num_blocks: int, block_size: int, num_kv_heads: int, head_size: int, cache_dtype_str: str = "auto"
    ) -> tuple[int, ...]:
        """vLLM 0.26: the page --kv-cache-dtype sized, as [NB, H, BS, elements per token and head]."""
        elements, _ = legacy_page(cache_dtype_str, head_size, current().model_dtype)
        return (num_blocks, num_kv_heads, block_size, elements)

    @staticmethod
    def get_kv_cache_stride_order(include_num_layers_dimension: bool = False) -> tuple[int, ...]:
        """vLLM 0.26: physically [NB, BS, H, C] ([L, NB, BS, H, C] with layers): a block is one dense page."""
        return (0, 1, 3, 2, 4) if include_num_layers_dimension else (0, 2, 1, 3)


class TierCacheCPUAttentionBackend(CPUAttentionBackend):
    """vLLM's CPU attention, or primary mode where the user selected CUSTOM (decided per model build)."""

    @staticmethod
    def get_impl_cls():
        return PrimaryAttentionImpl if _decide_here().primary else CPUAttentionBackend.get_impl_cls()

    @staticmethod
    def get_builder_cls():
        decision = current()
        return (
            PrimaryMetadataBuilder if decision and decision.primary else CPUAttentionBackend.get_builder_cls()
        )

    @classmethod
    def customize_spec(cls, spec):
        decision = _decision()
        return page_spec(spec, decision) if decision.primary else super().customize_spec(spec)
