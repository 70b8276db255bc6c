"""The remote tier's config section, `tiers.remote`, and its checks.

Provides:
    RemoteConfig        url, timeout (s), write ("all" | "reused"), queue_blocks, adapter (LMCache L2 adapter
                        settings: {type: …, …}); .adapter_settings() -> (type, settings) for LMCache
    remote_config(raw, source) -> RemoteConfig | None     None when tiers.remote is left out or null
    REMOTE_KEYS, WRITE_POLICIES, URL_SCHEMES, INSTALL_HINT

Shape:
    tiers:
      remote: {url: redis://127.0.0.1:6379, timeout: 50ms, write: all, queue_blocks: 256}
    or, for any other LMCache L2 backend (Mooncake, S3, Valkey cluster, file systems), its own settings:
      remote: {adapter: {type: mooncake_store, …}, timeout: 200ms}
url and adapter are exclusive; one of them is required. The remote tier needs LMCache: a config with
tiers.remote where lmcache is not installed is a ConfigError naming the install command.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass, field
from typing import Any

from tiercache.errors import ConfigError, shown
from tiercache.units import DURATION_FORMS, parse_duration

REMOTE_KEYS = ("url", "adapter", "timeout", "write", "queue_blocks")
WRITE_POLICIES = ("all", "reused")  # which blocks evicted from DRAM go up: every one, or those loaded once
URL_SCHEMES = ("redis", "valkey")  # both speak RESP: LMCache's "resp" L2 adapter
INSTALL_HINT = 'pip install "tiercache[remote]"'
MAX_QUEUE_BLOCKS = 1 << 20
MAX_TIMEOUT = 60.0
_URL_RE = re.compile(r"^(?P<scheme>[a-z]+)://(?:(?P<user>[^:@/]*)(?::(?P<password>[^@/]*))?@)?"
                     r"(?P<host>\[[0-9a-fA-F:]+\]|[^:/@\[\]]+)(?::(?P<port>\d{1,5}))?/?$")  # fmt: skip
_EXAMPLE = "{url: redis://127.0.0.1:6379, timeout: 50ms, write: all, queue_blocks: 256}"


@dataclass(frozen=True)
class RemoteConfig:
    url: str | None = None  # redis://[user[:password]@]host[:port]; valkey:// the same
    adapter: dict[str, Any] = field(default_factory=dict)  # LMCache L2 adapter settings, {type: …, …}
    timeout: float = 0.05  # seconds: a lookup, a put batch or a get call (≤ 16 MiB of values) slower than
    # this is a miss / a failed write
    write: str = "all"
    queue_blocks: int = 256  # the write-behind queue's bound: blocks waiting for the store; more are dropped

    def adapter_settings(self) -> tuple[str, dict[str, Any]]:
        """(LMCache L2 adapter type, its settings) for this config."""
        if self.url is None:
            settings = dict(self.adapter)
            return str(settings.pop("type")), settings
        m = _URL_RE.match(self.url)
        assert m is not None  # checked by remote_config
        settings = {"host": m["host"].strip("[]"), "port": int(m["port"] or 6379)}
        if m["user"]:
            settings["username"] = m["user"]
        if m["password"]:
            settings["password"] = m["password"]
        return "resp", settings

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"url": self.url} if self.url is not None else {"adapter": dict(self.adapter)}
        out.update(timeout=self.timeout, write=self.write, queue_blocks=self.queue_blocks)
        return out


def remote_config(raw: Any, source: str, lmcache_installed: bool | None = None) -> RemoteConfig | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ConfigError(f"tiers.remote: got {shown(raw)} ({source}); expected a mapping such as {_EXAMPLE}")
    unknown = [k for k in raw if k not in REMOTE_KEYS]
    if unknown:
        raise ConfigError(
            f"tiers.remote: unknown key(s) {', '.join(shown(k, 40) for k in unknown[:8])} ({source}); "
            f"valid keys: {', '.join(REMOTE_KEYS)}"
        )
    if lmcache_installed is None:
        lmcache_installed = importlib.util.find_spec("lmcache") is not None
    if not lmcache_installed:
        raise ConfigError(
            f"tiers.remote is set ({source}) but LMCache is not installed: the remote tier stores blocks "
            f"through LMCache's storage backends; install it with {INSTALL_HINT}, or remove tiers.remote"
        )
    url, adapter = raw.get("url"), raw.get("adapter")
    if (url is None) == (adapter is None):
        raise ConfigError(
            f"tiers.remote: set exactly one of url (a Redis/Valkey server) or adapter (another LMCache L2 "
            f"backend's settings, {{type: …}}) ({source}); for example {_EXAMPLE}"
        )
    return RemoteConfig(
        url=_url(url, source) if url is not None else None,
        adapter=_adapter(adapter, source) if adapter is not None else {},
        timeout=_timeout(raw.get("timeout", 0.05), source),
        write=_write(raw.get("write", "all"), source),
        queue_blocks=_queue_blocks(raw.get("queue_blocks", 256), source),
    )


def _url(raw: Any, source: str) -> str:
    m = _URL_RE.match(raw) if isinstance(raw, str) else None
    if m is None or m["scheme"] not in URL_SCHEMES or not 0 < int(m["port"] or 6379) < 65536:
        raise ConfigError(
            f"tiers.remote.url: got {shown(raw)} ({source}); expected redis://host:port or "
            "valkey://host:port (optionally user:password@ before the host), e.g. redis://127.0.0.1:6379; "
            "for another LMCache backend set tiers.remote.adapter instead"
        )
    return raw


def _adapter(raw: Any, source: str) -> dict[str, Any]:
    if not isinstance(raw, dict) or not isinstance(raw.get("type"), str) or not raw["type"]:
        raise ConfigError(
            f"tiers.remote.adapter: got {shown(raw)} ({source}); expected an LMCache L2 adapter's settings "
            "with its type, e.g. {type: resp, host: 127.0.0.1, port: 6379} (types: resp, mooncake_store, "
            "s3, valkey, fs, …)"
        )
    return dict(raw)


def _timeout(raw: Any, source: str) -> float:
    try:
        seconds = parse_duration(raw)
    except ValueError as exc:
        raise ConfigError(f"tiers.remote.timeout: {exc} ({source})") from None
    if not 0 < seconds <= MAX_TIMEOUT:
        raise ConfigError(
            f"tiers.remote.timeout: got {shown(raw)} ({source}); expected a duration in "
            f"(0, {MAX_TIMEOUT:g}s], "
            f"{DURATION_FORMS}: how long a lookup or load may wait before the block is recomputed (e.g. 50ms)"
        )
    return seconds


def _write(raw: Any, source: str) -> str:
    if raw not in WRITE_POLICIES:
        raise ConfigError(
            f"tiers.remote.write: got {shown(raw)} ({source}); expected all (every block evicted from DRAM "
            "goes to the remote store) or reused (only blocks that were loaded at least once)"
        )
    return raw


def _queue_blocks(raw: Any, source: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= MAX_QUEUE_BLOCKS:
        raise ConfigError(
            f"tiers.remote.queue_blocks: got {shown(raw)} ({source}); expected an integer "
            f"1..{MAX_QUEUE_BLOCKS:,}: the blocks that may wait for the remote store before further writes "
            "are dropped"
        )
    return raw
