"""Whether this process serves primary mode, and with which codec.

Provides:
    requested(vllm_config) -> bool      the user selected the CUSTOM attention backend (tiercache's)
    decide(vllm_config) -> Decision      decide for this process's model (called where vLLM builds the
                                         attention layers, under its current config) and remember it
    tiercache_config(vllm_config)        the connector's config when it is on, else $TIERCACHE_CONFIG
    current() -> Decision | None         the last decision of this process: the backend's class methods that
                                         vLLM calls later without a config (customize_spec, get_builder_cls)
    Decision(primary, config, model_dtype)
    require_customize_spec()             ConfigError naming the vLLM version needed, where it is missing

One process serves one model at a time (vLLM builds its layers, then its specs and builders, in that order),
so the last decision is the one in force; a later engine in the same process decides again.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tiercache.config import TierCacheConfig
from tiercache.errors import ConfigError

from ..common import load_config
from ..plugin import NAME as CONNECTOR_NAME


@dataclass(frozen=True)
class Decision:
    primary: bool
    config: TierCacheConfig | None = None  # the tiercache config (its codec), when primary
    model_dtype: torch.dtype | None = None


_current: Decision | None = None


def requested(vllm_config) -> bool:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    attention = getattr(vllm_config, "attention_config", None)
    return getattr(attention, "backend", None) == AttentionBackendEnum.CUSTOM


def decide(vllm_config) -> Decision:
    global _current
    if not requested(vllm_config):
        _current = Decision(False)
    else:
        require_customize_spec()
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


def require_customize_spec() -> None:
    from vllm.v1.attention.backend import AttentionBackend

    if not hasattr(AttentionBackend, "customize_spec"):
        import vllm

        raise ConfigError(
            f"tiercache primary mode needs vLLM ≥ 0.32 (AttentionBackend.customize_spec sizes the TurboQuant "
            f"pages); this is vLLM {vllm.__version__}. Upgrade vLLM, or use offload mode (the connector)"
        )
