"""The disk tier's segment files: fixed-size slots, one block's value each, `segment_slots` slots a file, so
that a batch of blocks is one large write and no file is created, renamed or deleted per block.

Provides:
    SEGMENT_BYTES                              1 GiB: a new directory's segment size
    new_segment_slots(slot_bytes) -> int       slots a segment of a new directory: SEGMENT_BYTES in whole
                                               slots, at least one (the index's head records what a
                                               directory uses)
    segment_name(k) -> str                     "seg-000007.dat"
    segment_numbers(directory) -> list[int]    the segments there, ascending
    Segments(directory, slot_bytes, segment_slots, direct)
        write(slot, bufs)                      len(bufs) values into consecutive slots of one segment from
                                               `slot`: one pwritev (direct I/O: each buffer slot_bytes long
                                               and page-aligned)
        read(slot, view) -> int                consecutive slots of one segment from `slot` into view (len a
                                               multiple of slot_bytes); the bytes read, short past the end of
                                               the segment (a truncated file)
        truncate(slots)                        keep slots below `slots`: segments wholly above deleted, the
                                               one across cut
        sync(), close()
    runs(slots, segment_slots, most) -> list[range]   index ranges of `slots` (None: no slot) whose slots
                                               follow one another in one segment, at most `most` long: each
                                               one read or write call

A segment grows as its slots are first written (appended, or sparse where a later slot comes first) and then
keeps its size: a slot freed by a drop is written over by the next block that takes it.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Sequence

from tiercache.disk.direct import open_data, read_at, write_at

SEGMENT_BYTES = 1 << 30
_NAME = re.compile(r"^seg-(\d{6,})\.dat$")


def new_segment_slots(slot_bytes: int) -> int:
    return max(1, SEGMENT_BYTES // slot_bytes)


def segment_name(k: int) -> str:
    return f"seg-{k:06d}.dat"


def segment_numbers(directory: str) -> list[int]:
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(int(m[1]) for m in map(_NAME.match, names) if m)


class Segments:
    def __init__(self, directory: str, slot_bytes: int, segment_slots: int, direct: bool) -> None:
        self.directory = directory
        self.slot_bytes = slot_bytes
        self.segment_slots = segment_slots
        self.direct = direct
        self._fds: dict[int, int] = {}
        self._lock = threading.Lock()

    def write(self, slot: int, bufs: Sequence) -> None:
        seg, first = divmod(slot, self.segment_slots)
        assert first + len(bufs) <= self.segment_slots, "a write crosses a segment's end"
        write_at(self._fd(seg), bufs, first * self.slot_bytes)

    def read(self, slot: int, view: memoryview) -> int:
        seg, first = divmod(slot, self.segment_slots)
        assert first + len(view) // self.slot_bytes <= self.segment_slots, "a read crosses a segment's end"
        return read_at(self._fd(seg), view, first * self.slot_bytes)

    def truncate(self, slots: int) -> None:
        for seg in segment_numbers(self.directory):
            keep = min(max(slots - seg * self.segment_slots, 0), self.segment_slots) * self.slot_bytes
            path = os.path.join(self.directory, segment_name(seg))
            if keep == 0:
                self._forget(seg)
                os.unlink(path)
            elif os.stat(path).st_size > keep:
                os.truncate(path, keep)

    def sync(self) -> None:
        with self._lock:
            fds = list(self._fds.values())
        for fd in fds:
            os.fdatasync(fd)

    def close(self) -> None:
        with self._lock:
            fds, self._fds = list(self._fds.values()), {}
        for fd in fds:
            os.close(fd)

    def _fd(self, seg: int) -> int:
        with self._lock:
            fd = self._fds.get(seg)
            if fd is None:
                fd = self._fds[seg] = open_data(os.path.join(self.directory, segment_name(seg)), self.direct)
            return fd

    def _forget(self, seg: int) -> None:
        with self._lock:
            fd = self._fds.pop(seg, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def runs(slots: Sequence[int | None], segment_slots: int, most: int) -> list[range]:
    """None stands for no slot: in no range."""
    out: list[range] = []
    start = None
    for k, slot in enumerate(slots):
        if start is not None and (
            slot is None or slot != slots[k - 1] + 1 or slot % segment_slots == 0 or k - start == most
        ):
            out.append(range(start, k))
            start = None
        if start is None and slot is not None:
            start = k
    if start is not None:
        out.append(range(start, len(slots)))
    return out
