"""KV codec pairs: presets, the lossless raw codec, one shape contract for the pools."""

import pytest
import torch

from tiercache.codecs import PRESETS, KVCodecSpec, RawCodec

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_raw_codec_is_lossless(dtype, head_dim):
    codec = RawCodec(head_dim, dtype)
    x = torch.randn(2, 3, 5, head_dim, generator=torch.Generator().manual_seed(0)).to(dtype)
    packed, norms = codec.encode(x)
    assert packed.dtype == torch.uint8 and packed.shape == (2, 3, 5, head_dim * dtype.itemsize)
    assert norms.dtype == torch.float32 and norms.shape == (2, 3, 5) and not norms.any()
    assert torch.equal(codec.decode(packed, norms, dtype), x)


@pytest.mark.parametrize("preset", list(PRESETS))
def test_presets_shape_contract(preset):
    spec = KVCodecSpec.from_preset(preset)
    pair = spec.build(64, torch.float32)
    assert (pair.k_packed_dim, pair.v_packed_dim) == spec.packed_dims(64, 4)
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(1))
    for codec in (pair.keys, pair.values):
        packed, norms = codec.encode(x)
        assert packed.shape == (4, codec.packed_dim) and norms.shape == (4,)
        assert codec.decode(packed, norms, torch.float32).shape == x.shape
    assert spec.name == preset


@pytest.mark.parametrize("spec", [KVCodecSpec(4, 4), KVCodecSpec(8, 4, seed=3, rotation="hadamard"),
                                  KVCodecSpec(None, 4), KVCodecSpec(None, None)])  # fmt: skip
def test_spec_codec_id_matches_the_built_pair(spec):
    assert spec.codec_id(64, torch.float16) == spec.build(64, torch.float16).codec_id


def test_codec_ids_differ():
    ids = {KVCodecSpec.from_preset(p).build(64).codec_id for p in PRESETS}
    assert len(ids) == len(PRESETS)
    assert KVCodecSpec(4, 4, seed=1).build(64).codec_id != KVCodecSpec(4, 4).build(64).codec_id


def test_bytes_per_token_formula():
    # layers × kv_heads × [(d·kb/8 + 4) + (d·vb/8 + 4)]
    assert KVCodecSpec(4, 4).bytes_per_token(32, 8, 128) == 32 * 8 * (68 + 68)
    assert KVCodecSpec(8, 4).bytes_per_token(32, 8, 128) == 32 * 8 * (132 + 68)
    assert KVCodecSpec(None, None).bytes_per_token(2, 2, 64, dtype_bytes=4) == 2 * 2 * (260 + 260)


def test_unknown_preset():
    with pytest.raises(ValueError, match="valid presets: tq4, k8v4"):
        KVCodecSpec.from_preset("tq5")
