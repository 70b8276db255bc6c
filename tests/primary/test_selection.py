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
