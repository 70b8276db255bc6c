"""What each vLLM release's --kv-cache-dtype gives primary mode, and what the backend declares there.

Provides:
    sizes_pages() -> bool                this vLLM sizes the pages through customize_spec (≥ 0.32); older
                                         releases take the page size from --kv-cache-dtype (legacy_page)
    legacy_page(cache_dtype, head_size, model_dtype) -> (elements, bytes) per token and KV head on vLLM 0.26
    check_fit(spec, cache_dtype, head_size, model_dtype)   ConfigError naming a --kv-cache-dtype that fits
    fitting_dtype(spec, head_size, model_dtype) -> str     vLLM 0.26: the smallest one-byte page that fits
    ONE_BYTE                             the one-byte dtype names (packed layers next to exact ones use one)
    LEGACY_CACHE_DTYPES, supported_cache_dtypes()   what the backend declares on vLLM 0.26 / ≥ 0.32
The tiercache_<preset> names of vLLM ≥ 0.33 are registered and read in connectors/preset_dtypes.py (the
plugin and the connector's config need them too).
"""

from __future__ import annotations

import torch

from tiercache.errors import ConfigError

from ..preset_dtypes import PRESET_DTYPES, registers_dtypes


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


def supported_cache_dtypes() -> tuple[str, ...]:
    """vLLM >= 0.32: "auto", or a one-byte name marking the packed layers where some are exact
    (exact_layers.py); >= 0.33 also the registered tiercache_<preset> names."""
    return ("auto", *ONE_BYTE, *(PRESET_DTYPES if registers_dtypes() else ()))


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
