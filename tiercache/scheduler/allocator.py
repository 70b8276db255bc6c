"""Slot allocator for one tier: slots 0..capacity-1, handed out as the fewest contiguous runs it can.

Provides:
    SlotAllocator(capacity, name)
        allocate(n) -> list[int] | None   n slots (None if fewer than n are free); one run when a free run
                                           of length ≥ n exists, else the largest runs first
        free(slots)                        return slots; neighbours coalesce; freeing a free slot raises
        num_free, num_used, capacity, is_used(slot), runs(), check()

Contiguous runs matter for the DRAM tier: a spill batch placed in one run of pinned slots is one DMA, with no
CPU-side scatter. Free runs are kept in dicts by start and by end (O(1) coalescing) and in power-of-two size
buckets (a run of length ≥ n is found in O(log capacity)). Slot ids are the tier's own, independent of
vLLM's block ids.
"""

from __future__ import annotations

from collections.abc import Iterable

from tiercache.layout import contiguous_runs


class SlotAllocator:
    def __init__(self, capacity: int, name: str = "slots") -> None:
        if capacity < 0:
            raise ValueError(f"{name}: capacity must be ≥ 0, got {capacity}")
        self.capacity = capacity
        self.name = name
        self._used = bytearray(capacity)  # 1 = handed out
        self._num_free = capacity
        self._start_len: dict[int, int] = {}  # free run start → length
        self._end_start: dict[int, int] = {}  # free run end (exclusive) → start
        self._buckets: list[set[int]] = [set() for _ in range(max(capacity, 1).bit_length() + 1)]
        if capacity:
            self._add_run(0, capacity)

    @property
    def num_free(self) -> int:
        return self._num_free

    @property
    def num_used(self) -> int:
        return self.capacity - self._num_free

    def is_used(self, slot: int) -> bool:
        return bool(self._used[slot])

    def allocate(self, n: int) -> list[int] | None:
        if n < 0:
            raise ValueError(f"{self.name}: cannot allocate {n} slots")
        if n > self._num_free:
            return None
        slots: list[int] = []
        while len(slots) < n:
            start = self._pick_run(n - len(slots))
            length = self._remove_run(start)
            take = min(length, n - len(slots))
            if take < length:
                self._add_run(start + take, length - take)
            slots.extend(range(start, start + take))
        for slot in slots:
            self._used[slot] = 1
        self._num_free -= n
        return slots

    def free(self, slots: Iterable[int]) -> None:
        ordered = sorted(slots)
        for i, slot in enumerate(ordered):
            if not 0 <= slot < self.capacity or not self._used[slot] or (i and ordered[i - 1] == slot):
                raise ValueError(f"{self.name}: slot {slot} is not in use (double free or out of range)")
        for slot in ordered:
            self._used[slot] = 0
        self._num_free += len(ordered)
        for start, length in contiguous_runs(ordered):
            left = self._end_start.get(start)
            if left is not None:
                length += self._remove_run(left)
                start = left
            right_len = self._start_len.get(start + length)
            if right_len is not None:
                length += self._remove_run(start + length)
            self._add_run(start, length)

    def runs(self) -> list[tuple[int, int]]:
        """Free runs (start, length), by start."""
        return sorted(self._start_len.items())

    def check(self) -> None:
        """Full invariant check, O(capacity): runs disjoint, coalesced, and exactly the unused slots."""
        free_bitmap = bytearray(self.capacity)
        prev_end = -1
        for start, length in self.runs():
            assert length > 0 and start > prev_end, f"{self.name}: runs overlap or touch at {start}"
            assert self._end_start[start + length] == start
            assert start in self._buckets[length.bit_length() - 1]
            free_bitmap[start : start + length] = b"\x01" * length
            prev_end = start + length
        assert sum(free_bitmap) == self._num_free, f"{self.name}: free count disagrees with runs"
        assert all(f != u for f, u in zip(free_bitmap, self._used, strict=True)), f"{self.name}: slot both"
        assert len(self._end_start) == len(self._start_len) == sum(len(b) for b in self._buckets)

    def _pick_run(self, n: int) -> int:
        """Start of a free run: the smallest bucket whose runs all hold ≥ n, else one that happens to,
        else the largest run (the caller then takes it whole and asks again)."""
        need = (n - 1).bit_length()  # bucket b holds lengths in [2**b, 2**(b+1)); b ≥ need ⇒ length ≥ n
        for b in range(need, len(self._buckets)):
            if self._buckets[b]:
                return next(iter(self._buckets[b]))
        if need > 0:
            for start in self._buckets[need - 1]:
                if self._start_len[start] >= n:
                    return start
        for b in range(len(self._buckets) - 1, -1, -1):
            if self._buckets[b]:
                return max(self._buckets[b], key=self._start_len.__getitem__)
        raise AssertionError(f"{self.name}: no free run although {self._num_free} slots are free")

    def _add_run(self, start: int, length: int) -> None:
        self._start_len[start] = length
        self._end_start[start + length] = start
        self._buckets[length.bit_length() - 1].add(start)

    def _remove_run(self, start: int) -> int:
        length = self._start_len.pop(start)
        del self._end_start[start + length]
        self._buckets[length.bit_length() - 1].discard(start)
        return length
