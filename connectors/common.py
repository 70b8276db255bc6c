"""What both connector sides derive identically from vLLM's configs: the tiercache config and the block
geometry (so the scheduler's capacities and the worker's pools agree without talking to each other).

Provides:
    load_config(vllm_config) -> TierCacheConfig   kv_connector_extra_config {"config": path, inline keys…}
                                                  (its codec: --kv-cache-dtype tiercache_<preset> on
                                                  ≥ 0.33, preset_dtypes.py)
    config_from_extra(extra_config) -> TierCacheConfig   the same from the mapping alone
    primary_requested(vllm_config) -> bool        --attention-backend CUSTOM: tiercache's primary mode
    remote_model_name(vllm_config) -> str         the model's name in the remote tier's keys
    Geometry.from_vllm(vllm_config, kv_cache_config, codec_spec)   layers, KV heads per rank, head_dim,
        block size, dtype, and whether vLLM's cache is primary mode's TurboQuant pages (then the codec must
        be the pages' codec: a different one is a ConfigError naming both). A codec with exact_layers is a
        ConfigError in both modes: the tiers hold one page format for every layer
        .layout(codec_spec) -> BlockLayout   .codec_id(codec_spec) -> str   .page_format(codec_spec)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from tiercache.codecs import KVCodecSpec
from tiercache.config import TierCacheConfig
from tiercache.errors import ConfigError, shown
from tiercache.layout import BlockLayout
from tiercache.pages import PageFormat

from .preset_dtypes import with_cache_dtype

CONFIG_KEY = "config"
CACHE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def load_config(vllm_config) -> TierCacheConfig:
    """The tiercache config of this vLLM config's kv_connector_extra_config (config_from_extra), with the
    codec a tiercache_<preset> --kv-cache-dtype names (vLLM ≥ 0.33; preset_dtypes.py)."""
    config = config_from_extra(vllm_config.kv_transfer_config.kv_connector_extra_config)
    cache = getattr(vllm_config, "cache_config", None)
    return with_cache_dtype(config, getattr(cache, "cache_dtype", "auto"))


def config_from_extra(raw) -> TierCacheConfig:
    """The tiercache config: the file named by extra_config["config"] (else $TIERCACHE_CONFIG, else
    defaults), with every other key of kv_connector_extra_config as an inline override. ConfigError (naming
    kv_connector_extra_config) when that is not a mapping or its "config" is not a path."""
    if raw is not None and not isinstance(raw, Mapping):
        raise ConfigError(
            f"kv_connector_extra_config: got {shown(raw)} ({type(raw).__name__}); expected a mapping such as "
            '{"config": "tiers.yaml", "codec": "k8v4"}'
        )
    extra: dict[str, Any] = dict(raw or {})
    path = extra.pop(CONFIG_KEY, None)
    if path is not None and (not isinstance(path, str | os.PathLike) or not str(path).strip()):
        raise ConfigError(
            f"kv_connector_extra_config.config: got {shown(path)}; expected the path of a tiers YAML file "
            '(e.g. "tiers.yaml"), or leave it out'
        )
    return TierCacheConfig.load(path, extra)


def remote_model_name(vllm_config) -> str:
    """The model's name in the remote tier's keys: vLLM's served model name (the first, when several),
    else the model as given. Engines that share blocks must serve the same weights under the same name."""
    model_config = vllm_config.model_config
    served = getattr(model_config, "served_model_name", None)
    if isinstance(served, list | tuple):
        served = served[0] if served else None
    return str(served or model_config.model)


def primary_requested(vllm_config) -> bool:
    """The user selected tiercache's attention backend (AttentionBackendEnum.CUSTOM): primary mode."""
    backend = getattr(getattr(vllm_config, "attention_config", None), "backend", None)
    return getattr(backend, "name", None) == "CUSTOM"


@dataclass(frozen=True)
class Geometry:
    layer_names: tuple[str, ...]  # vLLM attention layers, in the pools' layer order
    num_kv_heads: int  # per rank
    head_dim: int
    block_size: int
    dtype: torch.dtype  # vLLM's KV cache dtype (what loads write back)
    primary: bool = False  # vLLM's cache holds TurboQuant pages: saves and loads are byte copies

    @classmethod
    def from_vllm(cls, vllm_config, kv_cache_config, codec: KVCodecSpec | None = None) -> Geometry:
        if codec is not None and codec.exact_layers:
            _refuse_exact_layers(codec, primary_requested(vllm_config))
        groups = list(kv_cache_config.kv_cache_groups)
        if len(groups) != 1:
            raise ConfigError(
                f"tiercache: the connector supports models with one KV cache group (plain attention); this "
                f"model has {len(groups)} groups. Use a model without hybrid/sliding-window layers."
            )
        spec = groups[0].kv_cache_spec
        for name in ("num_kv_heads", "head_size", "dtype", "block_size"):
            if not hasattr(spec, name):
                raise ConfigError(f"tiercache: unsupported KV cache spec {type(spec).__name__} (no {name})")
        head_size_v = getattr(spec, "head_size_v", None) or spec.head_size
        if head_size_v != spec.head_size or type(spec).__name__.startswith("MLA"):
            raise ConfigError(f"tiercache: {type(spec).__name__} (MLA / different K and V sizes) unsupported")
        primary = primary_requested(vllm_config)
        if primary:
            _check_pages(spec, codec)
        elif spec.dtype not in CACHE_DTYPES:
            raise ConfigError(
                f"tiercache: KV cache dtype {spec.dtype} unsupported; use kv_cache_dtype=auto "
                "(float16, bfloat16 or float32), or primary mode (--attention-backend CUSTOM)"
            )
        names = tuple(groups[0].layer_names)
        return cls(names, spec.num_kv_heads, spec.head_size, spec.block_size, spec.dtype, primary)

    def page_format(self, spec: KVCodecSpec) -> PageFormat:
        return PageFormat.from_spec(spec, self.num_kv_heads, self.head_dim, self.block_size)

    def layout(self, spec: KVCodecSpec) -> BlockLayout:
        n = len(self.layer_names)
        return BlockLayout.from_spec(
            spec, n, self.num_kv_heads, self.head_dim, self.block_size, self.dtype.itemsize
        )

    def codec_id(self, spec: KVCodecSpec) -> str:
        return spec.codec_id(self.head_dim, self.dtype)


def _refuse_exact_layers(codec: KVCodecSpec, primary: bool) -> None:
    """The tiers' block layout (tiercache.layout) has one page format for all layers: exact layers' pages
    (model dtype) cannot ride next to TurboQuant ones yet."""
    layers = shown(list(codec.exact_layers))  # a few layers, never the whole of a long list
    if primary:
        raise ConfigError(
            f"tiercache: the connector cannot yet store primary-mode caches with codec.exact_layers "
            f"{layers}: those layers' pages hold model-dtype K/V, the others {codec.name} pages, and the "
            "tiers hold one page format for every layer. Drop codec.exact_layers, or serve primary mode "
            "without the connector (no kv_transfer_config)"
        )
    raise ConfigError(
        f"tiercache: codec.exact_layers {layers} keeps layers exact in primary mode (--attention-backend "
        f"CUSTOM); in offload mode (this engine) the connector's tiers encode every layer with {codec.name}. "
        "Drop codec.exact_layers, or serve primary mode without the connector"
    )


def _check_pages(spec, codec: KVCodecSpec | None) -> None:
    """Primary mode: the cache's bytes per token and KV head must be the codec's (vLLM ≥ 0.32 sizes them
    exactly), or hold them (vLLM 0.26's --kv-cache-dtype pages); else a ConfigError naming both."""
    if codec is None:
        raise ConfigError("tiercache: a primary-mode cache needs the connector's codec to check it against")
    need = PageFormat.from_spec(codec, 1, spec.head_size, 16).token_head_bytes
    have = getattr(spec, "state_content_bytes", None)
    exact = have is not None
    if have is None:  # vLLM 0.26: the page of the --kv-cache-dtype
        have = spec.page_size_bytes // (spec.block_size * spec.num_kv_heads)
    if have != need if exact else have < need:
        raise ConfigError(
            f"tiercache: vLLM's primary-mode cache holds {have} bytes per token and KV head, the connector's "
            f"codec {codec.name} needs {need}: the attention backend and the connector must use one codec "
            "(set it once, in kv_connector_extra_config or the tiers YAML both read)"
        )
