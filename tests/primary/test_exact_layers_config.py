"""codec.exact_layers without an engine: the YAML key's checks (one-line errors naming the key, the value and
the fix), its resolution for a model, the start-up check against vLLM's --kv-cache-dtype-skip-layers, the
cache arguments each vLLM needs, the page each layer's spec gets, and the connector's refusal."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tiercache.codecs import KVCodecSpec
from tiercache.config import TierCacheConfig
from tiercache.errors import ConfigError

TQ4_EXACT = {"keys": 4, "values": 4, "exact_layers": [0, 1, -2, -1]}


@pytest.mark.parametrize(
    ("exact_layers", "message"),
    [
        (3, r"codec\.exact_layers: got 3 \(t\.yaml\); expected a list of distinct layer indices such as"),
        ([0, "1"], r"codec\.exact_layers: got '1' in \[0, '1'\] \(t\.yaml\); expected a list"),
        ([True], r"codec\.exact_layers: got True in \[True\]"),
        ([0, 1.5], r"got 1\.5 in"),
        ([1 << 20], r"got 1048576 in"),
        (
            [0, -1, 0],
            r"codec\.exact_layers: layer 0 is listed twice in \[0, -1, 0\] \(t\.yaml\); list it once",
        ),
    ],
)
def test_bad_values_are_one_line_errors(exact_layers, message):
    with pytest.raises(ConfigError, match=message) as info:
        TierCacheConfig.from_dict({"codec": {"keys": 4, "values": 4, "exact_layers": exact_layers}}, "t.yaml")
    assert "\n" not in str(info.value)


def test_a_lossless_side_takes_no_exact_layers():
    with pytest.raises(
        ConfigError, match=r"codec\.keys or codec\.values is lossless \(none\), which is exact"
    ):
        TierCacheConfig.from_dict({"codec": {"keys": "none", "values": 4, "exact_layers": [0]}})
    with pytest.raises(ValueError, match="exact_layers needs TurboQuant keys and values"):
        KVCodecSpec(None, 4, exact_layers=(0,))


def test_unknown_codec_keys_still_name_the_valid_ones():
    with pytest.raises(
        ConfigError, match=r"unknown key 'codec\.exact_layer' \(did you mean 'codec\.exact_layers'\?\)"
    ):
        TierCacheConfig.from_dict({"codec": {"keys": 4, "values": 4, "exact_layer": [0]}})


def test_resolution_for_a_model_and_the_round_trip():
    config = TierCacheConfig.from_dict({"codec": TQ4_EXACT})
    spec = config.codec
    assert spec.name == "tq4" and spec.exact_layers == (0, 1, -2, -1)
    assert spec.exact_layer_indices(30) == (0, 1, 28, 29)
    assert spec.exact_layer_indices(2) == (0, 1)  # repeats merged
    assert TierCacheConfig.from_dict(config.to_dict()).codec == spec
    assert TierCacheConfig.from_dict({"codec": "tq4"}).to_dict()["codec"] == "tq4"
    with pytest.raises(
        ValueError, match=r"layer 1 is out of range for a model of 1 layers \(valid: 0\.\.0, or -1\.\.-1"
    ):
        spec.exact_layer_indices(1)


def vllm_config(skip: list[str], cache_dtype: str, layers: int = 30, attention: str = "CUSTOM"):
    model = SimpleNamespace(hf_text_config=SimpleNamespace(num_hidden_layers=layers), dtype=torch.bfloat16,
                            get_head_size=lambda: 128)  # fmt: skip
    return SimpleNamespace(
        model_config=model,
        cache_config=SimpleNamespace(kv_cache_dtype_skip_layers=skip, cache_dtype=cache_dtype),
        attention_config=SimpleNamespace(backend=SimpleNamespace(name=attention)),
        kv_transfer_config=None,
    )


def test_vllm_must_skip_exactly_the_exact_layers():
    from tiercache.connectors.attention.exact_layers import resolve

    config = TierCacheConfig.from_dict({"codec": TQ4_EXACT}, "t.yaml")
    flags = "int4_per_token_head --kv-cache-dtype-skip-layers 0 1 28 29"
    assert resolve(vllm_config(["29", "28", "1", "0"], "int4_per_token_head"), config) == (0, 1, 28, 29)
    mismatch = (
        r"is layers \[0, 1, 28, 29\] of this 30-layer model, but vLLM's --kv-cache-dtype-skip-layers is"
    )
    with pytest.raises(ConfigError, match=rf"{mismatch} \[\].*Start vLLM with --kv-cache-dtype {flags}"):
        resolve(vllm_config([], "int4_per_token_head"), config)
    with pytest.raises(ConfigError, match=r"--kv-cache-dtype-skip-layers is \['0', '1'\]"):
        resolve(vllm_config(["0", "1"], "int4_per_token_head"), config)
    with pytest.raises(
        ConfigError, match=rf"--kv-cache-dtype auto: the packed layers need a one-byte.*{flags}"
    ):
        resolve(vllm_config(["0", "1", "28", "29"], "auto"), config)
    with pytest.raises(ConfigError, match=r"has 'sliding_window'; primary mode takes layer indices"):
        resolve(vllm_config(["0", "sliding_window"], "int4_per_token_head"), config)
    plain = TierCacheConfig.from_dict({"codec": "tq4"})
    assert resolve(vllm_config([], "auto"), plain) == ()
    with pytest.raises(
        ConfigError, match=r"skip-layers is \['3'\].*drop the flag, or list its layers in codec"
    ):
        resolve(vllm_config(["3"], "int4_per_token_head"), plain)
    with pytest.raises(ConfigError, match=r"layer 28 is out of range for a model of 4 layers.*\(t\.yaml\)"):
        resolve(vllm_config([], "auto", layers=4), TierCacheConfig.from_dict({"codec": {**TQ4_EXACT,
                "exact_layers": [28]}}, "t.yaml"))  # fmt: skip


def test_the_cache_arguments_each_vllm_needs(monkeypatch):
    from tiercache.connectors.attention import exact_layers

    tq4, k8v4 = (TierCacheConfig.from_dict({"codec": {**TQ4_EXACT, "keys": bits}}).codec for bits in (4, 8))
    monkeypatch.setattr(exact_layers, "sizes_pages", lambda: True)  # vLLM >= 0.32
    assert exact_layers.cache_args(tq4, 30, 128, torch.bfloat16) == {
        "kv_cache_dtype": "int4_per_token_head",
        "kv_cache_dtype_skip_layers": ["0", "1", "28", "29"],
    }
    plain = exact_layers.cache_args(KVCodecSpec.from_preset("tq4"), 30, 128, torch.bfloat16)
    assert plain == {"kv_cache_dtype": "auto", "kv_cache_dtype_skip_layers": []}
    monkeypatch.setattr(exact_layers, "sizes_pages", lambda: False)  # vLLM 0.26: the page the dtype gives
    assert exact_layers.cache_args(tq4, 30, 128, torch.bfloat16)["kv_cache_dtype"] == "int4_per_token_head"
    assert exact_layers.cache_args(k8v4, 30, 128, torch.bfloat16)["kv_cache_dtype"] == "fp8"


def test_exact_layers_keep_vllms_dense_page():
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVQuantMode

    from tiercache.connectors.attention.backend import page_spec
    from tiercache.connectors.attention.cache_dtypes import sizes_pages
    from tiercache.connectors.attention.selection import Decision

    if not sizes_pages():
        pytest.skip("vLLM 0.26 has no customize_spec: its pages come from the dtypes")

    config = TierCacheConfig.from_dict({"codec": TQ4_EXACT})
    exact = FullAttentionSpec(block_size=32, num_kv_heads=2, head_size=64, dtype=torch.float32)
    packed = FullAttentionSpec(block_size=32, num_kv_heads=2, head_size=64, dtype=torch.uint8,
                               kv_quant_mode=KVQuantMode.INT4_PER_TOKEN_HEAD)  # fmt: skip
    decision = Decision(True, config, torch.float32, (0, 1, 28, 29))
    assert page_spec(exact, decision) == exact and exact.page_size_bytes == 32 * 2 * 128 * 4
    assert page_spec(packed, decision).page_size_bytes == 32 * 2 * 72
    no_exact = Decision(True, TierCacheConfig.from_dict({"codec": "tq4"}), torch.float32)
    assert page_spec(exact, no_exact).page_size_bytes == 32 * 2 * 72  # without exact layers: all packed


@pytest.mark.parametrize(
    ("backend", "message"),
    [
        (
            "CUSTOM",
            r"cannot yet store primary-mode caches with codec\.exact_layers \[0, 1, -2, -1\].*tq4 pages",
        ),
        (None, r"codec\.exact_layers \[0, 1, -2, -1\] keeps layers exact in primary mode.*offload mode"),
    ],
)
def test_the_connector_refuses_exact_layers_naming_both(backend, message):
    from tiercache.connectors.common import Geometry

    codec = TierCacheConfig.from_dict({"codec": TQ4_EXACT}).codec
    config = SimpleNamespace(attention_config=SimpleNamespace(backend=SimpleNamespace(name=backend)))
    with pytest.raises(ConfigError, match=message):
        Geometry.from_vllm(config, SimpleNamespace(kv_cache_groups=[]), codec)
