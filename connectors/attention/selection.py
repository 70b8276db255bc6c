"""Whether this process serves primary mode, and with which codec.

Provides:
    decide(vllm_config) -> Decision      decide for this process's model (called where vLLM builds the
                                         attention layers, under its current config) and remember it
    tiercache_config(vllm_config)        the connector's config when it is on, else $TIERCACHE_CONFIG
    current() -> Decision | None         the last decision of this process: the backend's class methods that
                                         vLLM calls later without a config (customize_spec, get_builder_cls)
    Decision(primary, config, model_dtype, exact_layers)   exact_layers: the model's layers kept exact
                                         (exact_layers.resolve: checked against vLLM's skip flags)
What each vLLM's --kv-cache-dtype gives primary mode is in cache_dtypes.py.

One process serves one model at a time (vLLM builds its layers, then its specs and builders, in that order),
so the last decision is the one in force; a later engine in the same process decides again.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tiercache.config import TierCacheConfig

from ..common import load_config, primary_requested
from ..plugin import NAME as CONNECTOR_NAME
from ..preset_dtypes import with_cache_dtype
from .exact_layers import resolve


@dataclass(frozen=True)
class Decision:
    primary: bool
    config: TierCacheConfig | None = None  # the tiercache config (its codec), when primary
    model_dtype: torch.dtype | None = None
    exact_layers: tuple[int, ...] = ()  # 0-based layers whose pages hold exact K/V in the model dtype


_current: Decision | None = None


def decide(vllm_config) -> Decision:
    global _current
    if not primary_requested(vllm_config):
        _current = Decision(False)
    else:
        config = tiercache_config(vllm_config)
        exact = resolve(vllm_config, config)
        _current = Decision(True, config, vllm_config.model_config.dtype, exact)
    return _current


def tiercache_config(vllm_config) -> TierCacheConfig:
    """The connector's config (kv_connector_extra_config) when the tiercache connector is on, so both read
    one codec; else $TIERCACHE_CONFIG, else the defaults; either with the codec a tiercache_<preset>
    --kv-cache-dtype names (preset_dtypes.with_cache_dtype)."""
    transfer = getattr(vllm_config, "kv_transfer_config", None)
    if transfer is not None and getattr(transfer, "kv_connector", None) == CONNECTOR_NAME:
        return load_config(vllm_config)
    return with_cache_dtype(TierCacheConfig.load(), vllm_config.cache_config.cache_dtype)


def current() -> Decision | None:
    return _current
