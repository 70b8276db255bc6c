"""The disk tier's slot index: which block each slot of the segment files holds, one fixed-size record per
slot in one file, so that a restart finds the blocks again. Written by the worker's store (store.py), read at
start by it and by the scheduler (files.scan).

Provides:
    INDEX_NAME ("slots.idx"), HEAD_BYTES (4096), RECORD_BYTES (128)
    IndexHead(slot_bytes, segment_slots)      the geometry of the segment files the index describes
    Entry(slot, block_hash, time_ns)          one block on disk: its slot, and when it was written
    read_index(path) -> IndexRead             what the file says: head (None: no file, or not an index),
                                              entries (valid records, oldest first, one per block: a block's
                                              newest record wins), stale (slots whose records are torn,
                                              misplaced or a block's older duplicate)
    SlotIndex(path, head, slots)              the index file, opened for writing (created with `head` when
                                              missing), sized for `slots` records
        write(entries)                        the records of these slots (after their data is written)
        clear(slots)                          zero these slots' records (before the slots are reused)
        resize(slots), sync(), close()

File (little-endian): a 4 KiB head, [0:4] b"TCDX", [4:6] version 1, [8:16] slot bytes, [16:24] slots per
segment, [24:32] blake2b-8 of [0:24]; then record k at HEAD_BYTES + 128·k:
    [0:4] b"TCSL"   [4] block hash length   [8:16] time_ns   [16:24] k   [24:88] block hash (≤ 64 bytes,
    zero padded)   [88:96] blake2b-8 of [0:88]   [96:128] zero.        A free slot's record is all zeros.
Records are written with one pwrite per run of slots and never straddle a 512-byte sector. A record is
written once its slot's data is, and cleared before its slot is reused, so after a crash a record names at
most a block whose write was in flight; such a block is still a miss, never served: every read checks the
slot's own header (block hash, codec, size) and payload checksum (tiercache.remote.format).
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass

import numpy as np

INDEX_NAME = "slots.idx"
HEAD_BYTES = 4096
RECORD_BYTES = 128
_HEAD = struct.Struct("<4sH2xQQ")  # magic, version, slot bytes, slots per segment
_RECORD = struct.Struct("<4sB3xqQ64s")  # magic, hash length, time_ns, slot, block hash
_HEAD_MAGIC, _VERSION, _MAGIC = b"TCDX", 1, b"TCSL"
_CHECK_BYTES = 8
_HASH_MAX = 64


@dataclass(frozen=True)
class IndexHead:
    slot_bytes: int
    segment_slots: int


@dataclass(frozen=True)
class Entry:
    slot: int
    block_hash: bytes
    time_ns: int


@dataclass(frozen=True)
class IndexRead:
    head: IndexHead | None
    entries: list[Entry]
    stale: list[int]


def read_index(path: str) -> IndexRead:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return IndexRead(None, [], [])
    head = _parse_head(data[:HEAD_BYTES])
    if head is None:
        return IndexRead(None, [], [])
    n = (len(data) - HEAD_BYTES) // RECORD_BYTES
    records = np.frombuffer(data, np.uint8, n * RECORD_BYTES, HEAD_BYTES).reshape(n, RECORD_BYTES)
    marked = np.flatnonzero((records[:, :4] == np.frombuffer(_MAGIC, np.uint8)).all(axis=1))
    newest: dict[bytes, Entry] = {}
    stale: list[int] = []
    for slot in marked.tolist():
        entry = _parse_record(records[slot].tobytes(), slot)
        if entry is None:
            stale.append(slot)
            continue
        seen = newest.get(entry.block_hash)
        if seen is not None:
            stale.append(min(seen, entry, key=_age).slot)
            entry = max(seen, entry, key=_age)
        newest[entry.block_hash] = entry
    return IndexRead(head, sorted(newest.values(), key=_age), stale)


class SlotIndex:
    def __init__(self, path: str, head: IndexHead, slots: int) -> None:
        self.path = path
        self.head = head
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        if os.fstat(self._fd).st_size < HEAD_BYTES:
            os.pwrite(self._fd, _encode_head(head), 0)
        self.resize(slots)

    def write(self, entries: list[Entry]) -> None:
        """Entries in slot order: each run of consecutive slots is one pwrite."""
        for run in _runs([e.slot for e in entries]):
            data = b"".join(_encode_record(e) for e in entries[run.start : run.stop])
            _pwrite_all(self._fd, data, HEAD_BYTES + entries[run.start].slot * RECORD_BYTES)

    def clear(self, slots: list[int]) -> None:
        ordered = sorted(slots)
        for run in _runs(ordered):
            at = HEAD_BYTES + ordered[run.start] * RECORD_BYTES
            _pwrite_all(self._fd, bytes(len(run) * RECORD_BYTES), at)

    def resize(self, slots: int) -> None:
        os.ftruncate(self._fd, HEAD_BYTES + slots * RECORD_BYTES)

    def sync(self) -> None:
        os.fdatasync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _age(entry: Entry) -> tuple[int, int]:
    return entry.time_ns, entry.slot


def _runs(slots: list[int]) -> list[range]:
    """Index ranges of `slots` (ascending) whose slots are consecutive."""
    out, start = [], 0
    for k in range(1, len(slots) + 1):
        if k == len(slots) or slots[k] != slots[k - 1] + 1:
            out.append(range(start, k))
            start = k
    return out


def _check(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=_CHECK_BYTES).digest()


def _encode_head(head: IndexHead) -> bytes:
    fixed = _HEAD.pack(_HEAD_MAGIC, _VERSION, head.slot_bytes, head.segment_slots)
    return (fixed + _check(fixed)).ljust(HEAD_BYTES, b"\0")


def _parse_head(data: bytes) -> IndexHead | None:
    if len(data) < _HEAD.size + _CHECK_BYTES:
        return None
    fixed = data[: _HEAD.size]
    magic, version, slot_bytes, segment_slots = _HEAD.unpack(fixed)
    checked = data[_HEAD.size : _HEAD.size + _CHECK_BYTES] == _check(fixed)
    if magic != _HEAD_MAGIC or version != _VERSION or not checked:
        return None
    return IndexHead(slot_bytes, segment_slots)


def _encode_record(entry: Entry) -> bytes:
    if not 0 < len(entry.block_hash) <= _HASH_MAX:
        raise ValueError(f"a block hash of {len(entry.block_hash)} bytes: the disk tier keeps 1 to 64")
    fixed = _RECORD.pack(_MAGIC, len(entry.block_hash), entry.time_ns, entry.slot, entry.block_hash)
    return (fixed + _check(fixed)).ljust(RECORD_BYTES, b"\0")


def _parse_record(data: bytes, slot: int) -> Entry | None:
    """The record's entry, or None when it is torn (its check fails) or names another slot."""
    fixed = data[: _RECORD.size]
    if data[_RECORD.size : _RECORD.size + _CHECK_BYTES] != _check(fixed):
        return None
    _, hash_len, time_ns, stored_slot, block_hash = _RECORD.unpack(fixed)
    if stored_slot != slot or not 0 < hash_len <= _HASH_MAX:
        return None
    return Entry(slot, block_hash[:hash_len], time_ns)


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n
