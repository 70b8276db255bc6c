"""What each vLLM release's --kv-cache-dtype gives primary mode, and what the backend declares there.

Provides:
    sizes_pages() -> bool                this vLLM sizes the pages through customize_spec (≥ 0.32); older
                                         releases take the page size from --kv-cache-dtype (legacy_page)
    legacy_page(cache_dtype, head_size, model_dtype) -> (elements, bytes) per token and KV head on vLLM 0.26
    check_fit(spec, cache_dtype, head_size, model_dtype)   ConfigError naming a --kv-cache-dtype that fits
    fitting_dtype(spec, head_size, model_dtype) -> str     vLLM 0.26: the smallest one-byte page that fits
    ONE_BYTE                             the one-byte dtype names (packed layers next to exact ones use one)
    LEGACY_CACHE_DTYPES, supported_cache_dtypes()   what the backend declares on vLLM 0.26 / ≥ 0.32
    registers_dtypes() -> bool           this vLLM takes new --kv-cache-dtype names (≥ 0.33's
                                         register_kv_cache_dtype)
    register_preset_dtypes()             registers tiercache_<preset> for every lossy preset (idempotent)
    preset_dtype(spec) -> str | None     the registered name of a codec's preset (None: not a preset)
    with_cache_dtype(config, cache_dtype) -> TierCacheConfig   the codec a tiercache_<preset> dtype names

vLLM ≥ 0.33: `--kv-cache-dtype tiercache_balanced` (any preset but `none`) chooses the codec on the command
line. A YAML codec with other widths is a ConfigError naming both, unless it is the default preset (k8v4),
which the flag overrides; the YAML's seed, rotation and exact_layers are kept.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from tiercache.codecs import PRESETS, KVCodecSpec
from tiercache.config_values import DEFAULT_CODEC
from tiercache.errors import ConfigError, shown


def sizes_pages() -> bool:
    from vllm.v1.attention.backend import AttentionBackend

    return hasattr(AttentionBackend, "customize_spec")


# vLLM 0.26: elements per (token, KV head) of the cache tensor that a --kv-cache-dtype name gives (its
# per-token-head modes add two float32 scales' room), in bytes of 1 for the quantized names
_LEGACY_ELEMENTS = {"int4_per_token_head": lambda d: d + 8, "int8_per_token_head": lambda d: 2 * d + 8,
                    "fp8_per_token_head": lambda d: 2 * d + 8}  # fmt: skip
ONE_BYTE = (
    "int4_per_token_head",
    "int8_per_token_head",
    "fp8_per_token_head",
    "fp8",
    "fp8_e4m3",
    "fp8_e5m2",
)
LEGACY_CACHE_DTYPES = ("auto", "bfloat16", "float16", *ONE_BYTE)
DTYPE_PREFIX = "tiercache_"
PRESET_DTYPES = tuple(DTYPE_PREFIX + name for name, bits in PRESETS.items() if bits != (None, None))


def supported_cache_dtypes() -> tuple[str, ...]:
    """vLLM >= 0.32: "auto", or a one-byte name marking the packed layers where some are exact
    (exact_layers.py); >= 0.33 also the registered tiercache_<preset> names."""
    return ("auto", *ONE_BYTE, *(PRESET_DTYPES if registers_dtypes() else ()))


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


def legacy_page(cache_dtype: str, head_size: int, model_dtype: torch.dtype) -> tuple[int, int]:
    """(elements, bytes) per token and KV head of vLLM 0.26's cache for this --kv-cache-dtype."""
    if cache_dtype not in LEGACY_CACHE_DTYPES:
        raise ConfigError(
            f"tiercache primary mode on this vLLM takes --kv-cache-dtype from "
            f"{', '.join(LEGACY_CACHE_DTYPES)}; got {cache_dtype!r}"
        )
    elements = _LEGACY_ELEMENTS.get(cache_dtype, lambda d: 2 * d)(head_size)
    itemsize = (
        1 if cache_dtype in ONE_BYTE else {"bfloat16": 2, "float16": 2}.get(cache_dtype, model_dtype.itemsize)
    )
    return elements, elements * itemsize


def check_fit(spec, cache_dtype: str, head_size: int, model_dtype: torch.dtype) -> None:
    """vLLM 0.26: the codec's bytes per token and head must fit the page --kv-cache-dtype gives."""
    from tiercache.pages import PageFormat

    need = PageFormat.from_spec(spec, 1, head_size, 16).token_head_bytes
    have = legacy_page(cache_dtype, head_size, model_dtype)[1]
    if need > have:
        best = fitting_dtype(spec, head_size, model_dtype)
        raise ConfigError(
            f"tiercache primary mode: codec {spec.name} needs {need} bytes per token and KV head at "
            f"head_dim {head_size}; --kv-cache-dtype {cache_dtype} gives {have}. Use --kv-cache-dtype {best} "
            "(this vLLM takes the page size from the dtype name; vLLM ≥ 0.32 sizes pages exactly)"
        )


def fitting_dtype(spec, head_size: int, model_dtype: torch.dtype) -> str:
    """vLLM 0.26: the one-byte --kv-cache-dtype with the smallest page holding the codec ("auto" if none)."""
    from tiercache.pages import PageFormat

    need = PageFormat.from_spec(spec, 1, head_size, 16).token_head_bytes
    fits = [n for n in ONE_BYTE if legacy_page(n, head_size, model_dtype)[1] >= need]
    return min(fits, key=lambda n: legacy_page(n, head_size, model_dtype)[1]) if fits else "auto"
