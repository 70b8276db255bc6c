"""The disk tier's host buffers (worker side): what the store writes from and reads into, page-aligned for
direct I/O, in huge pages where the kernel offers them (direct.aligned), allocated once and reused.

Provides:
    ARENA_SLOTS                          32: values allocated a buffer at a time (the writer's batch: 26 MB
                                         at Llama-3.1-8B's k8v4 blocks, in huge pages)
    ValuePool(slot_bytes, value_bytes)   the values the writer encodes blocks into (RemoteStore.new_value's
                                         contract), each the head of a zero-padded slot-sized buffer
        new_value() -> [value_bytes] uint8   a free value (more allocated when none is)
        release(values)                  values the writer is done with: free again
        reserve(values) -> int           allocate up to `values` values now (at start: allocating can take
                                         100 ms, never on a step's thread); the bytes held
        slot_buffers(values) -> list     each value's slot-sized buffer, as written to its slot: the pool's
                                         own, else a row of this thread's staging buffer the value is
                                         copied into (zero padded: only values are ever copied in)
        held                             values allocated
    ReadBuffer()                         a buffer that gets read into, grown to the largest batch and reused
                                         (populating fresh pages for every batch costs about as much as
                                         reading them); one per batch in flight
        take(nbytes) -> mmap
Thread-safe (a ReadBuffer: one read at a time).
"""

from __future__ import annotations

import mmap
import threading
from collections.abc import Sequence

import numpy as np
import torch

from tiercache.disk.direct import aligned

ARENA_SLOTS = 32


class ValuePool:
    def __init__(self, slot_bytes: int, value_bytes: int) -> None:
        self.slot_bytes = slot_bytes
        self.value_bytes = value_bytes
        self._lock = threading.Lock()
        self._slots: dict[int, memoryview] = {}  # each value's slot buffer, by the value's address
        self._free: list[torch.Tensor] = []
        self._staging = threading.local()  # an aligned [n, slot_bytes] buffer per thread, for other values

    @property
    def held(self) -> int:
        with self._lock:
            return len(self._slots)

    @property
    def free(self) -> int:
        with self._lock:
            return len(self._free)

    def new_value(self) -> torch.Tensor:
        while True:
            with self._lock:
                if self._free:
                    return self._free.pop()
            self._add_arena()

    def release(self, values: Sequence[torch.Tensor]) -> None:
        with self._lock:
            self._free.extend(v for v in values if v.data_ptr() in self._slots)

    def reserve(self, values: int) -> int:
        while self.held < values:
            self._add_arena()
        return self.held * self.slot_bytes

    def slot_buffers(self, values: Sequence[torch.Tensor]) -> list:
        with self._lock:
            bufs: list = [self._slots.get(v.data_ptr()) for v in values]
        others = [k for k, buf in enumerate(bufs) if buf is None]
        if others:
            size = self.slot_bytes
            staging = getattr(self._staging, "buf", None)
            if staging is None or len(staging) < len(others) * size:
                staging = self._staging.buf = aligned(len(others) * size)
            rows = np.frombuffer(staging, np.uint8, len(others) * size).reshape(len(others), size)
            view = memoryview(staging)
            for row, k in enumerate(others):
                rows[row, : values[k].numel()] = values[k].numpy()
                bufs[k] = view[row * size : (row + 1) * size]
        return bufs

    def _add_arena(self) -> None:
        """ARENA_SLOTS more values in one buffer (zeroed: the padding past each value stays zero)."""
        arena = aligned(ARENA_SLOTS * self.slot_bytes)
        view, size = memoryview(arena), self.slot_bytes
        values = [
            torch.frombuffer(arena, dtype=torch.uint8, count=self.value_bytes, offset=k * size)
            for k in range(ARENA_SLOTS)
        ]
        with self._lock:
            for k, value in enumerate(values):
                self._slots[value.data_ptr()] = view[k * size : (k + 1) * size]
            self._free.extend(reversed(values))  # taken in the arena's order


class ReadBuffer:
    def __init__(self) -> None:
        self._mem = aligned(0)

    def take(self, nbytes: int) -> mmap.mmap:
        if len(self._mem) < nbytes:
            self._mem = aligned(nbytes)
        return self._mem
