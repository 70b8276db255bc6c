"""vLLM ≥ 0.33's --kv-cache-dtype names for the codec presets: `--kv-cache-dtype tiercache_balanced` (any
preset but `none`) chooses primary mode's codec on the command line. A YAML codec with other widths is a
ConfigError naming both, unless it is the default preset (k8v4), which the flag overrides; the YAML's seed,
rotation and exact_layers are kept.

Provides:
    PRESET_DTYPES                        the names: tiercache_<preset>
    registers_dtypes() -> bool           this vLLM takes new --kv-cache-dtype names (≥ 0.33's
                                         register_kv_cache_dtype)
    register_preset_dtypes()             registers PRESET_DTYPES with vLLM (the plugin, in every process)
    preset_dtype(spec) -> str | None     the registered name of a codec's preset (None: not a preset)
    with_cache_dtype(config, cache_dtype) -> TierCacheConfig   the codec a tiercache_<preset> dtype names
"""

from __future__ import annotations

from dataclasses import replace

import torch

from tiercache.codecs import PRESETS, KVCodecSpec
from tiercache.config_values import DEFAULT_CODEC
from tiercache.errors import ConfigError, shown

DTYPE_PREFIX = "tiercache_"
PRESET_DTYPES = tuple(DTYPE_PREFIX + name for name, bits in PRESETS.items() if bits != (None, None))


def registers_dtypes() -> bool:
    import vllm.config.cache as cache

    return hasattr(cache, "register_kv_cache_dtype")


def register_preset_dtypes() -> None:
    """Register PRESET_DTYPES with vLLM (>= 0.33; a no-op before): uint8 pages that the backend sizes and
    attends itself (KVQuantMode.CUSTOM: no generic kernel path). 0.33 gives CUSTOM OCTAVE_K3V4's value, so
    the specs report is_octave, which only ROCm's octave backend reads; any quantized mode also makes vLLM's
    fp8 scale loader warn that the checkpoint has no KV scales."""
    if not registers_dtypes():
        return
    from vllm.config.cache import get_kv_cache_dtype_handler, register_kv_cache_dtype
    from vllm.v1.kv_cache_interface import KVQuantMode

    class PresetDtype:
        name = ""

        def torch_dtype(self) -> torch.dtype:
            return torch.uint8

        def quant_mode(self) -> KVQuantMode:
            return KVQuantMode.CUSTOM

    for name in PRESET_DTYPES:
        if get_kv_cache_dtype_handler(name) is None:
            register_kv_cache_dtype(name)(type(name, (PresetDtype,), {"name": name}))


def preset_dtype(spec: KVCodecSpec) -> str | None:
    """tiercache_<preset> for a codec that is a lossy preset (exact_layers aside), else None."""
    name = DTYPE_PREFIX + spec.name
    return name if name in PRESET_DTYPES else None


def with_cache_dtype(config, cache_dtype: str):
    """`config` with the codec a tiercache_<preset> --kv-cache-dtype names (other dtypes: `config` as is).
    The YAML's codec stays where its widths and codebooks are the preset's; a default codec (DEFAULT_CODEC)
    gives way to the flag, keeping its seed, rotation and exact_layers; any other is a ConfigError."""
    if not isinstance(cache_dtype, str) or not cache_dtype.startswith(DTYPE_PREFIX):
        return config
    if cache_dtype not in PRESET_DTYPES:
        raise ConfigError(
            f"--kv-cache-dtype {shown(cache_dtype, 60)}: tiercache's names are {', '.join(PRESET_DTYPES)}; "
            "for other widths keep --kv-cache-dtype auto and set codec: {keys: K, values: V} in the "
            "tiercache YAML"
        )
    preset = KVCodecSpec.from_preset(cache_dtype.removeprefix(DTYPE_PREFIX))
    codec = config.codec
    if _same_pages(codec, preset):
        return config
    if codec.name != DEFAULT_CODEC:
        raise ConfigError(
            f"--kv-cache-dtype {cache_dtype} names codec {preset.name}, but the tiercache config "
            f"({config.source}) sets codec {codec.name}: drop one of them, or make them agree"
        )
    codec = replace(preset, seed=codec.seed, rotation=codec.rotation, exact_layers=codec.exact_layers)
    return replace(config, codec=codec)


def _same_pages(a: KVCodecSpec, b: KVCodecSpec) -> bool:
    return (a.key_bits, a.value_bits, a.key_codebook, a.value_codebook) == (
        b.key_bits, b.value_bits, b.key_codebook, b.value_codebook
    )  # fmt: skip
