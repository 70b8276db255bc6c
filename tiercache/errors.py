"""The tiercache error family: user mistakes and resource failures, each message naming the fix.

Provides:
    TierCacheError        base class
    ConfigError           a bad config value (a ValueError): names the key, the bad value, the accepted forms
    PoolAllocationError   a pool could not be allocated (a MemoryError): states the size asked and available
"""

from __future__ import annotations


class TierCacheError(Exception):
    """Base class of tiercache's own errors."""


class ConfigError(TierCacheError, ValueError):
    """A config value is wrong; the message names the key, the bad value and the accepted forms."""


class PoolAllocationError(TierCacheError, MemoryError):
    """A tier pool could not be allocated; the message states the bytes asked and the bytes available."""
