"""Human units for sizes, token counts and durations.

Provides:
    parse_bytes(value) -> int          "4GiB", "512MiB", "1.5 GB", 1024 → bytes (binary and decimal suffixes)
    parse_tokens(value) -> int | None  "2M tokens", "500k tokens" → tokens; None if not a token size
    parse_size(value) -> Size          a tier size: bytes or tokens
    parse_duration(value) -> float     "500ms", "2s", "1.5 min", "250us", 0.5 → seconds
    format_bytes(n) -> str             4294967296 → "4.00 GiB"
    Size                               frozen (bytes or tokens); .to_bytes(bytes_per_token)
    MAX_COUNT (2^63 - 1), MAX_DURATION (1 day)   the largest size/token count and duration accepted

Parsers raise ValueError with the value (shortened: errors.shown) and the accepted forms; config.py adds the
key name. Infinite, NaN, negative and out-of-range numbers are refused here, so no caller meets an
OverflowError or a NaN later.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from tiercache.errors import shown

_BYTE_UNITS = {
    "": 1, "b": 1,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
}  # fmt: skip
_COUNT_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "b": 10**9}
_TIME_UNITS = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0, "min": 60.0, "m": 60.0, "h": 3600.0}
_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)"
_BYTES_RE = re.compile(rf"^{_NUMBER}\s*([a-z]*)$")
_TOKENS_RE = re.compile(rf"^{_NUMBER}\s*([a-z]?)\s*tokens?$")
_TIME_RE = re.compile(rf"^{_NUMBER}\s*([a-zµ]*)$")

BYTES_FORMS = '"4GiB", "512MiB", "1.5GB", or an integer number of bytes'
SIZE_FORMS = BYTES_FORMS + ', or a token count such as "2M tokens"'
DURATION_FORMS = '"500ms", "2s", "1min", "250us", or a number of seconds'
MAX_COUNT = 2**63 - 1  # bytes or tokens: what an int64 holds
MAX_DURATION = 86_400.0  # seconds


@dataclass(frozen=True)
class Size:
    """A tier size: exactly one of `bytes` and `tokens` is set (as written in the config)."""

    bytes: int | None = None
    tokens: int | None = None

    def __post_init__(self) -> None:
        if (self.bytes is None) == (self.tokens is None):
            raise ValueError("Size needs exactly one of bytes and tokens")

    def to_bytes(self, bytes_per_token: float | None = None) -> int:
        """Bytes this size stands for; a token size needs the geometry's bytes per token."""
        if self.bytes is not None:
            return self.bytes
        if bytes_per_token is None:
            raise ValueError(f"{self} is a token count: bytes_per_token is needed to convert it")
        return int(self.tokens * bytes_per_token)

    def __str__(self) -> str:
        return format_bytes(self.bytes) if self.bytes is not None else f"{self.tokens:,} tokens"


def parse_bytes(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"expected a size such as {BYTES_FORMS}, got {shown(value)}")
    if isinstance(value, (int, float)):
        number, unit = value, ""
    else:
        match = _BYTES_RE.match(value.strip().lower())
        if not match or match.group(2) not in _BYTE_UNITS:
            raise ValueError(f"expected a size such as {BYTES_FORMS}, got {shown(value)}")
        number, unit = float(match.group(1)), match.group(2)
    return _count(number, _BYTE_UNITS[unit], value, "size", "bytes")


def parse_tokens(value: object) -> int | None:
    if not isinstance(value, str):
        return None
    match = _TOKENS_RE.match(value.strip().lower())
    if not match:
        return None
    if match.group(2) not in _COUNT_UNITS:
        raise ValueError(f'expected a token count such as "2M tokens" or "500k tokens", got {shown(value)}')
    return _count(float(match.group(1)), _COUNT_UNITS[match.group(2)], value, "token count", "tokens")


def _count(number: float, unit: int, value: object, what: str, units: str) -> int:
    """number × unit as an int in 0..MAX_COUNT; ValueError naming the value otherwise (never Overflow)."""
    if isinstance(number, float) and math.isnan(number):
        raise ValueError(f"a {what} must be a number, got {shown(value)}")
    if number < 0:
        raise ValueError(f"a {what} must not be negative, got {shown(value)}")
    if number * unit > MAX_COUNT:  # int × int is exact; float × int may be inf, compared without error
        raise ValueError(f"a {what} must be at most {MAX_COUNT:,} {units} (int64), got {shown(value)}")
    return int(number * unit)


def parse_size(value: object) -> Size:
    """A tier size: "4GiB" → Size(bytes=…), "2M tokens" → Size(tokens=2_000_000)."""
    if isinstance(value, str) and "token" in value.lower():
        tokens = parse_tokens(value)
        if tokens is None:
            raise ValueError(f"expected a size such as {SIZE_FORMS}, got {shown(value)}")
        return Size(tokens=tokens)
    try:
        return Size(bytes=parse_bytes(value))
    except ValueError as exc:
        if str(exc).startswith("expected"):
            raise ValueError(f"expected a size such as {SIZE_FORMS}, got {shown(value)}") from None
        raise ValueError(f"{exc}; expected a size such as {SIZE_FORMS}") from None


def parse_duration(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"expected a duration such as {DURATION_FORMS}, got {shown(value)}")
    if isinstance(value, int):
        seconds = float(min(max(value, -(2**64)), 2**64))  # huge ints: out of range below, not Overflow
    elif isinstance(value, float):
        seconds = value
    else:
        match = _TIME_RE.match(value.strip().lower())
        unit = match.group(2) if match else None
        if not match or (unit and unit not in _TIME_UNITS):
            raise ValueError(f"expected a duration such as {DURATION_FORMS}, got {shown(value)}")
        seconds = float(match.group(1)) * _TIME_UNITS[unit or "s"]
    if math.isnan(seconds) or (isinstance(value, float) and math.isinf(value)):
        raise ValueError(f"a duration must be a finite number, got {shown(value)}; expected {DURATION_FORMS}")
    if seconds < 0:
        raise ValueError(f"a duration must not be negative, got {shown(value)}")
    if seconds > MAX_DURATION:
        raise ValueError(f"a duration must be at most {MAX_DURATION:.0f}s (1 day), got {shown(value)}")
    return seconds


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} B" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
