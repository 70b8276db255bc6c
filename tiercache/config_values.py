"""The checks of every config key: one function per key or section, each raising a one-line ConfigError
that names the key, the value (shortened: errors.shown) and the fix.

Provides:
    check_unknown_keys(data, source)       every unknown key of the top level and the sections, at once
    section(data, name, source) -> dict    a section (tiers, eviction, inspect): a mapping, or {} if left out
    tier_size(key, raw, source) -> Size    tiers.vram / tiers.dram (VRAM must not be 0)
    eviction_values(section, source) -> (policy, advisor_interval, max_stale)   durations > 0, finite,
                                           max_stale ≥ advisor_interval (the longest wait between the
                                           advisor's re-rankings: an idle ranking is never too stale)
    socket_value(raw, source) -> str       inspect.socket
    inspect_values(section, source) -> dict   InspectConfig's fields (socket, recent_requests, …)
    codec_spec(raw, source) -> KVCodecSpec codec: a preset or {keys, values, seed, rotation, *_codebook,
                                           exact_layers}; a null width is refused (lossless is "none")
    DEFAULT_CODEC, POLICIES, ROTATIONS, KEYS (the valid keys of each section)
"""

from __future__ import annotations

import difflib
from typing import Any

from tiercache.codecs import CODEBOOKS, EXACT_LAYERS_BOUND, PRESETS, WIDTHS_NAME, KVCodecSpec
from tiercache.errors import ConfigError, shown
from tiercache.units import DURATION_FORMS, Size, parse_duration, parse_size

# Most compressed preset with ΔPPL ≤ 2 % on a real model (benchmarks/quality.py: K8V4 +1.03 %, K4V4 +7.97 %)
DEFAULT_CODEC = "k8v4"
POLICIES = ("graph", "lru")
ROTATIONS = ("haar", "hadamard")
_CODEC_FORMS = (
    f"a preset ({', '.join(PRESETS)}), widths such as k5v3, or a mapping such as {{keys: 8, values: 4}} "
    f"(optionally key_codebook / value_codebook: {' or '.join(CODEBOOKS)}; exact_layers: [0, 1, -2, -1])"
)
_CODEC_KEYS = ("keys", "values", "seed", "rotation", "key_codebook", "value_codebook", "exact_layers")
_EXACT_FORMS = (
    "a list of distinct layer indices such as [0, 1, -2, -1] (negative: counted from the last layer, -1 the "
    "last), or [] for none"
)
_BITS_FORMS = 'an integer 1..8, or "none" for lossless'
KEYS = {
    "": ("codec", "tiers", "eviction", "inspect"),
    "tiers": ("vram", "dram", "remote", "disk"),
    "eviction": ("policy", "advisor_interval", "max_stale"),
    "inspect": ("socket", "recent_requests", "remembered_departures"),
    "codec": _CODEC_KEYS,
}
_SHOW_KEYS = 8  # unknown keys listed in one message
_EXAMPLES = {"tiers": "{vram: 4GiB, dram: 8GiB}", "eviction": "{policy: graph}", "inspect": "{socket: auto}"}


def check_unknown_keys(data: dict[str, Any], source: str) -> None:
    """Every unknown key of the top level and of each section, in one message."""
    unknown: list[tuple[str, str]] = []  # (section, key)
    for section, valid in KEYS.items():
        keys = data if not section else data.get(section)
        if isinstance(keys, dict):
            unknown += [(section, k) for k in keys if not isinstance(k, str) or k not in valid]
    if not unknown:
        return
    named = [_unknown(section, key) for section, key in unknown[:_SHOW_KEYS]]
    more = f" and {len(unknown) - _SHOW_KEYS} more" if len(unknown) > _SHOW_KEYS else ""
    sections = dict.fromkeys(section for section, _ in unknown)
    valid = "; ".join(f"{s + ': ' if s else ''}{', '.join(KEYS[s])}" for s in sections)
    what = "unknown key" if len(unknown) == 1 else f"{len(unknown)} unknown keys:"
    raise ConfigError(f"{what} {', '.join(named)}{more} ({source}). Valid keys here: {valid}")


def _unknown(section: str, key: Any) -> str:
    name = (section + "." if section else "") + (key if isinstance(key, str) else shown(key, 40))
    text = shown(name, 60)
    if not isinstance(key, str):
        return text + " (keys are text)"
    close = difflib.get_close_matches(key[:60], KEYS[section], n=1, cutoff=0.5)
    return f"{text} (did you mean {(section + '.' if section else '') + close[0]!r}?)" if close else text


def section(data: dict[str, Any], name: str, source: str) -> dict[str, Any]:
    value = data.get(name)
    if value is None:  # left out, or an empty "tiers:" line: the defaults
        return {}
    if not isinstance(value, dict):
        example = _EXAMPLES[name]
        raise ConfigError(
            f"{name}: got {shown(value)} ({source}); expected a mapping of {name} settings, such as "
            f"{name}: {example}"
        )
    return value


def _value(key: str, raw: Any, parse, source: str):
    try:
        return parse(raw)
    except ValueError as exc:  # the parser's message names the value (shortened) and the accepted forms
        raise ConfigError(f"{key}: {exc} ({source})") from None


def tier_size(key: str, raw: Any, source: str) -> Size:
    size = _value(key, raw, parse_size, source)
    if key == "tiers.vram" and (size.bytes == 0 or size.tokens == 0):
        raise ConfigError(
            f"tiers.vram: got {shown(raw)} ({source}); the VRAM tier takes every stored block first and "
            f'needs room for one block at least: set a size such as "4GiB" or "2M tokens"'
        )
    return size


def eviction_values(section: dict[str, Any], source: str) -> tuple[str, float, float]:
    """(policy, advisor_interval, max_stale); max_stale left out is max(2s, 4 × advisor_interval).
    advisor_interval is the longest wait between re-rankings (a change to the graph re-ranks sooner)."""
    policy = _choice("eviction.policy", section.get("policy", "graph"), POLICIES, source)
    interval = _positive("eviction.advisor_interval", section.get("advisor_interval", 0.5), source)
    if "max_stale" not in section:
        return policy, interval, max(2.0, 4 * interval)
    max_stale = _positive("eviction.max_stale", section["max_stale"], source)
    if max_stale < interval:
        raise ConfigError(
            f"eviction.max_stale: {max_stale:g}s is below eviction.advisor_interval ({interval:g}s) "
            f"({source}): every ranking would be stale before the next one and LRU would decide; set "
            f"max_stale ≥ advisor_interval (e.g. {max(2.0, 4 * interval):g}s)"
        )
    return policy, interval, max_stale


def _positive(key: str, raw: Any, source: str) -> float:
    seconds = _value(key, raw, parse_duration, source)
    if seconds <= 0:
        raise ConfigError(f"{key}: got {shown(raw)} ({source}); expected a duration > 0, {DURATION_FORMS}")
    return seconds


def _choice(key: str, raw: Any, valid: tuple[str, ...], source: str) -> str:
    if not isinstance(raw, str) or raw not in valid:
        close = difflib.get_close_matches(raw[:60], valid, n=1, cutoff=0.5) if isinstance(raw, str) else []
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"{key}: got {shown(raw)} ({source}){hint}; expected one of: {', '.join(valid)}")
    return raw


def socket_value(raw: Any, source: str) -> str:
    if raw is False or raw is None:
        return "off"
    if not isinstance(raw, str) or not raw.strip() or len(raw) > 4096 or "\0" in raw:
        raise ConfigError(
            f"inspect.socket: got {shown(raw)} ({source}); expected a unix socket path, auto or off"
        )
    return raw


def inspect_values(section: dict[str, Any], source: str) -> dict[str, Any]:
    return {
        "socket": socket_value(section.get("socket", "auto"), source),
        "recent_requests": _count(
            "inspect.recent_requests", section.get("recent_requests", 128), 1 << 20, source
        ),
        "remembered_departures": _count(
            "inspect.remembered_departures", section.get("remembered_departures", 65_536), 1 << 26, source
        ),
    }


def _count(key: str, raw: Any, hi: int, source: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw <= hi:
        raise ConfigError(f"{key}: got {shown(raw)} ({source}); expected an integer 0..{hi:,}")
    return raw


def codec_spec(raw: Any, source: str) -> KVCodecSpec:
    if isinstance(raw, str):
        if raw not in PRESETS and not WIDTHS_NAME.fullmatch(raw):
            close = difflib.get_close_matches(raw[:60], PRESETS, n=1, cutoff=0.5)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"codec: got {shown(raw)} ({source}){hint}; expected {_CODEC_FORMS}")
        return KVCodecSpec.from_preset(raw)
    if not isinstance(raw, dict):
        raise ConfigError(f"codec: got {shown(raw)} ({source}); expected {_CODEC_FORMS}")
    for key in ("keys", "values"):
        if key not in raw:
            raise ConfigError(f"codec.{key}: missing ({source}); expected {_BITS_FORMS}")
    seed = raw.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise ConfigError(f"codec.seed: got {shown(seed)} ({source}); expected an integer 0..2^63-1")
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
        exact_layers=_exact_layers(raw.get("exact_layers"), key_bits, value_bits, source),
    )


def _exact_layers(raw: Any, key_bits: int | None, value_bits: int | None, source: str) -> tuple[int, ...]:
    """codec.exact_layers: primary mode's layers kept exact (model-dtype pages), checked without the model."""
    if raw is None:
        return ()
    if not isinstance(raw, list | tuple):
        raise ConfigError(f"codec.exact_layers: got {shown(raw)} ({source}); expected {_EXACT_FORMS}")
    for index in raw:
        bound = EXACT_LAYERS_BOUND
        if isinstance(index, bool) or not isinstance(index, int) or not -bound <= index < bound:
            raise ConfigError(
                f"codec.exact_layers: got {shown(index)} in {shown(raw)} ({source}); expected {_EXACT_FORMS}"
            )
    seen: set[int] = set()
    for index in raw:  # one pass: a list of 131,072 layers is checked in milliseconds
        if index in seen:
            raise ConfigError(
                f"codec.exact_layers: layer {index} is listed twice in {shown(raw)} ({source}); list it once"
            )
        seen.add(index)
    if raw and (key_bits is None or value_bits is None):
        raise ConfigError(
            f"codec.exact_layers: got {shown(raw)} ({source}) but codec.keys or codec.values is lossless "
            "(none), which is exact already; give both a bit width or drop codec.exact_layers"
        )
    return tuple(raw)


def _bits(key: str, raw: Any, source: str) -> int | None:
    if raw is None:  # YAML's null (keys: null, or keys: with nothing after it) is no width, not lossless
        raise ConfigError(
            f"{key}: got null ({source}); expected {_BITS_FORMS}. A null or empty value is not read as "
            f'"none": write the width, or the word none'
        )
    if isinstance(raw, str) and raw.lower() in ("none", "raw", "lossless"):
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= 8:
        raise ConfigError(f"{key}: got {shown(raw)} ({source}); expected {_BITS_FORMS}")
    return raw
