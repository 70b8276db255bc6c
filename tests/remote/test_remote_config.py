"""tiers.remote in the YAML: parsed, round-tripped, and every bad value named with its fix."""

from __future__ import annotations

import pytest

from tiercache.config import TierCacheConfig
from tiercache.config_remote import remote_config
from tiercache.errors import ConfigError


def test_remote_parses_and_round_trips(tmp_path):
    path = tmp_path / "tiers.yaml"
    path.write_text(
        "tiers:\n  remote: {url: redis://127.0.0.1:6390, timeout: 20ms, write: reused, queue_blocks: 8}\n"
    )
    config = TierCacheConfig.from_yaml(path)
    remote = config.tiers.remote
    assert (remote.url, remote.timeout, remote.write, remote.queue_blocks) == (
        "redis://127.0.0.1:6390", 0.02, "reused", 8,
    )  # fmt: skip
    assert remote.adapter_settings() == ("resp", {"host": "127.0.0.1", "port": 6390})
    assert TierCacheConfig.from_dict(config.to_dict(), source=str(path)) == config
    assert TierCacheConfig.from_dict({}).tiers.remote is None


def test_adapter_settings_pass_to_lmcache():
    remote = remote_config({"adapter": {"type": "mooncake_store", "master": "m:50051"}}, "<t>")
    assert remote.adapter_settings() == ("mooncake_store", {"master": "m:50051"})
    user = remote_config({"url": "valkey://me:pw@cache.example:7000"}, "<t>")
    assert user.adapter_settings() == (
        "resp", {"host": "cache.example", "port": 7000, "username": "me", "password": "pw"},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ("redis://x", ["mapping"]),
        ({}, ["exactly one of url", "adapter"]),
        ({"url": "http://h:1"}, ["tiers.remote.url", "'http://h:1'", "redis://host:port"]),
        ({"url": "redis://h:99999"}, ["tiers.remote.url", "redis://host:port"]),
        ({"url": "redis://h", "adapter": {"type": "resp"}}, ["exactly one"]),
        ({"adapter": {"host": "h"}}, ["tiers.remote.adapter", "type"]),
        ({"url": "redis://h", "timeout": "0s"}, ["tiers.remote.timeout", "'0s'", "50ms"]),
        ({"url": "redis://h", "timeout": "soon"}, ["tiers.remote.timeout", "'soon'"]),
        ({"url": "redis://h", "write": "some"}, ["tiers.remote.write", "'some'", "all", "reused"]),
        ({"url": "redis://h", "queue_blocks": 0}, ["tiers.remote.queue_blocks", "0", "1.."]),
        ({"url": "redis://h", "queue_blocks": True}, ["tiers.remote.queue_blocks", "True"]),
        ({"url": "redis://h", "ttl": 3}, ["unknown", "'ttl'", "queue_blocks"]),
    ],
)
def test_bad_values_name_key_value_and_fix(raw, words):
    with pytest.raises(ConfigError) as err:
        TierCacheConfig.from_dict({"tiers": {"remote": raw}}, source="t.yaml")
    message = str(err.value)
    assert "t.yaml" in message
    for word in words:
        assert word in message, message


def test_without_lmcache_the_error_names_the_install_command():
    with pytest.raises(ConfigError, match=r'pip install "tiercache\[remote\]"'):
        remote_config({"url": "redis://127.0.0.1:6379"}, "t.yaml", lmcache_installed=False)
