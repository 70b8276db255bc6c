"""What LMCache's L2 adapters accept, checked when the config is loaded (config_remote.py), so that a
setting the adapter would refuse, or would take and then fail on (a host with a space or a NUL, a port out of
range, a million worker threads, a type whose module cannot be imported), is a ConfigError that names the key,
the value (shortened) and the fix, and never a store that stays down warning about something else.

Provides:
    ADAPTER_TYPES        LMCache 0.5.6's built-in L2 adapter types (third-party ones: type plugin)
    RESP_KEYS            the settings of type resp (LMCache's RESPL2AdapterConfig; it ignores unknown keys)
    MAX_WORKERS, MAX_IO_THREADS, MAX_CAPACITY_GB     the bounds put on LMCache's counts (it has no upper ones)
    host_problem(host, ipv6=True) -> str | None      why `host` is no DNS name or IP address (None: it is one)
    check_adapter(raw, source) -> dict               tiers.remote.adapter checked: our bounds, then LMCache's
                                                     own adapter module and its config's from_dict (and a
                                                     plugin's module_path: importable)

What LMCache 0.5.6 accepts (read from lmcache/v1/distributed/l2_adapters/): resp needs host (a non-empty str)
and port (an int > 0), num_workers an int > 0 (default 8: one thread and one TCP connection each; a million
aborts the process when the native client starts its threads), username/password str, max_capacity_gb ≥ 0;
its native client resolves hosts over IPv4 only (getaddrinfo with AF_INET) and passes the host to C as a
NUL-terminated string. Other types check their own required keys in from_dict (fs: base_path, s3: s3_endpoint
and s3_region, valkey: startup_nodes "host:port,…", …) and import their dependencies with their module.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import ipaddress
import math
import re
from typing import Any

from tiercache.errors import ConfigError, shown

ADAPTER_TYPES = (
    "aerospike", "bigtable", "dax", "fault_inject", "fs", "fs_native", "hf3fs", "hfbucket", "mock",
    "mooncake_store", "native_plugin", "nixl_native", "nixl_store", "nixl_store_dynamic", "p2p", "plugin",
    "raw_block", "resp", "s3", "sagemaker-hyperpod", "valkey",
)  # fmt: skip
RESP_KEYS = ("type", "host", "port", "num_workers", "username", "password", "max_capacity_gb")
MAX_WORKERS = 256  # threads (and, for resp, connections) per adapter; LMCache's defaults are 4 and 8
MAX_IO_THREADS = 1024  # s3_num_io_threads (default 64)
MAX_CAPACITY_GB = 2**20  # 1 PiB
_MAX_KEYS, _MAX_DEPTH = 64, 4
_COUNTS = {"num_workers": MAX_WORKERS, "s3_num_io_threads": MAX_IO_THREADS}
_SECRET_WORDS = ("password", "secret", "token", "credential", "access_key")
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOSTNAME = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*\.?$")
_RESP_EXAMPLE = "{type: resp, host: 127.0.0.1, port: 6379}"
_LMC = "lmcache.v1.distributed.l2_adapters"


def host_problem(host: object, ipv6: bool = True) -> str | None:
    if not isinstance(host, str) or not host:
        return "it is empty" if host == "" else f"it is not a string ({type(host).__name__})"
    if len(host) > 253:
        return "it is longer than 253 characters"
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return "it is neither a host name nor an IP address"
        return None if ipv6 else "an IPv6 address: LMCache's RESP client connects over IPv4 only"
    if not _HOSTNAME.match(host):
        return (
            "a host name is dot-separated labels of letters, digits, - and _ (no space or control character)"
        )
    if all(label.isdigit() for label in host.rstrip(".").split(".")):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return "it is not an IPv4 address (four numbers 0-255)"
    return None


def check_adapter(raw: Any, source: str) -> dict[str, Any]:
    if not isinstance(raw, dict) or not isinstance(raw.get("type"), str) or not raw["type"]:
        raise ConfigError(
            f"tiers.remote.adapter: got {shown(raw, 80)} ({source}); expected an LMCache L2 adapter's "
            f"settings with its type, e.g. {_RESP_EXAMPLE} (types: resp, mooncake_store, s3, valkey, fs, …)"
        )
    kind = raw["type"]
    if kind not in ADAPTER_TYPES:
        close = difflib.get_close_matches(kind, ADAPTER_TYPES, n=1, cutoff=0.6)
        raise ConfigError(
            f"tiers.remote.adapter.type: got {shown(kind, 80)} ({source}); "
            + (f"did you mean {close[0]}? " if close else "")
            + f"LMCache's adapter types are {', '.join(ADAPTER_TYPES)} (a third-party adapter: type plugin, "
            "with module_path and class_name)"
        )
    if len(raw) > _MAX_KEYS:
        raise ConfigError(
            f"tiers.remote.adapter: {len(raw)} keys ({source}); an adapter takes at most {_MAX_KEYS}"
        )
    for key, value in raw.items():
        _check_value(f"tiers.remote.adapter.{_name(key)}", key, value, source, 0)
    if kind == "resp":
        _check_resp(raw, source)
    _check_bounds(raw, source)
    _lmcache_accepts(kind, {k: v for k, v in raw.items() if k != "type"}, source)
    if kind in ("plugin", "native_plugin"):
        _importable(raw["module_path"], source)
    return dict(raw)


def _check_resp(raw: dict[str, Any], source: str) -> None:
    unknown = [k for k in raw if k not in RESP_KEYS]
    if unknown:
        raise ConfigError(
            f"tiers.remote.adapter: unknown key(s) {', '.join(shown(k, 40) for k in unknown[:6])} for type "
            f"resp ({source}); its keys are {', '.join(RESP_KEYS)} (LMCache would ignore the others)"
        )
    for key in ("host", "port"):
        if key not in raw:
            raise ConfigError(
                f"tiers.remote.adapter.{key}: required for type resp ({source}); e.g. {_RESP_EXAMPLE}, "
                "or tiers.remote.url: redis://HOST:PORT"
            )
    why = host_problem(raw["host"], ipv6=False)
    if why is not None:
        raise ConfigError(
            f"tiers.remote.adapter.host: got {shown(raw['host'], 80)} ({source}): {why}; expected a DNS name "
            "or an IPv4 address of the Redis/Valkey server, e.g. 127.0.0.1 or cache.internal"
        )


def _check_bounds(raw: dict[str, Any], source: str) -> None:
    if "port" in raw:
        _integer("tiers.remote.adapter.port", raw["port"], 1, 65535, "the server's TCP port", source)
    for key, most in _COUNTS.items():
        if key in raw:
            _integer(
                f"tiers.remote.adapter.{key}", raw[key], 1, most, "threads (LMCache starts them all)", source
            )
    per_op = raw.get("per_op_workers")
    if isinstance(per_op, dict):
        for op, n in per_op.items():
            name = f"tiers.remote.adapter.per_op_workers.{_name(op)}"
            _integer(name, n, 1, MAX_WORKERS, "threads for that operation", source)
    if "max_capacity_gb" in raw:
        value = raw["max_capacity_gb"]
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not 0 <= value <= MAX_CAPACITY_GB
        ):
            raise ConfigError(
                f"tiers.remote.adapter.max_capacity_gb: got {shown(value, 80)} ({source}); expected a number "
                f"of GB in 0..{MAX_CAPACITY_GB} (0: no limit)"
            )
    nodes = raw.get("startup_nodes")
    if isinstance(nodes, str):
        for node in (n.strip() for n in nodes.split(",") if n.strip()):
            host, _, port = node.rpartition(":")
            why = host_problem(host.strip("[]"))
            if why is None and not (port.isdigit() and 0 < int(port) < 65536):
                why = "its port is not 1..65535"
            if why is not None:
                raise ConfigError(
                    f"tiers.remote.adapter.startup_nodes: entry {shown(node, 80)} ({source}): {why}; "
                    "expected host:port[,host:port…], e.g. 10.0.0.5:6379"
                )


def _check_value(name: str, key: object, value: Any, source: str, depth: int) -> None:
    """Every string free of NUL and control characters (C libraries cut or misread them), every number
    finite, nesting and sizes bounded."""
    hidden = isinstance(key, str) and any(word in key.lower() for word in _SECRET_WORDS)
    shown_value = "(not shown)" if hidden else shown(value, 80)
    if depth > _MAX_DEPTH or (isinstance(value, (dict, list)) and len(value) > _MAX_KEYS):
        raise ConfigError(f"{name}: nested too deep or too large ({source}); expected plain adapter settings")
    if isinstance(value, str) and (len(value) > 4096 or any(ord(c) < 32 or ord(c) == 127 for c in value)):
        raise ConfigError(
            f"{name}: got {shown_value} ({source}); a setting is at most 4096 characters, without control "
            "characters (NUL, newline, tab, …)"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{name}: got {shown_value} ({source}); expected a finite number")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**63:
        raise ConfigError(f"{name}: got {shown_value} ({source}); expected a number below 2^63")
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        _check_value(f"{name}.{_name(k)}", k, v, source, depth + 1)


def _integer(name: str, value: Any, low: int, high: int, what: str, source: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(
            f"{name}: got {shown(value, 80)} ({source}); expected an integer {low}..{high}: {what}"
        )


def _importable(module_path: str, source: str) -> None:
    """A plugin's module (LMCache imports it when the adapter is created): findable here."""
    try:
        found = importlib.util.find_spec(module_path) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ConfigError(
            f"tiers.remote.adapter.module_path: {shown(module_path, 80)} cannot be imported here ({source}); "
            "expected the dotted import path of an installed module holding the adapter class"
        )


def _lmcache_accepts(kind: str, settings: dict[str, Any], source: str) -> None:
    """Import the type's LMCache module (its dependencies with it) and parse the settings with its config
    class, as the store will when it connects."""
    try:
        importlib.import_module(f"{_LMC}.{kind.replace('-', '_')}_l2_adapter")
        config_class = importlib.import_module(f"{_LMC}.config").get_l2_adapter_config_class(kind)
    except ImportError as exc:
        missing = f"the Python module {exc.name!r}" if exc.name else shown(str(exc), 80)
        raise ConfigError(
            f"tiers.remote.adapter.type: {kind} needs {missing}, which is not installed here ({source}); "
            "install the package that provides it, or choose another adapter type"
        ) from None
    except Exception as exc:  # a native library that fails to load, …
        raise ConfigError(
            f"tiers.remote.adapter.type: LMCache's {kind} adapter cannot be loaded here ({source}): "
            f"{_text(exc, 200)}"
        ) from None
    try:
        config_class.from_dict(dict(settings))
    except Exception as exc:
        raise ConfigError(
            f"tiers.remote.adapter: LMCache's {kind} adapter refuses these settings ({source}): "
            f"{_text(exc, 300)}; see the fields of LMCache's {kind} adapter"
        ) from None


def _name(key: object) -> str:
    """A settings key as a message names it: bare when it is a short identifier, else quoted."""
    return key if isinstance(key, str) and key.isidentifier() and len(key) <= 40 else shown(key, 40)


def _text(exc: BaseException, limit: int) -> str:
    """An exception's message on one line, at most `limit` characters."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"
