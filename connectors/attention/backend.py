"""Primary mode's attention backends: what vLLM asks a backend class, answered for TurboQuant pages.

Provides:
    TierCacheAttentionBackend      registered as AttentionBackendEnum.CUSTOM (GPUs: --attention-backend
                                   CUSTOM)
    TierCacheCPUAttentionBackend   registered over CPU_ATTN (the CPU platform always asks for CPU_ATTN): it is
                                   vLLM's CPU attention unless CUSTOM was selected, then primary mode
    page_spec(spec) -> spec        the layer's KV cache spec with TurboQuant pages: uint8, token_head_bytes
                                   per (token, KV head) (136 for K4V4 at d128, 200 for K8V4)

vLLM builds a layer's impl (get_impl_cls, under its current config: where the process decides, see
selection.py), then its spec (customize_spec), then the builder (get_builder_cls). Needs vLLM ≥ 0.32.
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

from .impl import PrimaryAttentionImpl
from .metadata import PrimaryMetadataBuilder
from .selection import Decision, current, decide


def page_spec(spec):
    """customize_spec for primary mode: pages of the configured codec (uint8 bytes vLLM never reads)."""
    decision = current()
    fmt = PageFormat.from_spec(decision.config.codec, spec.num_kv_heads, spec.head_size, spec.block_size)
    return replace(spec, dtype=torch.uint8, state_content_bytes=fmt.token_head_bytes)


def _decide_here() -> Decision:
    """Decide for the model vLLM is building (its current config); no config in scope: not primary."""
    vllm_config = get_current_vllm_config_or_none()
    return Decision(False) if vllm_config is None else decide(vllm_config)


class TierCacheAttentionBackend(AttentionBackend):
    forward_includes_kv_cache_update: bool = False  # do_kv_cache_update writes the pages
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto"]

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
        return page_spec(spec)


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
        decision = current()
        return page_spec(spec) if decision and decision.primary else super().customize_spec(spec)
