"""The one least-recently-used order of the project: the tier index keeps one per tier, and the replay's LRU
simulator keeps one for its cache.

Provides:
    RecencyOrder     keys, least recently used first: add / touch (→ most recent) / discard / pop_oldest;
                     iteration is LRU first, reversed() most recent first; every operation O(1)
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterator


class RecencyOrder:
    __slots__ = ("_keys",)

    def __init__(self) -> None:
        self._keys: OrderedDict[Hashable, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __iter__(self) -> Iterator[Hashable]:
        """Least recently used first (lazy: stop early)."""
        return iter(self._keys)

    def __reversed__(self) -> Iterator[Hashable]:
        """Most recently used first."""
        return reversed(self._keys)

    def add(self, key: Hashable) -> None:
        """Insert as the most recent; a key already present just becomes the most recent."""
        if key in self._keys:
            self._keys.move_to_end(key)
        else:
            self._keys[key] = None

    def touch(self, key: Hashable) -> None:
        """Make a present key the most recent (KeyError if absent)."""
        self._keys.move_to_end(key)

    def discard(self, key: Hashable) -> None:
        self._keys.pop(key, None)

    def pop_oldest(self) -> Hashable:
        """Remove and return the least recently used key (KeyError when empty)."""
        if not self._keys:
            raise KeyError("pop_oldest from an empty RecencyOrder")
        return self._keys.popitem(last=False)[0]
