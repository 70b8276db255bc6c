"""One YAML file → frozen, validated config objects.

Provides:
    TierCacheConfig     codec, tiers, eviction, inspect (all frozen); from_dict / from_yaml / load / to_dict
                        (from_yaml: a file without settings — empty, only comments — is a ConfigError)
        .check_memory(bytes_per_token, …)   a tier larger than the machine → ConfigError with both numbers
        .check_blocks(capacity, layout)     a tier that holds no whole block → ConfigError naming the minimum
                                            (called where capacities are computed: layout.tier_capacities)
    TiersConfig         vram, dram: Size (bytes or tokens), per rank; dram 0 turns the DRAM tier off;
                        remote: RemoteConfig | None (config_remote.py), a store shared by engines
                        disk: DiskConfig | None (config_disk.py), local files that survive a restart
    EvictionConfig      policy ("graph" | "lru"), advisor_interval, max_stale (seconds, > 0, finite);
                        advisor_interval is the longest wait between the advisor's re-rankings (it
                        re-ranks sooner after a change: tiercache.graph.cadence)
    InspectConfig       socket: a unix socket path, "auto" or "off"; recent_requests (128) and
                        remembered_departures (65536): what explain_request can answer from
    CONFIG_ENV          "TIERCACHE_CONFIG": the file load() reads when no path is given
    DEFAULT_CODEC, POLICIES, ROTATIONS             (from config_values.py, which checks each key)
    host_memory_bytes() / device_memory_bytes()   what the machine has (for the start-up check)

Shape (every key optional; see examples/tiers.yaml):
    codec: k8v4              # preset (balanced, capacity, tq4, k8v4, …, none), k5v3, or {keys: 8, values: 4}
                             # (+ key_codebook / value_codebook: lloyd | uniform, default lloyd)
                             # (+ exact_layers: [0, 1, -2, -1]: primary mode keeps these layers exact)
    tiers: {vram: 4GiB, dram: 8GiB}        # or "2M tokens"
    tiers.remote: {url: redis://127.0.0.1:6379, timeout: 50ms, write: through, queue_blocks: 256}   # optional
    tiers.disk: {path: /nvme/tiercache, size: 500GiB, write: evicted, queue_blocks: 256}   # optional
    eviction: {policy: graph, advisor_interval: 500ms, max_stale: 2s}   # max_stale ≥ advisor_interval;
                                           # left out, it is max(2s, 4 × advisor_interval)
    inspect: {socket: auto, recent_requests: 128, remembered_departures: 65536}
Every value is checked at load, in time linear in its size. An error is one line (at most 1 KiB) naming the
key, the value (shortened to at most ~200 characters: errors.shown; paths: errors.clipped) and the fix; all
unknown keys of a file are reported at once, with a "did you mean". Files are read by config_yaml.read_yaml
(regular files only; bounded size, depth and alias expansion; no duplicate keys); the per-key checks are in
config_values.py.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tiercache.codecs import PRESETS, KVCodecSpec
from tiercache.config_disk import DiskConfig, disk_config
from tiercache.config_remote import RemoteConfig, remote_config
from tiercache.config_values import (
    DEFAULT_CODEC,
    POLICIES,
    ROTATIONS,
    check_unknown_keys,
    codec_spec,
    eviction_values,
    inspect_values,
    section,
    tier_size,
)
from tiercache.config_yaml import read_yaml
from tiercache.errors import ConfigError, clipped, shown
from tiercache.units import Size, format_bytes

__all__ = ["CONFIG_ENV", "DEFAULT_CODEC", "POLICIES", "ROTATIONS", "EvictionConfig", "InspectConfig",
           "TierCacheConfig", "TiersConfig", "device_memory_bytes", "host_memory_bytes", "merge"]  # fmt: skip

CONFIG_ENV = "TIERCACHE_CONFIG"
MAX_GPU_BYTES = 2**40  # more than any one GPU has: the VRAM bound where this process cannot see the GPU


@dataclass(frozen=True)
class TiersConfig:
    vram: Size = field(default_factory=lambda: Size(bytes=4 * 2**30))
    dram: Size = field(default_factory=lambda: Size(bytes=8 * 2**30))
    remote: RemoteConfig | None = None  # a shared store below DRAM (config_remote.py); None: no remote tier
    disk: DiskConfig | None = None  # local files below DRAM, above remote (config_disk.py); None: none


@dataclass(frozen=True)
class EvictionConfig:
    policy: str = "graph"
    advisor_interval: float = 0.5  # seconds: the longest wait between re-rankings (a change re-ranks sooner)
    max_stale: float = 2.0  # seconds; an older advisor snapshot → LRU fallback, recorded in the decision


@dataclass(frozen=True)
class InspectConfig:
    socket: str = "auto"  # a unix socket path, "auto" or "off"
    recent_requests: int = 128  # admissions explain_request remembers (each keeps its prompt's block hashes)
    remembered_departures: int = 65_536  # blocks whose departure from the tiers is remembered


@dataclass(frozen=True)
class TierCacheConfig:
    codec: KVCodecSpec = field(default_factory=lambda: KVCodecSpec.from_preset(DEFAULT_CODEC))
    tiers: TiersConfig = field(default_factory=TiersConfig)
    eviction: EvictionConfig = field(default_factory=EvictionConfig)
    inspect: InspectConfig = field(default_factory=InspectConfig)
    source: str = "<defaults>"  # where it came from, for messages

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, source: str = "<dict>") -> TierCacheConfig:
        data = _expand_dotted({} if data is None else data, source)
        check_unknown_keys(data, source)
        tiers, eviction = section(data, "tiers", source), section(data, "eviction", source)
        inspect = section(data, "inspect", source)
        return cls(
            codec=codec_spec(data.get("codec", DEFAULT_CODEC), source),
            tiers=TiersConfig(
                vram=tier_size("tiers.vram", tiers.get("vram", "4GiB"), source),
                dram=tier_size("tiers.dram", tiers.get("dram", "8GiB"), source),
                remote=remote_config(tiers.get("remote"), source),
                disk=disk_config(tiers.get("disk"), source),
            ),
            eviction=EvictionConfig(*eviction_values(eviction, source)),
            inspect=InspectConfig(**inspect_values(inspect, source)),
            source=source,
        )

    @classmethod
    def from_yaml(cls, path: str | os.PathLike, overrides: dict[str, Any] | None = None) -> TierCacheConfig:
        data, name = read_yaml(Path(path)), clipped(str(path))
        if data is None:  # an empty file, only comments, or a bare null: a mistake, never "the defaults"
            raise ConfigError(
                f"{name}: the config file is empty (no settings, only blanks, comments or null); write the "
                "settings, e.g. codec: k8v4 and tiers: {vram: 4GiB, dram: 8GiB} (examples/tiers.yaml), or "
                "name no config file for the defaults"
            )
        if not isinstance(data, dict):
            raise ConfigError(
                f"{name}: the top level must be a mapping (codec:, tiers:, …), got {shown(data)}; "
                "see examples/tiers.yaml"
            )
        return cls.from_dict(merge(data, overrides or {}), source=name)

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
        plain = spec.name in PRESETS and (spec.seed, spec.rotation, spec.exact_layers) == (0, "haar", ())
        codec: Any = spec.name if plain else {
            "keys": spec.key_bits or "none", "values": spec.value_bits or "none",
            "seed": spec.seed, "rotation": spec.rotation,
        }  # fmt: skip
        if isinstance(codec, dict):  # optional keys only when set, so older readers still parse it
            for side, book in (("key", spec.key_codebook), ("value", spec.value_codebook)):
                if book != "lloyd":
                    codec[f"{side}_codebook"] = book
            if spec.exact_layers:
                codec["exact_layers"] = list(spec.exact_layers)
        return {
            "codec": codec,
            "tiers": {
                "vram": _size_str(self.tiers.vram),
                "dram": _size_str(self.tiers.dram),
                **({"remote": self.tiers.remote.to_dict()} if self.tiers.remote else {}),
                **({"disk": self.tiers.disk.to_dict()} if self.tiers.disk else {}),
            },
            "eviction": {
                "policy": self.eviction.policy,
                "advisor_interval": self.eviction.advisor_interval,
                "max_stale": self.eviction.max_stale,
            },
            "inspect": dataclasses.asdict(self.inspect),
        }

    def check_memory(
        self,
        bytes_per_token: float | None = None,
        host_bytes: int | None = None,
        device_bytes: int | None = None,
        check_device: bool = True,
        device_extra: tuple[int, str] = (0, ""),
    ) -> None:
        """Fail (ConfigError, with both numbers) when a tier asks for more memory than the machine has.
        device_extra: (bytes, what) the tiers also keep in the VRAM tier's memory beside its pool (the
        worker's per-slot checksum tables), added to what tiers.vram asks and named in the message.

        Token sizes are checked only when bytes_per_token is given; GPU memory only when known (CUDA) and
        check_device (the scheduler process passes False: it must not initialize CUDA). Where GPU memory is
        not known here, VRAM is still bounded by max(host memory, MAX_GPU_BYTES): no allocator of either
        process is ever asked for an absurd number of slots."""
        host_bytes = host_memory_bytes() if host_bytes is None else host_bytes
        if device_bytes is None and check_device:
            device_bytes = device_memory_bytes()
        vram_bound, vram_what = device_bytes, "GPU memory"
        if device_bytes is None and host_bytes is not None:  # the GPU is not visible from this process
            vram_bound, vram_what = max(host_bytes, MAX_GPU_BYTES), "memory on any GPU or this host"
        for key, size, have, what in (
            ("tiers.dram", self.tiers.dram, host_bytes, "host memory"),
            ("tiers.vram", self.tiers.vram, vram_bound, vram_what),
        ):
            if have is None or (size.tokens is not None and bytes_per_token is None):
                continue
            asked = size.to_bytes(bytes_per_token)
            extra = ""
            if key == "tiers.vram" and device_extra[0]:
                asked += device_extra[0]
                extra = f" with {device_extra[1]} ({format_bytes(device_extra[0])})"
            if asked > have:
                has = f"this machine has {format_bytes(have)} ({have:,} bytes) of {what}"
                if what != "GPU memory" and key == "tiers.vram":
                    has = f"no GPU has more than {format_bytes(have)}, nor this host"
                raise ConfigError(
                    f"{key}: {size}{extra} asks for {format_bytes(asked)} ({asked:,} bytes) but {has} "
                    f"({self.source}); lower {key}"
                )

    def check_blocks(self, capacity: Mapping[str, int], layout) -> None:
        """ConfigError when a tier holds no whole block of `layout` (a tiercache.layout.BlockLayout): VRAM
        needs one block at least, DRAM one block or exactly 0 (no DRAM tier). `capacity` is what
        tier_capacities(self, layout) computed; the message names the minimum in bytes and tokens."""
        for tier, size, per_block in (
            ("vram", self.tiers.vram, layout.block_bytes),
            ("dram", self.tiers.dram, layout.dram_stride),
        ):
            off = tier == "dram" and (size.bytes == 0 or size.tokens == 0)
            if capacity[tier] >= 1 or off:
                continue
            also = ", or 0 for no DRAM tier" if tier == "dram" else ""
            raise ConfigError(
                f"tiers.{tier}: {size} holds no whole block ({self.source}): one block of this model and "
                f"codec is {layout.block_size} tokens = {per_block:,} bytes per rank; set tiers.{tier} to at "
                f'least "{layout.block_size} tokens" or {per_block:,} bytes{also}'
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
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"config ({source}) must be a mapping such as {{codec: k8v4, tiers: {{vram: 4GiB}}}}, "
            f"got {shown(data)}"
        )
    out: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise ConfigError(f"config keys must be text, got {shown(key, 60)} ({source}); quote the key")
        if "." in key:
            head, rest = key.split(".", 1)
            value = {rest: value}
            key = head
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def _size_str(size: Size) -> str:
    return f"{size.bytes}" if size.bytes is not None else f"{size.tokens} tokens"
