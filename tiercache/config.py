"""One YAML file → frozen, validated config objects.

Provides:
    TierCacheConfig     codec, tiers, eviction, inspect (all frozen); from_dict / from_yaml / load / to_dict
    TiersConfig         vram, dram: Size (bytes or tokens), per rank
    EvictionConfig      policy ("graph" | "lru"), advisor_interval, max_stale (seconds)
    InspectConfig       socket: a unix socket path, "auto" or "off"
    CONFIG_ENV          "TIERCACHE_CONFIG": the file load() reads when no path is given
    host_memory_bytes() / device_memory_bytes()   what the machine has (for the start-up check)

Shape (every key optional; see examples/tiers.yaml):
    codec: k8v4              # preset (tq4, k8v4, k3v4, tq3, k8v8, k8v4u, none) or {keys: 8, values: 4}
                             # (+ key_codebook / value_codebook: lloyd | uniform, default lloyd)
    tiers: {vram: 4GiB, dram: 32GiB}       # or "2M tokens"
    eviction: {policy: graph, advisor_interval: 500ms, max_stale: 2s}
    inspect: {socket: auto}
Unknown keys are rejected with a "did you mean"; each error names the key, the bad value and the accepted
forms.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tiercache.codecs import CODEBOOKS, PRESETS, KVCodecSpec
from tiercache.errors import ConfigError
from tiercache.units import DURATION_FORMS, SIZE_FORMS, Size, format_bytes, parse_duration, parse_size

CONFIG_ENV = "TIERCACHE_CONFIG"
# Most compressed preset with ΔPPL ≤ 2 % on a real model (benchmarks/quality.py: K8V4 +1.03 %, K4V4 +7.97 %)
DEFAULT_CODEC = "k8v4"
POLICIES = ("graph", "lru")
ROTATIONS = ("haar", "hadamard")
_CODEC_FORMS = (
    f"a preset ({', '.join(PRESETS)}) or a mapping such as {{keys: 8, values: 4}} "
    f"(optionally key_codebook / value_codebook: {' or '.join(CODEBOOKS)})"
)
_CODEC_KEYS = ("keys", "values", "seed", "rotation", "key_codebook", "value_codebook")
_BITS_FORMS = 'an integer 1..8, or "none" for lossless'


@dataclass(frozen=True)
class TiersConfig:
    vram: Size = field(default_factory=lambda: Size(bytes=4 * 2**30))
    dram: Size = field(default_factory=lambda: Size(bytes=8 * 2**30))


@dataclass(frozen=True)
class EvictionConfig:
    policy: str = "graph"
    advisor_interval: float = 0.5  # seconds
    max_stale: float = 2.0  # seconds; an older advisor snapshot → LRU fallback, recorded in the decision


@dataclass(frozen=True)
class InspectConfig:
    socket: str = "auto"  # a unix socket path, "auto" or "off"


@dataclass(frozen=True)
class TierCacheConfig:
    codec: KVCodecSpec = field(default_factory=lambda: KVCodecSpec.from_preset(DEFAULT_CODEC))
    tiers: TiersConfig = field(default_factory=TiersConfig)
    eviction: EvictionConfig = field(default_factory=EvictionConfig)
    inspect: InspectConfig = field(default_factory=InspectConfig)
    source: str = "<defaults>"  # where it came from, for messages

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None, source: str = "<dict>") -> TierCacheConfig:
        data = _expand_dotted({} if data is None else data, source)
        _check_keys(data, ("codec", "tiers", "eviction", "inspect"), "", source)
        tiers = _section(data, "tiers", source)
        eviction = _section(data, "eviction", source)
        inspect = _section(data, "inspect", source)
        _check_keys(tiers, ("vram", "dram"), "tiers.", source)
        _check_keys(eviction, ("policy", "advisor_interval", "max_stale"), "eviction.", source)
        _check_keys(inspect, ("socket",), "inspect.", source)
        defaults = EvictionConfig()
        return cls(
            codec=_codec(data.get("codec", DEFAULT_CODEC), source),
            tiers=TiersConfig(
                vram=_value("tiers.vram", tiers.get("vram", "4GiB"), parse_size, SIZE_FORMS, source),
                dram=_value("tiers.dram", tiers.get("dram", "8GiB"), parse_size, SIZE_FORMS, source),
            ),
            eviction=EvictionConfig(
                policy=_choice("eviction.policy", eviction.get("policy", defaults.policy), POLICIES, source),
                advisor_interval=_value(
                    "eviction.advisor_interval",
                    eviction.get("advisor_interval", defaults.advisor_interval),
                    parse_duration, DURATION_FORMS, source,
                ),
                max_stale=_value(
                    "eviction.max_stale", eviction.get("max_stale", defaults.max_stale),
                    parse_duration, DURATION_FORMS, source,
                ),
            ),
            inspect=InspectConfig(socket=_socket(inspect.get("socket", "auto"), source)),
            source=source,
        )  # fmt: skip

    @classmethod
    def from_yaml(cls, path: str | os.PathLike, overrides: dict[str, Any] | None = None) -> TierCacheConfig:
        import yaml

        path = Path(path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read config file {str(path)!r}: {exc.strerror or exc}") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from None
        if data is not None and not isinstance(data, dict):
            raise ConfigError(f"{path}: the top level must be a mapping (codec:, tiers:, …), got {data!r}")
        return cls.from_dict(merge(data or {}, overrides or {}), source=str(path))

    @classmethod
    def load(
        cls, path: str | os.PathLike | None = None, overrides: dict[str, Any] | None = None
    ) -> TierCacheConfig:
        """Config from `path`, else $TIERCACHE_CONFIG, else defaults; `overrides` (nested/dotted) win."""
        path = path or os.environ.get(CONFIG_ENV) or None
        if path is None:
            return cls.from_dict(overrides or {}, source="<overrides>" if overrides else "<defaults>")
        return cls.from_yaml(path, overrides)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (msgpack/YAML-able) that from_dict reads back to an equal config."""
        spec = self.codec
        codec: Any = spec.name if spec.name in PRESETS and (spec.seed, spec.rotation) == (0, "haar") else {
            "keys": spec.key_bits or "none", "values": spec.value_bits or "none",
            "seed": spec.seed, "rotation": spec.rotation,
        }  # fmt: skip
        if isinstance(codec, dict):  # codebooks only when not the default, so older readers still parse it
            for side, book in (("key", spec.key_codebook), ("value", spec.value_codebook)):
                if book != "lloyd":
                    codec[f"{side}_codebook"] = book
        return {
            "codec": codec,
            "tiers": {"vram": _size_str(self.tiers.vram), "dram": _size_str(self.tiers.dram)},
            "eviction": {
                "policy": self.eviction.policy,
                "advisor_interval": self.eviction.advisor_interval,
                "max_stale": self.eviction.max_stale,
            },
            "inspect": {"socket": self.inspect.socket},
        }

    def check_memory(
        self,
        bytes_per_token: float | None = None,
        host_bytes: int | None = None,
        device_bytes: int | None = None,
        check_device: bool = True,
    ) -> None:
        """Fail (ConfigError, with both numbers) when a tier asks for more memory than the machine has.

        Token sizes are checked only when bytes_per_token is given; device memory only when known (CUDA) and
        check_device (the scheduler process passes False: it must not initialize CUDA)."""
        host_bytes = host_memory_bytes() if host_bytes is None else host_bytes
        if device_bytes is None and check_device:
            device_bytes = device_memory_bytes()
        for key, size, have, what in (
            ("tiers.dram", self.tiers.dram, host_bytes, "host memory"),
            ("tiers.vram", self.tiers.vram, device_bytes, "GPU memory"),
        ):
            if have is None or (size.tokens is not None and bytes_per_token is None):
                continue
            asked = size.to_bytes(bytes_per_token)
            if asked > have:
                raise ConfigError(
                    f"{key}: {size} asks for {format_bytes(asked)} ({asked:,} bytes) but this machine has "
                    f"{format_bytes(have)} ({have:,} bytes) of {what} ({self.source}); lower {key}"
                )


def merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Deep merge: mappings merge key by key, anything else in `overrides` replaces."""
    out = dict(_expand_dotted(base, "<config>"))
    for key, value in _expand_dotted(overrides, "<overrides>").items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def host_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def device_memory_bytes() -> int | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.mem_get_info()[1]


def _expand_dotted(data: Any, source: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ConfigError(f"config ({source}) must be a mapping, got {data!r}")
    out: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise ConfigError(f"config keys must be strings, got {key!r} ({source})")
        if "." in key:
            head, rest = key.split(".", 1)
            value = {rest: value}
            key = head
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def _check_keys(data: dict[str, Any], valid: tuple[str, ...], prefix: str, source: str) -> None:
    for key in data:
        if key not in valid:
            close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
            hint = f"; did you mean {prefix + close[0]!r}?" if close else ""
            raise ConfigError(
                f"unknown key {prefix + key!r} ({source}){hint} Valid keys here: {', '.join(valid)}"
            )


def _section(data: dict[str, Any], name: str, source: str) -> dict[str, Any]:
    value = data.get(name) or {}
    if not isinstance(value, dict):
        raise ConfigError(f"{name}: got {value!r} ({source}); expected a mapping of {name} settings")
    return value


def _value(key: str, raw: Any, parse, forms: str, source: str):
    try:
        return parse(raw)
    except ValueError:
        raise ConfigError(f"{key}: got {raw!r} ({source}); expected {forms}") from None


def _choice(key: str, raw: Any, valid: tuple[str, ...], source: str) -> str:
    if raw not in valid:
        close = difflib.get_close_matches(str(raw), valid, n=1, cutoff=0.5)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"{key}: got {raw!r} ({source}){hint}; expected one of: {', '.join(valid)}")
    return raw


def _socket(raw: Any, source: str) -> str:
    if raw is False or raw is None:
        return "off"
    if not isinstance(raw, str) or not raw.strip():
        raise ConfigError(f"inspect.socket: got {raw!r} ({source}); expected a unix socket path, auto or off")
    return raw


def _codec(raw: Any, source: str) -> KVCodecSpec:
    if isinstance(raw, str):
        if raw not in PRESETS:
            close = difflib.get_close_matches(raw, PRESETS, n=1, cutoff=0.5)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"codec: got {raw!r} ({source}){hint}; expected {_CODEC_FORMS}")
        return KVCodecSpec.from_preset(raw)
    if not isinstance(raw, dict):
        raise ConfigError(f"codec: got {raw!r} ({source}); expected {_CODEC_FORMS}")
    _check_keys(raw, _CODEC_KEYS, "codec.", source)
    for key in ("keys", "values"):
        if key not in raw:
            raise ConfigError(f"codec.{key}: missing ({source}); expected {_BITS_FORMS}")
    seed = raw.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"codec.seed: got {seed!r} ({source}); expected a non-negative integer")
    key_bits = _bits("codec.keys", raw["keys"], source)
    value_bits = _bits("codec.values", raw["values"], source)
    codebooks = {}
    for side, bits in (("key", key_bits), ("value", value_bits)):
        codebook = _choice(f"codec.{side}_codebook", raw.get(f"{side}_codebook", "lloyd"), CODEBOOKS, source)
        if bits is None and codebook != "lloyd":
            raise ConfigError(
                f"codec.{side}_codebook: got {codebook!r} ({source}) but codec.{side}s is lossless (none), "
                f"which has no codebook; drop codec.{side}_codebook or give codec.{side}s a bit width"
            )
        codebooks[f"{side}_codebook"] = codebook
    return KVCodecSpec(
        key_bits=key_bits,
        value_bits=value_bits,
        seed=seed,
        rotation=_choice("codec.rotation", raw.get("rotation", "haar"), ROTATIONS, source),
        **codebooks,
    )


def _bits(key: str, raw: Any, source: str) -> int | None:
    if raw is None or (isinstance(raw, str) and raw.lower() in ("none", "raw", "lossless")):
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= 8:
        raise ConfigError(f"{key}: got {raw!r} ({source}); expected {_BITS_FORMS}")
    return raw


def _size_str(size: Size) -> str:
    return f"{size.bytes}" if size.bytes is not None else f"{size.tokens} tokens"
