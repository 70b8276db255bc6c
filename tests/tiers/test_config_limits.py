"""Issue 26, item 3: every config value is checked at load, and every error is one line naming the key, the
value (at most ~200 characters of it) and the fix. Before: zero/tiny tiers failed at start in a reshape,
1000TiB was a bare MemoryError, .inf an OverflowError, `tiers: []` and duplicate keys passed silently, a
365-byte alias bomb made a 35-million-character message, binary files raised UnicodeDecodeError."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from tiercache.config import TierCacheConfig
from tiercache.errors import ConfigError, shown
from tiercache.layout import BlockLayout, tier_capacities

MAX_MESSAGE = 700  # fixed text plus at most ~200 characters of any user value
LONG = "9" * 5000
BOMB = "codec:\n" + "".join(  # 9 levels of nine aliases each: 9^9 values once expanded (~400 bytes)
    f"  - &{c} [{', '.join(['*' + p] * 9) if p else ', '.join(['lol'] * 9)}]\n"
    for p, c in zip(["", *"abcdefgh"], "abcdefghi", strict=True)
)

# (YAML text, fragments every one of which the message must contain: the key name first)
BAD = [
    ("tiers:\n  vram: 0\n", ["tiers.vram", "one block"]),
    ("tiers:\n  vram: 0 tokens\n", ["tiers.vram", "one block"]),
    ("tiers:\n  vram: .inf\n", ["tiers.vram", "inf", "int64"]),
    ("tiers:\n  vram: 1.0e+400\n", ["tiers.vram", "int64"]),
    ("tiers:\n  dram: .nan\n", ["tiers.dram", "nan"]),
    ("tiers:\n  dram: 99999999999999999999 TiB\n", ["tiers.dram", "int64"]),
    ("tiers:\n  dram: 99999999999999999999 tokens\n", ["tiers.dram", "int64"]),
    (f"tiers:\n  vram: {LONG}\n", ["tiers.vram", "int64"]),
    (f"tiers:\n  vram: '{'x' * 20000}'\n", ["tiers.vram", "4GiB"]),
    ("tiers:\n  vram: true\n", ["tiers.vram", "True"]),
    ("tiers:\n  vram: [1, 2]\n", ["tiers.vram", "[1, 2]"]),
    ("tiers: []\n", ["tiers", "[]", "mapping"]),
    ("tiers: false\n", ["tiers", "False", "mapping"]),
    ("tiers: {1: 2}\n", ["tiers.1", "keys are text"]),
    ("eviction: 3\n", ["eviction", "mapping"]),
    ("inspect: [auto]\n", ["inspect", "mapping"]),
    ("eviction:\n  advisor_interval: .inf\n", ["eviction.advisor_interval", "finite"]),
    ("eviction:\n  advisor_interval: 1.0e+400\n", ["eviction.advisor_interval", "finite"]),
    ("eviction:\n  max_stale: .nan\n", ["eviction.max_stale", "nan"]),
    ("eviction:\n  advisor_interval: 0\n", ["eviction.advisor_interval", "> 0"]),
    (f"eviction:\n  advisor_interval: {LONG}\n", ["eviction.advisor_interval", "1 day"]),
    ("eviction:\n  advisor_interval: 1s\n  max_stale: 100ms\n", ["eviction.max_stale", "advisor_interval"]),
    ("eviction:\n  policy: [lru]\n", ["eviction.policy", "graph, lru"]),
    ("codec: []\n", ["codec", "preset"]),
    ("codec: {keys: true, values: 4}\n", ["codec.keys", "1..8"]),
    ("codec: {keys: 8, values: 4, seed: -1}\n", ["codec.seed", "-1"]),
    (f"codec: {{keys: 8, values: 4, seed: {LONG}}}\n", ["codec.seed"]),
    (f"codec: {'k' * 30000}\n", ["codec", "preset"]),
    ("inspect:\n  socket: {path: x}\n", ["inspect.socket", "auto"]),
    ("tiers:\n  vram: 1GiB\n  vram: 2GiB\n", ["tiers.vram", "duplicate", "lines 2 and 3"]),
    ("codec: tq4\ncodec: k8v4\n", ["codec", "duplicate"]),
    ("tiers:\n  vram: " + "[" * 5000 + "]" * 5000 + "\n", ["tiers.vram", "nested deeper"]),
    ("? " + "[" * 5000 + "]" * 5000 + "\n: 1\n", ["nested deeper"]),
    (BOMB, ["codec[2]", "aliases"]),
    ("tiers: &t {vram: *t}\n", ["tiers.vram", "recursive"]),
    ("? " + "x" * 10000 + "\n: 1\n", ["unknown key", "Valid keys"]),
    (
        "teirs: 1\ntiers: {vrma: 1}\neviction: {polcy: lru}\ncodec: {keys: 8, values: 4, bits: 3}\n",
        ["4 unknown keys", "'teirs'", "'tiers.vrma'", "'eviction.polcy'", "'codec.bits'", "did you mean"],
    ),
    ("".join(f"k{i}: 1\n" for i in range(30)), ["30 unknown keys", "'k0'", "and 22 more"]),
]  # fmt: skip


@pytest.mark.parametrize(("text", "fragments"), BAD, ids=[f"{i}" for i in range(len(BAD))])
def test_bad_config_names_the_key_in_one_short_line(tmp_path, text, fragments):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    start = time.monotonic()
    with pytest.raises(ConfigError) as info:
        TierCacheConfig.from_yaml(path)
    message = str(info.value)
    assert time.monotonic() - start < 1.0
    assert "\n" not in message and len(message) <= MAX_MESSAGE, (len(message), message[:300])
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message, message
    runs = ("9" * 201, "x" * 201, "k" * 201, "lol, lol, lol, lol, lol, lol, lol")  # no value shown whole
    assert not any(run in message for run in runs)


@pytest.mark.parametrize(
    ("data", "fragments"),
    [(b"\x00\x01codec: tq4\n", ["binary", "offset 0"]),
     ("codec: caf\xe9\n".encode("latin-1"), ["UTF-8", "0xe9"]),
     (b"# " + b"x" * 70_000 + b"\n", ["larger than 64 KiB"]),
     (b"codec: \x01\n", ["not valid YAML"])],
)  # fmt: skip
def test_files_that_are_not_yaml_text(tmp_path, data, fragments):
    path = tmp_path / "bad.yaml"
    path.write_bytes(data)
    with pytest.raises(ConfigError) as info:
        TierCacheConfig.from_yaml(path)
    message = str(info.value)
    assert str(path) in message and "\n" not in message and len(message) <= MAX_MESSAGE
    for fragment in fragments:
        assert fragment in message, message


def test_good_values_at_the_edges(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("tiers: {vram: &s 1GiB, dram: *s}\neviction: {advisor_interval: 5s}\n")
    cfg = TierCacheConfig.from_yaml(path)
    assert cfg.tiers.vram == cfg.tiers.dram and cfg.tiers.vram.bytes == 2**30  # a small alias is fine
    assert cfg.eviction.max_stale == 20.0  # left out: max(2s, 4 × advisor_interval), never below it
    edges = {"tiers": {"dram": 0}, "eviction": {"advisor_interval": 1, "max_stale": 1}}
    cfg = TierCacheConfig.from_dict(edges)
    assert cfg.tiers.dram.bytes == 0 and cfg.eviction.max_stale == 1.0  # dram 0: no DRAM tier


def test_overrides_get_the_same_checks():
    with pytest.raises(ConfigError, match=r"eviction\.advisor_interval: a duration must be a finite number"):
        TierCacheConfig.from_dict({"eviction": {"advisor_interval": float("inf")}})
    with pytest.raises(ConfigError, match=r"tiers\.vram: a size must be at most .* \(int64\)"):
        TierCacheConfig.from_dict({"tiers.vram": 1e400})
    deep: object = "x"
    for _ in range(100_000):
        deep = {"a": deep}
    with pytest.raises(ConfigError) as info:
        TierCacheConfig.from_dict({"tiers": deep})
    assert "tiers.a" in str(info.value) and len(str(info.value)) <= MAX_MESSAGE


LAYOUT = BlockLayout(num_layers=2, block_size=16, num_kv_heads=2, k_packed_dim=64, v_packed_dim=32)


@pytest.mark.parametrize(
    ("tiers", "key", "fragments"),
    [({"vram": "100"}, "tiers.vram", ["100 B", "16 tokens", f"{LAYOUT.block_bytes:,} bytes"]),
     ({"vram": "15 tokens"}, "tiers.vram", ["15 tokens", "at least \"16 tokens\""]),
     ({"dram": "1KiB"}, "tiers.dram", [f"{LAYOUT.dram_stride:,} bytes", "or 0 for no DRAM tier"])],
)  # fmt: skip
def test_tiers_below_one_block_name_the_minimum(tiers, key, fragments):
    cfg = TierCacheConfig.from_dict({"tiers": tiers})
    with pytest.raises(ConfigError) as info:
        cfg.check_blocks(tier_capacities(cfg, LAYOUT), LAYOUT)
    message = str(info.value)
    assert message.startswith(key + ":")
    for fragment in fragments:
        assert fragment in message, message
    ok = TierCacheConfig.from_dict({"tiers": {"vram": "16 tokens", "dram": 0}})
    ok.check_blocks(tier_capacities(ok, LAYOUT), LAYOUT)


def test_a_vram_tier_beyond_any_gpu_fails_where_the_gpu_is_not_visible():
    """The scheduler process cannot see GPU memory: 1000TiB used to reach its slot allocator (MemoryError)."""
    cfg = TierCacheConfig.from_dict({"tiers": {"vram": "1000TiB", "dram": "1GiB"}})
    with pytest.raises(ConfigError, match=r"tiers\.vram: 1000\.00 TiB asks for .* no GPU has more than"):
        cfg.check_memory(LAYOUT.bytes_per_token, host_bytes=16 * 2**30, check_device=False)
    TierCacheConfig.from_dict({"tiers": {"vram": "80GiB"}}).check_memory(host_bytes=2**34, check_device=False)


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [([1, 2], "kv_connector_extra_config: got [1, 2] (list); expected a mapping"),
     ("tiers.yaml", "kv_connector_extra_config: got 'tiers.yaml' (str)"),
     ({"config": 5}, "kv_connector_extra_config.config: got 5"),
     ({"tiers": {"vram": "x" * 10_000}}, "tiers.vram")],
)  # fmt: skip
def test_connector_extra_config_must_be_a_mapping(extra, fragment):
    from tiercache.connectors.common import load_config

    transfer = SimpleNamespace(kv_connector_extra_config=extra)
    with pytest.raises(ConfigError) as info:
        load_config(SimpleNamespace(kv_transfer_config=transfer))
    assert fragment in str(info.value) and len(str(info.value)) <= MAX_MESSAGE


def test_shown_bounds_any_value():
    nested: object = 1
    for _ in range(10_000):
        nested = [nested]
    for value in (nested, "a" * 10**6, b"\0" * 10**6, 10**10_000, {i: [i] * 1000 for i in range(1000)}):
        assert len(shown(value)) <= 200
    assert shown("tq4") == "'tq4'" and shown(3) == "3"
