"""The tiercache error family: user mistakes and resource failures, each message naming the fix.

Provides:
    TierCacheError        base class
    ConfigError           a bad config value (a ValueError): names the key, the bad value, the accepted forms;
                          its message is at most MAX_MESSAGE characters whatever it quotes (a longer one
                          keeps its start, which names the key, and its end, which names the fix)
    PoolAllocationError   a pool could not be allocated (a MemoryError): states the size asked and available
    shown(value, limit=200) -> str   a user value as a message may quote it: a repr of at most `limit`
                                     characters, whatever its size or nesting (never the whole of a big value)
    clipped(text, limit=200) -> str  text quoted as it is (a path, a command line): whole when short and
                                     printable, else escaped and cut in the middle, so both ends stay
"""

from __future__ import annotations

import reprlib

SHOWN_LIMIT = 200
MAX_MESSAGE = 1024


class TierCacheError(Exception):
    """Base class of tiercache's own errors."""


class ConfigError(TierCacheError, ValueError):
    """A config value is wrong; the message names the key, the bad value and the accepted forms."""

    def __init__(self, message: str) -> None:
        super().__init__(clipped(message, MAX_MESSAGE, escape=False))


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


def clipped(text: str, limit: int = SHOWN_LIMIT, escape: bool = True) -> str:
    if escape and not text.isprintable():  # a newline or a control character: shown escaped, on one line
        text = repr(text)[1:-1]
    if len(text) <= limit:
        return text
    head = (limit - 1) * 3 // 5
    return text[:head] + "…" + text[len(text) - (limit - 1 - head) :]
