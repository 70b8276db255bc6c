"""Which page a vLLM release gives primary mode: vLLM 0.26 takes it from --kv-cache-dtype, so the codec
must fit the bytes that name gives, and a misfit names a --kv-cache-dtype that fits."""

from __future__ import annotations

import pytest
import torch

from tiercache.codecs import KVCodecSpec
from tiercache.connectors.attention.cache_dtypes import check_fit, legacy_page
from tiercache.errors import ConfigError


@pytest.mark.parametrize(
    ("cache_dtype", "head_size", "model_dtype", "expected"),
    [
        ("int4_per_token_head", 128, torch.bfloat16, (136, 136)),  # exactly K4V4's 64 + 64 + 2·4
        ("int4_per_token_head", 64, torch.bfloat16, (72, 72)),
        ("fp8", 128, torch.bfloat16, (256, 256)),
        ("int8_per_token_head", 128, torch.bfloat16, (264, 264)),
        ("auto", 128, torch.bfloat16, (256, 512)),
        ("auto", 64, torch.float32, (128, 512)),
    ],
)
def test_legacy_page_sizes(cache_dtype, head_size, model_dtype, expected):
    assert legacy_page(cache_dtype, head_size, model_dtype) == expected


def test_the_codec_must_fit_the_legacy_page():
    tq4, k8v4 = KVCodecSpec.from_preset("tq4"), KVCodecSpec.from_preset("k8v4")
    check_fit(tq4, "int4_per_token_head", 128, torch.bfloat16)
    check_fit(k8v4, "fp8", 128, torch.bfloat16)
    with pytest.raises(ConfigError, match=r"k8v4 needs 200 bytes .* gives 136\. Use --kv-cache-dtype fp8"):
        check_fit(k8v4, "int4_per_token_head", 128, torch.bfloat16)
    with pytest.raises(ConfigError, match="takes --kv-cache-dtype from auto, bfloat16"):
        legacy_page("turboquant_k8v4", 128, torch.bfloat16)


def test_a_preset_dtype_names_the_codec():
    """--kv-cache-dtype tiercache_<preset> (vLLM ≥ 0.33): the default codec gives way to it (its seed and
    exact layers kept), the same codec stays as configured, another one is refused naming both, and a
    tiercache_ name that is no preset is refused naming the valid ones."""
    from dataclasses import replace

    from tiercache.config import TierCacheConfig
    from tiercache.connectors.preset_dtypes import PRESET_DTYPES, preset_dtype, with_cache_dtype

    assert "tiercache_balanced" in PRESET_DTYPES and "tiercache_none" not in PRESET_DTYPES
    default = TierCacheConfig.from_dict({"codec": {"keys": 8, "values": 4, "seed": 7, "exact_layers": [0]}})
    chosen = with_cache_dtype(default, "tiercache_capacity").codec
    assert (chosen.key_bits, chosen.value_bits, chosen.seed, chosen.exact_layers) == (5, 3, 7, (0,))
    assert preset_dtype(chosen) == "tiercache_capacity"
    same = TierCacheConfig.from_dict({"codec": {"keys": 5, "values": 3, "seed": 3}})
    assert with_cache_dtype(same, "tiercache_capacity") is same
    assert with_cache_dtype(default, "auto") is default and with_cache_dtype(default, "fp8") is default
    other = replace(TierCacheConfig.from_dict({"codec": "k3v4"}), source="tiers.yaml")
    with pytest.raises(ConfigError, match=r"names codec tq4, but .*\(tiers.yaml\) sets codec k3v4"):
        with_cache_dtype(other, "tiercache_tq4")
    with pytest.raises(ConfigError, match="tiercache_balanced, tiercache_capacity"):
        with_cache_dtype(default, "tiercache_k5v5")
    assert preset_dtype(KVCodecSpec(5, 5)) is None
