"""Near-duplicate lookup for 64-bit key sketches (SimHash-style), feeding the graph's `semantic` edges.

Provides `SketchIndex`: `add(block, sketch) -> similar blocks`, `remove(block)`. Banded LSH: the sketch is
split into `bands` bands; blocks sharing a band value are candidates, kept when the Hamming distance of the
full sketches is at most `max_hamming`. Buckets hold at most `bucket_cap` blocks, so one add costs O(bands ·
bucket_cap) whatever the number of blocks.
"""

from __future__ import annotations

from collections.abc import Hashable


class SketchIndex:
    def __init__(self, bands: int = 4, max_hamming: int = 6, bucket_cap: int = 16) -> None:
        if 64 % bands:
            raise ValueError(f"bands must divide 64, got {bands}")
        self.bands, self.max_hamming, self.bucket_cap = bands, max_hamming, bucket_cap
        self._width = 64 // bands
        self._mask = (1 << self._width) - 1
        self._buckets: dict[tuple[int, int], list[Hashable]] = {}
        self._sketch: dict[Hashable, int] = {}

    def __len__(self) -> int:
        return len(self._sketch)

    def _keys(self, sketch: int) -> list[tuple[int, int]]:
        return [(i, (sketch >> (i * self._width)) & self._mask) for i in range(self.bands)]

    def add(self, block: Hashable, sketch: int) -> list[Hashable]:
        """Index `block`; returns the indexed blocks within `max_hamming` bits of its sketch."""
        sketch &= (1 << 64) - 1
        self.remove(block)
        similar: dict[Hashable, None] = {}
        for key in self._keys(sketch):
            bucket = self._buckets.setdefault(key, [])
            for other in bucket:
                if (sketch ^ self._sketch[other]).bit_count() <= self.max_hamming:
                    similar[other] = None
            if len(bucket) < self.bucket_cap:
                bucket.append(block)
        self._sketch[block] = sketch
        return list(similar)

    def remove(self, block: Hashable) -> None:
        sketch = self._sketch.pop(block, None)
        if sketch is None:
            return
        for key in self._keys(sketch):
            bucket = self._buckets.get(key)
            if bucket and block in bucket:
                bucket.remove(block)
                if not bucket:
                    del self._buckets[key]

    def bucket_count(self) -> int:
        return len(self._buckets)
