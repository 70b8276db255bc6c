"""The tiercache error family: user mistakes and resource failures, each message naming the fix.

Provides:
    TierCacheError        base class
    ConfigError           a bad config value (a ValueError): names the key, the bad value, the accepted forms
    PoolAllocationError   a pool could not be allocated (a MemoryError): states the size asked and available
    shown(value, limit=200) -> str   a user value as a message may quote it: a repr of at most `limit`
                                     characters, whatever its size or nesting (never the whole of a big value)
"""

from __future__ import annotations

import reprlib

SHOWN_LIMIT = 200


class TierCacheError(Exception):
    """Base class of tiercache's own errors."""


class ConfigError(TierCacheError, ValueError):
    """A config value is wrong; the message names the key, the bad value and the accepted forms."""


class PoolAllocationError(TierCacheError, MemoryError):
    """A tier pool could not be allocated; the message states the bytes asked and the bytes available."""


def _repr() -> reprlib.Repr:
    r = reprlib.Repr()  # bounded at every level: a YAML alias bomb or a 1 MB request shows as a few lines
    r.maxlevel, r.maxdict, r.maxlist, r.maxtuple, r.maxset = 3, 6, 6, 6, 6
    r.maxstring, r.maxother, r.maxlong = SHOWN_LIMIT, SHOWN_LIMIT, 60
    return r


_REPR = _repr()


def shown(value: object, limit: int = SHOWN_LIMIT) -> str:
    try:
        text = _REPR.repr(value)
    except Exception:  # a huge int (over the int→str limit), a repr that raises, RecursionError
        if isinstance(value, int):
            text = f"<an integer of {value.bit_length():,} bits>"
        else:
            text = f"<a {type(value).__name__} that cannot be shown>"
    return text if len(text) <= limit else text[: limit - 1] + "…"
