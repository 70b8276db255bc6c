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


@pytest.mark.parametrize(
    ("raw", "policy"),
    [
        (None, "through"),
        ("through", "through"),
        ("reused", "reused"),
        ("evicted", "evicted"),
        ("all", "evicted"),
    ],
)
def test_write_policies_default_to_through_and_all_stays_evicted(raw, policy):
    """Issue 38: engines that share a store need blocks up while they are held, so through is the default;
    all, the name of before, keeps its meaning (a block goes up when dropped from DRAM) as evicted's alias."""
    given = {"url": "redis://h"} | ({} if raw is None else {"write": raw})
    remote = remote_config(given, "<t>")
    assert remote.write == policy
    assert remote_config(remote.to_dict(), "<t>") == remote


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
        (
            {"url": "redis://h", "write": "some"},
            ["tiers.remote.write", "'some'", "through", "reused", "evicted", "all is its old name"],
        ),
        ({"url": "redis://h", "write": ["all"]}, ["tiers.remote.write", "['all']", "through"]),
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


# Issue 42, item 1 (remote part): every remote setting that LMCache's adapter would refuse, or would take and
# then fail on (a store down for good, or the process aborted), is refused at load with a short message.
RESP = {"type": "resp", "host": "127.0.0.1", "port": 6379}
BAD_SETTINGS = {
    "space in the url's host": ({"url": "redis://bad host:6379"}, ["tiers.remote.url", "redis://host:port"]),
    "NUL in the url's host": ({"url": "redis://cache\x00.internal:6379"}, ["tiers.remote.url", "\\x00"]),
    "newline in the url": ({"url": "redis://h:1\n"}, ["tiers.remote.url"]),
    "url host not an address": ({"url": "redis://999.1.1.1:6379"}, ["host '999.1.1.1'", "IPv4"]),
    "url host with a bad label": ({"url": "redis://-x-.internal:6379"}, ["host", "labels"]),
    "url host IPv6": ({"url": "redis://[::1]:6379"}, ["IPv6", "IPv4 only"]),
    "url port 0": ({"url": "redis://h:0"}, ["tiers.remote.url", "1..65535"]),
    "url password not quoted": ({"url": "redis://me:hunter2@h:99999"}, ["tiers.remote.url", "***"]),
    "adapter type typo": ({"adapter": {**RESP, "type": "rsp"}}, ["adapter.type", "'rsp'", "mean resp"]),
    "adapter type unknown": ({"adapter": {"type": "memcached"}}, ["adapter.type", "resp", "plugin"]),
    "resp without host": ({"adapter": {"type": "resp", "port": 6379}}, ["adapter.host", "required", "host:"]),
    "resp without port": ({"adapter": {"type": "resp", "host": "h"}}, ["adapter.port", "required"]),
    "resp port -5": ({"adapter": {**RESP, "port": -5}}, ["adapter.port", "-5", "1..65535"]),
    "resp port 70000": ({"adapter": {**RESP, "port": 70000}}, ["adapter.port", "70000", "1..65535"]),
    "resp port as text": ({"adapter": {**RESP, "port": "6379"}}, ["adapter.port", "'6379'", "integer"]),
    "resp port true": ({"adapter": {**RESP, "port": True}}, ["adapter.port", "True"]),
    "resp host with a space": ({"adapter": {**RESP, "host": "a b"}}, ["adapter.host", "'a b'", "control"]),
    "resp host with a NUL": ({"adapter": {**RESP, "host": "a\x00b"}}, ["adapter.host", "\\x00"]),
    "resp host IPv6": ({"adapter": {**RESP, "host": "::1"}}, ["adapter.host", "IPv4 only"]),
    "resp host empty": ({"adapter": {**RESP, "host": ""}}, ["adapter.host", "empty"]),
    "resp key typo": ({"adapter": {**RESP, "num_worker": 4}}, ["unknown key", "'num_worker'", "num_workers"]),
    "a million workers": ({"adapter": {**RESP, "num_workers": 10**6}}, ["num_workers", "1000000", "1..256"]),
    "zero workers": ({"adapter": {**RESP, "num_workers": 0}}, ["num_workers", "1..256"]),
    "capacity NaN": ({"adapter": {**RESP, "max_capacity_gb": float("nan")}}, ["max_capacity_gb", "finite"]),
    "password with a NUL": ({"adapter": {**RESP, "password": "pw\x00x"}}, ["adapter.password", "not shown"]),
    "fs_native workers": (
        {"adapter": {"type": "fs_native", "base_path": "/tmp/tc", "num_workers": 10**6}},
        ["num_workers", "1..256"],
    ),
    "per-op workers": (
        {"adapter": {"type": "mooncake_store", "per_op_workers": {"store": 5000}}},
        ["per_op_workers.store", "5000"],
    ),
    "s3 io threads": (
        {"adapter": {"type": "s3", "s3_endpoint": "e", "s3_region": "r", "s3_num_io_threads": 10**6}},
        ["s3_num_io_threads", "1..1024"],
    ),
    "valkey node port": ({"adapter": {"type": "valkey", "startup_nodes": "h1:6,h2:0"}}, ["'h2:0'", "port"]),
    "valkey node host": ({"adapter": {"type": "valkey", "startup_nodes": "a b:6379"}}, ["'a b:6379'"]),
    "plugin not importable": (
        {"adapter": {"type": "plugin", "module_path": "no_such_pkg.adapter", "class_name": "A"}},
        ["adapter.module_path", "'no_such_pkg.adapter'", "cannot be imported"],
    ),
    "lmcache refuses": ({"adapter": {"type": "fs_native"}}, ["LMCache's fs_native adapter", "base_path"]),
    "huge value": ({"adapter": {**RESP, "host": "h" * 1_000_000}}, ["adapter.host", "4096 characters"]),
    "huge type": ({"adapter": {**RESP, "type": "t" * 1_000_000}}, ["adapter.type"]),
    "too deep": ({"adapter": {**RESP, "serde": {"a": {"b": {"c": {"d": {"e": 1}}}}}}}, ["nested too deep"]),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD_SETTINGS))
def test_bad_remote_settings_are_refused_at_load_with_a_short_message(case):
    raw, words = BAD_SETTINGS[case]
    with pytest.raises(ConfigError) as err:
        TierCacheConfig.from_dict({"tiers": {"remote": raw}}, source="t.yaml")
    message = str(err.value)
    assert "t.yaml" in message and len(message.encode()) <= 1024, message
    for word in words:
        assert word in message, message
    assert "hunter2" not in message and "pw\x00x" not in message and "pw\\x00x" not in message


def test_an_adapter_whose_module_is_missing_is_refused_naming_it(monkeypatch):
    """LMCache imports an adapter's dependencies with its module (nixl, aiofile, awscrt, …): one missing is
    named at load, not met by a store that stays down saying "No module named …" once a second."""
    import importlib

    real = importlib.import_module

    def without_nixl(name, *args):
        if name.endswith("nixl_store_l2_adapter"):
            raise ModuleNotFoundError("No module named 'nixl'", name="nixl")
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", without_nixl)
    with pytest.raises(ConfigError) as err:
        remote_config({"adapter": {"type": "nixl_store", "backend": "POSIX"}}, "t.yaml")
    message = str(err.value)
    assert "nixl_store needs the Python module 'nixl'" in message and "another adapter type" in message, (
        message
    )


GOOD_SETTINGS = [
    {"url": "redis://localhost:6379"},
    {"url": "redis://10.1.2.3"},
    {"url": "valkey://me:p%40ss@cache-1.internal.example.:7000/"},
    {"url": "redis://redis_primary:6379"},
    {"adapter": {**RESP, "num_workers": 16, "username": "u", "password": "p", "max_capacity_gb": 64}},
    {"adapter": {"type": "fs_native", "base_path": "/tmp/tiercache-remote", "num_workers": 4}},
    {"adapter": {"type": "mooncake_store", "master_server_address": "m:50051", "num_workers": 8}},
]


@pytest.mark.parametrize("raw", GOOD_SETTINGS)
def test_good_remote_settings_load_and_round_trip(raw):
    config = TierCacheConfig.from_dict({"tiers": {"remote": raw}}, source="t.yaml")
    assert TierCacheConfig.from_dict(config.to_dict(), source="t.yaml") == config
