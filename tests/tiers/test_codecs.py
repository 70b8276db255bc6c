"""KV codec pairs: presets, the lossless raw codec, one shape contract for the pools."""

import pytest
import torch

from tiercache.codecs import CODEBOOKS, PRESETS, KVCodecSpec, RawCodec

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
                                  KVCodecSpec(None, 4), KVCodecSpec(None, None),
                                  KVCodecSpec(8, 4, key_codebook="uniform"),
                                  KVCodecSpec(None, 4, seed=2, value_codebook="uniform")])  # fmt: skip
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
    with pytest.raises(ValueError, match="valid presets: balanced, capacity, tq4, k8v4"):
        KVCodecSpec.from_preset("tq5")


# Pool contents are keyed by codec_id: an id changes only with a new format (tq1 → tq2: the unbiased scale),
# so that blocks of the old format are misses, never read as the new one.
PINNED_IDS = {
    "balanced": "K:tq2-d128-b6-haar-s0|V:tq2-d128-b4-haar-s0",
    "capacity": "K:tq2-d128-b5-haar-s0|V:tq2-d128-b3-haar-s0",
    "tq4": "K:tq2-d128-b4-haar-s0|V:tq2-d128-b4-haar-s0",
    "k8v4": "K:tq2-d128-b8-haar-s0|V:tq2-d128-b4-haar-s0",
    "k3v4": "K:tq2-d128-b3-haar-s0|V:tq2-d128-b4-haar-s0",
    "tq3": "K:tq2-d128-b3-haar-s0|V:tq2-d128-b3-haar-s0",
    "k8v8": "K:tq2-d128-b8-haar-s0|V:tq2-d128-b8-haar-s0",
    "k8v4u": "K:tq2-d128-b8-haar-s0-uniform|V:tq2-d128-b4-haar-s0",
    "none": "K:raw1-d128-bfloat16|V:raw1-d128-bfloat16",
}


def test_preset_ids_are_pinned():
    assert set(PINNED_IDS) == set(PRESETS)
    for preset, expected in PINNED_IDS.items():
        assert KVCodecSpec.from_preset(preset).codec_id(128) == expected


def test_widths_by_name():
    """k<bits>v<bits> names any Lloyd-Max widths; a preset with those widths is reported by its name."""
    assert KVCodecSpec.from_preset("k5v3") == KVCodecSpec(5, 3) == KVCodecSpec.from_preset("capacity")
    assert KVCodecSpec.from_preset("k7v2") == KVCodecSpec(7, 2) and KVCodecSpec(7, 2).name == "k7v2"
    assert KVCodecSpec(5, 3).name == "capacity"
    for bad in ("k9v4", "k0v4", "k8v", "K5V3", "k5v3 "):
        with pytest.raises(ValueError, match="k<bits>v<bits>"):
            KVCodecSpec.from_preset(bad)


def test_k8v4u_is_k8v4_with_uniform_keys():
    spec = KVCodecSpec.from_preset("k8v4u")
    assert (spec.key_bits, spec.value_bits, spec.key_codebook, spec.value_codebook) == (
        8,
        4,
        "uniform",
        "lloyd",
    )
    assert KVCodecSpec(8, 4, key_codebook="uniform").name == "k8v4u" and KVCodecSpec(8, 4).name == "k8v4"
    pair, lloyd = spec.build(128), KVCodecSpec.from_preset("k8v4").build(128)
    assert (pair.keys.codebook_kind, pair.values.codebook_kind) == ("uniform", "lloyd")
    assert pair.keys.expected_mse > lloyd.keys.expected_mse and pair.values == lloyd.values
    steps = torch.diff(pair.keys.codebook.double())
    assert torch.equal(steps, torch.full_like(steps, float(steps[0])))  # affine
    assert spec.bytes_per_token(30, 3, 64) == KVCodecSpec(8, 4).bytes_per_token(30, 3, 64)


def test_non_preset_names_mark_uniform_sides():
    assert KVCodecSpec(4, 4, key_codebook="uniform", value_codebook="uniform").name == "k4uv4u"
    assert KVCodecSpec(4, 8, value_codebook="uniform").name == "k4v8u"


def test_codebooks_match_the_kernels():
    from tiercache.kernels.codec import CODEBOOK_KINDS

    assert CODEBOOKS == CODEBOOK_KINDS


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"key_codebook": "lloyd-max"}, "key_codebook must be one of lloyd, uniform, got 'lloyd-max'"),
     ({"value_codebook": "affine"}, "value_codebook must be one of lloyd, uniform, got 'affine'"),
     ({"key_bits": None, "key_codebook": "uniform"}, "needs key_bits: lossless keys have no codebook")],
)  # fmt: skip
def test_bad_codebooks(kwargs, message):
    with pytest.raises(ValueError, match=message):
        KVCodecSpec(**{"key_bits": 8, "value_bits": 4, **kwargs})
