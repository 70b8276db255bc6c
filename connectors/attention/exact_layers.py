"""Primary mode's exact layers: which layers of the model keep exact K/V (the codec's `exact_layers`), the
vLLM flags that give those layers model-dtype pages, and the start-up check that the two agree.

vLLM (0.26, 0.32, 0.33) keeps a layer's cache in the model dtype when the layer is in
`--kv-cache-dtype-skip-layers` (CacheConfig.kv_cache_dtype_skip_layers): its Attention layer is then built
with kv_cache_dtype "auto", the others with `--kv-cache-dtype`. That is the only per-layer signal vLLM hands
a backend (the impl's kv_cache_dtype, the spec's dtype and kv_quant_mode; customize_spec sees no layer name),
so the other layers need a one-byte `--kv-cache-dtype` to differ from the exact ones. vLLM then puts all
layers in one KV cache group with a spec per layer (UniformTypeKVCacheSpecs): each layer its own page size.

Provides:
    resolve(vllm_config, config) -> tuple[int, ...]   this model's exact layers (0-based, sorted) once vLLM's
                                   flags are checked against the config: a ConfigError names both and the
                                   flags to pass
    cache_args(spec, num_layers, head_size, model_dtype) -> dict
                                   {kv_cache_dtype, kv_cache_dtype_skip_layers} for LLM(...) / `vllm serve`
                                   on this vLLM: what resolve() accepts (a ConfigError naming the version
                                   where this vLLM has no skip flag)
    skips_layers() -> bool         this vLLM has --kv-cache-dtype-skip-layers
    is_exact_spec(spec) -> bool    a layer's KV cache spec is a skipped (exact) layer's: no quantization,
                                   a float dtype
    MARKER_DTYPE                   the --kv-cache-dtype of the packed layers on vLLM 0.32 (and on 0.33 for a
                                   codec that is no preset) when some layers are exact (the backend sizes the
                                   pages; the name only marks the layers)
"""

from __future__ import annotations

import torch

from tiercache.codecs import KVCodecSpec
from tiercache.errors import ConfigError, clipped, shown

from ..preset_dtypes import PRESET_DTYPES, preset_dtype, registers_dtypes
from .cache_dtypes import ONE_BYTE, fitting_dtype, sizes_pages

MARKER_DTYPE = "int4_per_token_head"


def resolve(vllm_config, config) -> tuple[int, ...]:
    """The exact layers of the model vLLM builds, after checking that vLLM skips exactly those layers and
    gives the others a one-byte cache dtype."""
    model = vllm_config.model_config
    num_layers = model.hf_text_config.num_hidden_layers
    try:
        exact = config.codec.exact_layer_indices(num_layers)
    except ValueError as exc:
        raise ConfigError(f"{exc} ({config.source})") from None
    cache = vllm_config.cache_config
    skipped = getattr(cache, "kv_cache_dtype_skip_layers", None)
    if skipped is None:
        if exact:
            raise ConfigError(
                f"tiercache primary mode: codec.exact_layers ({config.source}) needs vLLM's "
                "--kv-cache-dtype-skip-layers (vLLM >= 0.26); upgrade vLLM or drop codec.exact_layers"
            )
        return exact
    wanted = cache_args(config.codec, num_layers, model.get_head_size(), model.dtype)
    flags = _flags(wanted["kv_cache_dtype"], wanted["kv_cache_dtype_skip_layers"])
    if set(_indices(skipped)) != {str(i) for i in exact}:
        named = f"codec.exact_layers {shown(list(config.codec.exact_layers), 100)} ({config.source})"
        named += f" is layers {shown(list(exact), 100)}"
        vllm_skips = shown(list(skipped), 100)
        raise ConfigError(
            f"tiercache primary mode: {named} of this {num_layers}-layer model, but vLLM's "
            f"--kv-cache-dtype-skip-layers is {vllm_skips}; vLLM gives exact pages only to the layers it "
            + (f"skips. Start vLLM with {flags}" if exact else "skips: drop the flag, or list its layers in "
               "codec.exact_layers")
        )  # fmt: skip
    if exact and cache.cache_dtype not in (*ONE_BYTE, *PRESET_DTYPES):
        raise ConfigError(
            f"tiercache primary mode: codec.exact_layers ({config.source}) with --kv-cache-dtype "
            f"{cache.cache_dtype}: the packed layers need a one-byte cache dtype so that vLLM tells them "
            f"from the exact ones. Start vLLM with {flags}"
        )
    return exact


def cache_args(spec: KVCodecSpec, num_layers: int, head_size: int, model_dtype: torch.dtype) -> dict:
    """The vLLM cache arguments primary mode needs on this vLLM for `spec`: the packed layers' dtype (vLLM
    0.26: the smallest page that holds the codec; >= 0.33: tiercache_<preset> where the codec is a preset;
    >= 0.32: "auto", or MARKER_DTYPE when some layers are exact) and the exact layers as vLLM's skip
    list."""
    exact = spec.exact_layer_indices(num_layers)
    if exact and not skips_layers():
        raise ConfigError(
            "tiercache primary mode: codec.exact_layers needs vLLM's --kv-cache-dtype-skip-layers "
            "(vLLM >= 0.26), which this vLLM lacks; upgrade vLLM or drop codec.exact_layers"
        )
    if not sizes_pages():
        dtype = fitting_dtype(spec, head_size, model_dtype)
    elif registers_dtypes() and preset_dtype(spec):
        dtype = preset_dtype(spec)
    else:
        dtype = MARKER_DTYPE if exact else "auto"
    return {"kv_cache_dtype": dtype, "kv_cache_dtype_skip_layers": [str(i) for i in exact]}


def _flags(dtype: str, skip: list[str]) -> str:
    """The vLLM flags (and LLM(...) arguments) that give these layers exact pages, for a message: the layer
    list cut short where a model has very many exact layers."""
    layers = clipped(" ".join(skip), 160)
    return (
        f"--kv-cache-dtype {dtype} --kv-cache-dtype-skip-layers {layers} (LLM(...): kv_cache_dtype="
        f"{dtype!r}, kv_cache_dtype_skip_layers={shown(skip, 160)})"
    )


def skips_layers() -> bool:
    """This vLLM has CacheConfig.kv_cache_dtype_skip_layers (0.26, 0.32, 0.33 do)."""
    from vllm.config import CacheConfig

    return "kv_cache_dtype_skip_layers" in getattr(CacheConfig, "__dataclass_fields__", {})


def is_exact_spec(spec) -> bool:
    """A layer's spec as vLLM builds it for a skipped layer: no KV quantization, the model's float dtype."""
    mode = getattr(spec, "kv_quant_mode", None)
    return getattr(mode, "name", "NONE") == "NONE" and spec.dtype.is_floating_point


def _indices(skipped) -> list[str]:
    """vLLM's skip entries (it matches them as text against each layer's index): layer indices only."""
    for entry in skipped:
        if not str(entry).isdigit():
            raise ConfigError(
                f"tiercache primary mode: vLLM's --kv-cache-dtype-skip-layers has {shown(entry, 60)}; "
                "primary mode takes layer indices (0, 1, …) only there, the layers of codec.exact_layers"
            )
    return [str(entry) for entry in skipped]
