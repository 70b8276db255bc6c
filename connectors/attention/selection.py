"""Whether this process serves primary mode, and with which codec.

Provides:
    decide(vllm_config) -> Decision      decide for this process's model (called where vLLM builds the
                                         attention layers, under its current config) and remember it
    tiercache_config(vllm_config)        the connector's config when it is on, else $TIERCACHE_CONFIG
    current() -> Decision | None         the last decision of this process: the backend's class methods that
                                         vLLM calls later without a config (customize_spec, get_builder_cls)
    Decision(primary, config, model_dtype)
    sizes_pages() -> bool                this vLLM sizes the pages through customize_spec (≥ 0.32); older
                                         releases take the page size from --kv-cache-dtype (legacy_page)
    legacy_page(cache_dtype, head_size, model_dtype) -> (elements, bytes) per token and KV head on vLLM 0.26
    check_fit(spec, cache_dtype, head_size, model_dtype)   ConfigError naming a --kv-cache-dtype that fits

One process serves one model at a time (vLLM builds its layers, then its specs and builders, in that order),
so the last decision is the one in force; a later engine in the same process decides again.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tiercache.config import TierCacheConfig
from tiercache.errors import ConfigError

from ..common import load_config, primary_requested
from ..plugin import NAME as CONNECTOR_NAME


@dataclass(frozen=True)
class Decision:
    primary: bool
    config: TierCacheConfig | None = None  # the tiercache config (its codec), when primary
    model_dtype: torch.dtype | None = None


_current: Decision | None = None


def decide(vllm_config) -> Decision:
    global _current
    if not primary_requested(vllm_config):
        _current = Decision(False)
    else:
        config = tiercache_config(vllm_config)
        _current = Decision(True, config, vllm_config.model_config.dtype)
    return _current


def tiercache_config(vllm_config) -> TierCacheConfig:
    """The connector's config (kv_connector_extra_config) when the tiercache connector is on, so both read
    one codec; else $TIERCACHE_CONFIG, else the defaults."""
    transfer = getattr(vllm_config, "kv_transfer_config", None)
    if transfer is not None and getattr(transfer, "kv_connector", None) == CONNECTOR_NAME:
        return load_config(vllm_config)
    return TierCacheConfig.load()


def current() -> Decision | None:
    return _current


def sizes_pages() -> bool:
    from vllm.v1.attention.backend import AttentionBackend

    return hasattr(AttentionBackend, "customize_spec")


# vLLM 0.26: elements per (token, KV head) of the cache tensor that a --kv-cache-dtype name gives (its
# per-token-head modes add two float32 scales' room), in bytes of 1 for the quantized names
_LEGACY_ELEMENTS = {"int4_per_token_head": lambda d: d + 8, "int8_per_token_head": lambda d: 2 * d + 8,
                    "fp8_per_token_head": lambda d: 2 * d + 8}  # fmt: skip
_ONE_BYTE = (
    "int4_per_token_head",
    "int8_per_token_head",
    "fp8_per_token_head",
    "fp8",
    "fp8_e4m3",
    "fp8_e5m2",
)
LEGACY_CACHE_DTYPES = ("auto", "bfloat16", "float16", *_ONE_BYTE)


def legacy_page(cache_dtype: str, head_size: int, model_dtype: torch.dtype) -> tuple[int, int]:
    """(elements, bytes) per token and KV head of vLLM 0.26's cache for this --kv-cache-dtype."""
    if cache_dtype not in LEGACY_CACHE_DTYPES:
        raise ConfigError(
            f"tiercache primary mode on this vLLM takes --kv-cache-dtype from "
            f"{', '.join(LEGACY_CACHE_DTYPES)}; got {cache_dtype!r}"
        )
    elements = _LEGACY_ELEMENTS.get(cache_dtype, lambda d: 2 * d)(head_size)
    itemsize = (
        1
        if cache_dtype in _ONE_BYTE
        else {"bfloat16": 2, "float16": 2}.get(cache_dtype, model_dtype.itemsize)
    )
    return elements, elements * itemsize


def check_fit(spec, cache_dtype: str, head_size: int, model_dtype: torch.dtype) -> None:
    """vLLM 0.26: the codec's bytes per token and head must fit the page --kv-cache-dtype gives."""
    from tiercache.pages import PageFormat

    need = PageFormat.from_spec(spec, 1, head_size, 16).token_head_bytes
    have = legacy_page(cache_dtype, head_size, model_dtype)[1]
    if need > have:
        fits = [n for n in _ONE_BYTE if legacy_page(n, head_size, model_dtype)[1] >= need]
        best = min(fits, key=lambda n: legacy_page(n, head_size, model_dtype)[1]) if fits else "auto"
        raise ConfigError(
            f"tiercache primary mode: codec {spec.name} needs {need} bytes per token and KV head at "
            f"head_dim {head_size}; --kv-cache-dtype {cache_dtype} gives {have}. Use --kv-cache-dtype {best} "
            "(this vLLM takes the page size from the dtype name; vLLM ≥ 0.32 sizes pages exactly)"
        )
