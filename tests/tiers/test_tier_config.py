"""Config: YAML → frozen objects; table-driven errors, each naming the key, the bad value and the fix."""

import dataclasses
from pathlib import Path

import pytest

from tiercache.codecs import KVCodecSpec
from tiercache.config import CONFIG_ENV, TierCacheConfig
from tiercache.errors import ConfigError
from tiercache.units import Size, parse_bytes, parse_duration, parse_size

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiers.yaml"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("4GiB", 4 * 2**30), ("512MiB", 512 * 2**20), ("1.5GB", 1_500_000_000), ("1024", 1024), (2048, 2048),
     ("16 KiB", 16384), ("0", 0)],
)  # fmt: skip
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("2M tokens", 2_000_000), ("500k tokens", 500_000), ("65536 tokens", 65536), ("1 token", 1)],
)
def test_parse_tokens(text, expected):
    assert parse_size(text) == Size(tokens=expected)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("500ms", 0.5), ("2s", 2.0), ("1min", 60.0), ("250us", 250e-6), (3, 3.0), ("2", 2.0)],
)
def test_parse_duration(text, expected):
    assert parse_duration(text) == pytest.approx(expected)


def test_example_file_loads():
    cfg = TierCacheConfig.from_yaml(EXAMPLE)
    assert cfg.codec == KVCodecSpec(8, 4)
    assert cfg.tiers.vram == Size(bytes=4 * 2**30) and cfg.tiers.dram == Size(bytes=8 * 2**30)
    assert dataclasses.replace(cfg, source="") == TierCacheConfig(source="")  # its values are the defaults
    assert cfg.eviction.policy == "graph" and cfg.eviction.advisor_interval == 0.5
    assert cfg.eviction.max_stale == 2.0 and cfg.inspect.socket == "auto"
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.codec = None


def test_defaults_and_roundtrip():
    cfg = TierCacheConfig.from_dict({})
    assert cfg.codec.name == "k8v4"
    again = TierCacheConfig.from_dict(cfg.to_dict())
    assert dataclasses.replace(again, source="") == dataclasses.replace(cfg, source="")


def test_codec_forms():
    assert TierCacheConfig.from_dict({"codec": "tq4"}).codec == KVCodecSpec(4, 4)
    assert TierCacheConfig.from_dict({"codec": "none"}).codec.lossless
    spec = TierCacheConfig.from_dict({"codec": {"keys": 8, "values": 4, "seed": 3}}).codec
    assert (spec.key_bits, spec.value_bits, spec.seed) == (8, 4, 3)
    assert TierCacheConfig.from_dict({"codec": {"keys": "none", "values": 4}}).codec.key_bits is None
    assert TierCacheConfig.from_dict({"codec": "k8v4u"}).codec == KVCodecSpec(8, 4, key_codebook="uniform")
    spec = TierCacheConfig.from_dict({"codec": {"keys": 8, "values": 4, "key_codebook": "uniform"}}).codec
    assert spec.name == "k8v4u" and spec.value_codebook == "lloyd"
    spec = TierCacheConfig.from_dict({"codec": {"keys": 4, "values": 3, "value_codebook": "uniform"}}).codec
    assert (spec.key_codebook, spec.value_codebook) == ("lloyd", "uniform")
    dotted = {"codec.key_codebook": "uniform", "codec.keys": 8, "codec.values": 4}
    assert TierCacheConfig.from_dict(dotted).codec == KVCodecSpec(8, 4, key_codebook="uniform")


# (codec as written in the config, what to_dict writes back); codebooks appear only when not Lloyd-Max,
# so configs without them still read as before.
ROUNDTRIPS = [
    ("k8v4u", "k8v4u"),
    ({"keys": 8, "values": 4, "key_codebook": "uniform", "seed": 2},
     {"keys": 8, "values": 4, "seed": 2, "rotation": "haar", "key_codebook": "uniform"}),
    ({"keys": 3, "values": 8, "value_codebook": "uniform", "rotation": "hadamard"},
     {"keys": 3, "values": 8, "seed": 0, "rotation": "hadamard", "value_codebook": "uniform"}),
    ({"keys": 8, "values": 4, "seed": 1}, {"keys": 8, "values": 4, "seed": 1, "rotation": "haar"}),
]  # fmt: skip


@pytest.mark.parametrize(("codec", "written"), ROUNDTRIPS)
def test_codebook_roundtrip(codec, written):
    cfg = TierCacheConfig.from_dict({"codec": codec})
    assert cfg.to_dict()["codec"] == written
    assert TierCacheConfig.from_dict(cfg.to_dict()).codec == cfg.codec


def test_overrides_on_top_of_file(tmp_path, monkeypatch):
    path = tmp_path / "t.yaml"
    path.write_text("codec: tq4\ntiers:\n  vram: 1GiB\n  dram: 2GiB\n")
    cfg = TierCacheConfig.load(path, overrides={"tiers": {"vram": "512MiB"}, "eviction.policy": "lru"})
    assert (
        cfg.codec.name == "tq4" and cfg.tiers.vram.bytes == 512 * 2**20 and cfg.tiers.dram.bytes == 2 * 2**30
    )
    assert cfg.eviction.policy == "lru"
    monkeypatch.setenv(CONFIG_ENV, str(path))
    assert TierCacheConfig.load().codec.name == "tq4"


# (yaml text, fragments every one of which the message must contain)
BAD_FILES = [
    ("teirs:\n  vram: 1GiB\n", ["'teirs'", "did you mean 'tiers'"]),
    ("tiers:\n  vrma: 1GiB\n", ["'tiers.vrma'", "did you mean 'tiers.vram'"]),
    ("tiers:\n  vram: 4 gigs\n", ["tiers.vram", "'4 gigs'", "4GiB", "tokens"]),
    ("tiers:\n  dram: -3\n", ["tiers.dram", "-3", "4GiB"]),
    ("tiers:\n  dram: lots tokens\n", ["tiers.dram", "'lots tokens'", "2M tokens"]),
    ("tiers: 4GiB\n", ["tiers", "'4GiB'", "mapping"]),
    ("codec: tq5\n", ["codec", "'tq5'", "tq4", "k8v4", "keys: 8"]),
    ("codec: k9v4\n", ["codec", "'k9v4'", "did you mean", "k5v3"]),
    ("codec: {keys: 9, values: 4}\n", ["codec.keys", "9", "1..8"]),
    ("codec: {keys: 8}\n", ["codec.values", "missing"]),
    ("codec: {keys: 8, values: 4, bits: 3}\n", ["'codec.bits'", "Valid keys"]),
    ("codec: {keys: 8, values: 4, rotation: dct}\n", ["codec.rotation", "'dct'", "haar", "hadamard"]),
    ("codec: k8v4v\n", ["codec", "'k8v4v'", "k8v4u", "key_codebook", "uniform"]),
    (
        "codec: {keys: 8, values: 4, key_codebook: unifrom}\n",
        ["codec.key_codebook", "'unifrom'", "did you mean 'uniform'", "lloyd", "uniform"],
    ),
    ("codec: {keys: 8, values: 4, value_codebook: 3}\n", ["codec.value_codebook", "3", "lloyd, uniform"]),
    (
        "codec: {keys: none, values: 4, key_codebook: uniform}\n",
        ["codec.key_codebook", "'uniform'", "lossless", "drop codec.key_codebook"],
    ),
    (
        "codec: {keys: 8, values: 4, codebook: uniform}\n",
        ["'codec.codebook'", "did you mean", "key_codebook"],
    ),
    ("eviction:\n  policy: lfu\n", ["eviction.policy", "'lfu'", "graph", "lru"]),
    ("eviction:\n  advisor_interval: soon\n", ["eviction.advisor_interval", "'soon'", "500ms"]),
    ("eviction:\n  max_stale: 2 weeks\n", ["eviction.max_stale", "'2 weeks'", "2s"]),
    ("inspect:\n  socket: 3\n", ["inspect.socket", "3", "auto", "off"]),
    ("- just\n- a list\n", ["top level must be a mapping"]),
    ("codec: [unclosed\n", ["not valid YAML"]),
]


@pytest.mark.parametrize(("text", "fragments"), BAD_FILES)
def test_bad_files(tmp_path, text, fragments):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        TierCacheConfig.from_yaml(path)
    message = str(info.value)
    assert str(path) in message or "YAML" in message
    for fragment in fragments:
        assert fragment in message, message
    assert "\n" not in message.strip() or "YAML" in message  # one clear message


def test_codec_widths_by_name(tmp_path):
    path = tmp_path / "widths.yaml"
    path.write_text("codec: k8v5\n")
    codec = TierCacheConfig.from_yaml(path).codec
    assert (codec.key_bits, codec.value_bits) == (8, 5)


def test_missing_file():
    with pytest.raises(ConfigError, match="cannot read config file"):
        TierCacheConfig.from_yaml("/nonexistent/tiers.yaml")


def test_memory_check_names_both_numbers():
    cfg = TierCacheConfig.from_dict({"tiers": {"vram": "1GiB", "dram": "64GiB"}})
    with pytest.raises(ConfigError) as info:
        cfg.check_memory(host_bytes=16 * 2**30, device_bytes=None)
    message = str(info.value)
    assert "tiers.dram" in message and "64.00 GiB" in message and "16.00 GiB" in message
    cfg.check_memory(host_bytes=128 * 2**30, device_bytes=None)
    with pytest.raises(ConfigError, match="tiers.vram"):
        cfg.check_memory(host_bytes=128 * 2**30, device_bytes=2**29)
    tokens = TierCacheConfig.from_dict({"tiers": {"dram": "2M tokens"}})
    tokens.check_memory(host_bytes=2**30)  # unknown bytes per token: not checkable yet
    with pytest.raises(ConfigError, match="2,000,000 tokens"):
        tokens.check_memory(bytes_per_token=1024, host_bytes=2**30)


def test_memory_check_counts_what_the_tiers_keep_beside_the_vram_pool():
    """The worker's per-slot checksum tables live on the GPU with the VRAM tier: a tier that fits alone but
    not with them is refused, and the message names them."""
    cfg = TierCacheConfig.from_dict({"tiers": {"vram": "1GiB", "dram": "8GiB"}})
    cfg.check_memory(host_bytes=2**40, device_bytes=2**30)
    named = r"tiers.vram: 1.00 GiB with the block checksums of its 1,000 slots \(15.62 KiB\)"
    with pytest.raises(ConfigError, match=named):
        cfg.check_memory(
            host_bytes=2**40,
            device_bytes=2**30,
            device_extra=(16_000, "the block checksums of its 1,000 slots"),
        )
