"""The remote tier's config section, `tiers.remote`, and its checks.

Provides:
    RemoteConfig        url, timeout (s), write ("through" | "evicted" | "reused"), queue_blocks, adapter
                        (LMCache L2 adapter settings: {type: …, …}), secret (RemoteSecret | None: the key of
                        the values' MAC); .adapter_settings() -> (type, settings) for LMCache
    remote_config(raw, source) -> RemoteConfig | None     None when tiers.remote is left out or null
    REMOTE_KEYS, WRITE_POLICIES, WRITE_ALIASES, URL_SCHEMES, INSTALL_HINT

Write policies (tiers.remote.write), when a block goes up (never a block fetched from the store; the writer
skips blocks the store already holds, one existence call per write batch):
    through   every stored block, as soon as it is stored (the default): blocks other engines want are in the
              store while this engine still holds them; every block's bytes cross the network once
    reused    a block at its first hit here (its first load): only blocks reused at least once go up, while
              still held; cold blocks never do
    evicted   a block the manager drops from DRAM (what "all" meant before issue 38: accepted as its alias):
              blocks still held here are not in the store

Shape:
    tiers:
      remote: {url: redis://127.0.0.1:6379, timeout: 50ms, write: through, queue_blocks: 256,
               secret: {env: TIERCACHE_REMOTE_SECRET}}
    or, for any other LMCache L2 backend (Mooncake, S3, Valkey cluster, file systems), its own settings:
      remote: {adapter: {type: mooncake_store, …}, timeout: 200ms}
url and adapter are exclusive; one of them is required. The remote tier needs LMCache: a config with
tiers.remote where lmcache is not installed is a ConfigError naming the install command.

Every setting is checked here, against what LMCache's adapter accepts (remote/settings.py), so that no value
loads that leaves the store down for good: the URL's host is a DNS name or an IPv4 address (LMCache's RESP
client connects over IPv4 only) and its port 1..65535; an adapter's type is one LMCache has, its module
imports here, its settings pass our bounds (num_workers 1..256, …) and its config class's own from_dict.
secret ({env: NAME} or {file: PATH}, remote/secret.py) is read here: a missing or short one is a ConfigError;
the key itself never appears in a message, a repr or to_dict. Messages quote values shortened (≤ 80
characters, a URL's password as ***) and name the key and the fix, so that each stays well under 1 KB.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass, field
from typing import Any

from tiercache.errors import ConfigError, shown
from tiercache.remote.secret import RemoteSecret, read_secret
from tiercache.remote.settings import check_adapter, host_problem
from tiercache.units import DURATION_FORMS, parse_duration

REMOTE_KEYS = ("url", "adapter", "timeout", "write", "queue_blocks", "secret")
WRITE_POLICIES = ("through", "evicted", "reused")  # when a block goes up: stored, dropped from DRAM, 1st hit
WRITE_ALIASES = {"all": "evicted"}  # the values of before issue 38, with their meaning
URL_SCHEMES = ("redis", "valkey")  # both speak RESP: LMCache's "resp" L2 adapter
INSTALL_HINT = 'pip install "tiercache[remote]"'
MAX_QUEUE_BLOCKS = 1 << 20
MAX_TIMEOUT = 60.0
_URL_RE = re.compile(r"^(?P<scheme>[a-z]+)://(?:(?P<user>[^:@/]*)(?::(?P<password>[^@/]*))?@)?"
                     r"(?P<host>\[[0-9a-fA-F:]+\]|[^:/@\[\]]+)(?::(?P<port>\d{1,5}))?/?$")  # fmt: skip
_EXAMPLE = "{url: redis://127.0.0.1:6379, timeout: 50ms, write: through, queue_blocks: 256}"


@dataclass(frozen=True)
class RemoteConfig:
    url: str | None = None  # redis://[user[:password]@]host[:port]; valkey:// the same
    adapter: dict[str, Any] = field(default_factory=dict)  # LMCache L2 adapter settings, {type: …, …}
    timeout: float = 0.05  # seconds: a lookup, a put batch or a get call (≤ 16 MiB of values) slower than
    # this is a miss / a failed write
    write: str = "through"  # WRITE_POLICIES: when a block goes up
    queue_blocks: int = 256  # the write-behind queue's bound: blocks waiting for the store; more are dropped
    secret: RemoteSecret | None = None  # the key of every value's MAC; None: values carry none, and anyone
    # who can write the store can change what the engines serve

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
        if self.secret is not None:
            out["secret"] = self.secret.to_dict()  # where it is read from, never the key
        return out


def remote_config(raw: Any, source: str, lmcache_installed: bool | None = None) -> RemoteConfig | None:
    if raw is None:
        return None
    check_section(raw, "tiers.remote", REMOTE_KEYS, _EXAMPLE, source)
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
        adapter=check_adapter(adapter, source) if adapter is not None else {},
        timeout=_timeout(raw.get("timeout", 0.05), source),
        write=_write(raw.get("write", "through"), source),
        queue_blocks=queue_blocks(raw.get("queue_blocks", 256), source, "tiers.remote", "the remote store"),
        secret=_secret(raw["secret"], source) if raw.get("secret") is not None else None,
    )


def _url(raw: Any, source: str) -> str:
    plain = (
        isinstance(raw, str) and raw.isprintable() and " " not in raw
    )  # no space, NUL or control character
    m = _URL_RE.match(raw) if plain else None
    if m is None or m["scheme"] not in URL_SCHEMES or not 0 < int(m["port"] or 6379) < 65536:
        why = "" if plain or not isinstance(raw, str) else ": a URL has no space or control character"
        raise ConfigError(
            f"tiers.remote.url: got {shown(_redacted(raw), 80)} ({source}){why}; expected redis://host:port "
            "or valkey://host:port (optionally user:password@ before the host; port 1..65535), e.g. "
            "redis://127.0.0.1:6379; for another LMCache backend set tiers.remote.adapter instead"
        )
    why = host_problem(m["host"].strip("[]"), ipv6=False)
    if why is not None:
        raise ConfigError(
            f"tiers.remote.url: host {shown(m['host'], 80)} ({source}): {why}; expected a DNS name or an "
            "IPv4 address, e.g. redis://127.0.0.1:6379 or redis://cache.internal:6379"
        )
    return raw


def _timeout(raw: Any, source: str) -> float:
    try:
        seconds = parse_duration(raw)
    except ValueError as exc:
        raise ConfigError(f"tiers.remote.timeout: {exc} ({source})") from None
    if not 0 < seconds <= MAX_TIMEOUT:
        raise ConfigError(
            f"tiers.remote.timeout: got {shown(raw, 80)} ({source}); expected a duration in "
            f"(0, {MAX_TIMEOUT:g}s], "
            f"{DURATION_FORMS}: how long a lookup or load may wait before the block is recomputed (e.g. 50ms)"
        )
    return seconds


def _write(raw: Any, source: str) -> str:
    if isinstance(raw, str) and raw in WRITE_ALIASES:
        return WRITE_ALIASES[raw]
    if raw not in WRITE_POLICIES:
        raise ConfigError(
            f"tiers.remote.write: got {shown(raw, 80)} ({source}); expected through (every block goes up as "
            "soon as it is stored: the default, what engines sharing a store want), reused (a block goes up "
            "at its first hit) or evicted (a block goes up when dropped from DRAM; all is its old name)"
        )
    return raw


def check_section(raw: Any, section: str, keys: tuple[str, ...], example: str, source: str) -> None:
    """`section` (tiers.remote, tiers.disk) is a mapping of its own keys only."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{section}: got {shown(raw, 80)} ({source}); expected a mapping such as {example}")
    unknown = [k for k in raw if k not in keys]
    if unknown:
        raise ConfigError(
            f"{section}: unknown key(s) {', '.join(shown(k, 40) for k in unknown[:8])} ({source}); "
            f"valid keys: {', '.join(keys)}"
        )


def queue_blocks(raw: Any, source: str, section: str, target: str) -> int:
    """`section`.queue_blocks (tiers.remote, tiers.disk): the write-behind queue's length in blocks."""
    if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= MAX_QUEUE_BLOCKS:
        raise ConfigError(
            f"{section}.queue_blocks: got {shown(raw, 80)} ({source}); expected an integer "
            f"1..{MAX_QUEUE_BLOCKS:,}: the blocks that may wait for {target} before further writes are "
            "dropped"
        )
    return raw


def _secret(raw: Any, source: str) -> RemoteSecret:
    try:
        return read_secret(raw)
    except ValueError as exc:  # its message names the key and the fix, never the secret
        raise ConfigError(f"{exc} ({source})") from None


def _redacted(url: Any) -> Any:
    """A URL as a message may quote it: its password replaced by ***."""
    return re.sub(r"(://[^:@/]*:)[^@/]*@", r"\1***@", url) if isinstance(url, str) else url
