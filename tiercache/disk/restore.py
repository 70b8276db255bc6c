"""What the disk tier's store finds in its directory at start (worker side): the blocks its index names,
within this run's size, and nothing else of its own left over.

Provides:
    restore(directory, slot_bytes, slots, direct) -> Restored
        1. files a crash left (the direct-I/O probe's *.tmp) are removed; so are the block files of the
           format before segments (*.blk, one file per block): never read by this version, their count and
           bytes logged once
        2. the index (index.py) is read; one that cannot be read, or of another slot size, is started afresh
           and the segments it described are deleted (logged)
        3. more blocks than `slots` (tiers.disk.size was lowered): the oldest beyond it are dropped, as the
           scheduler's DiskIndex.restore drops them from the same scan; those kept in slots beyond the size
           are moved into free slots below it (a block that cannot be read there is dropped: logged)
        4. the segments and the index are cut to `slots` slots: the files never exceed tiers.disk.size
    Restored(index, segments, held)    the open index (index.SlotIndex) and segment files (segments.Segments);
                                       held: block hash → slot of the blocks found
    remove_older_formats(root, rank, keep) -> int   the directories under root of this rank (other than
                                       keep) whose blocks are values of a format this version never reads
                                       (remote.format OLD_VERSIONS: their keys' salt named another version,
                                       so they sit in directories of their own) are deleted, logged; returns
                                       the bytes freed. A directory whose first block cannot be read as a
                                       value, or of a current format (another model's or codec's), is kept.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import shutil
import struct
from dataclasses import dataclass

from tiercache.disk.direct import TMP_SUFFIX, aligned
from tiercache.disk.files import OLD_SUFFIX
from tiercache.disk.index import INDEX_NAME, Entry, IndexHead, SlotIndex, read_index
from tiercache.disk.segments import Segments, new_segment_slots, segment_name, segment_numbers
from tiercache.remote.format import MAGIC, OLD_VERSIONS
from tiercache.units import format_bytes

logger = logging.getLogger("tiercache.disk.store")


@dataclass
class Restored:
    index: SlotIndex
    segments: Segments
    held: dict[bytes, int]


def restore(directory: str, slot_bytes: int, slots: int, direct: bool) -> Restored:
    _remove_leftovers(directory)
    path = os.path.join(directory, INDEX_NAME)
    found = read_index(path)
    head = found.head
    if head is None or head.slot_bytes != slot_bytes:
        _start_afresh(directory, path, head)
        head = IndexHead(slot_bytes, new_segment_slots(slot_bytes))
        found = read_index(path)
    index = SlotIndex(path, head, max(slots, _end(found.entries)))
    segments = Segments(directory, slot_bytes, head.segment_slots, direct)
    index.clear(found.stale)
    entries = found.entries
    if len(entries) > slots:
        logger.info(
            "tiercache: disk tier at %s holds %d blocks, more than tiers.disk.size's %d: the %d oldest are "
            "dropped", directory, len(entries), slots, len(entries) - slots,
        )  # fmt: skip
        index.clear([e.slot for e in entries[: len(entries) - slots]])
        entries = entries[len(entries) - slots :]
    entries = _move_below(entries, slots, index, segments)
    segments.truncate(slots)
    index.resize(slots)
    return Restored(index, segments, {e.block_hash: e.slot for e in entries})


def remove_older_formats(root: str, rank: int, keep: str) -> int:
    freed = []
    for directory in glob.glob(os.path.join(glob.escape(root), "*", f"rank{rank}")):
        if os.path.samefile(directory, keep) or _value_version(directory) not in OLD_VERSIONS:
            continue
        size = sum(e.stat().st_size for e in os.scandir(directory) if e.is_file(follow_symlinks=False))
        try:
            shutil.rmtree(directory)
            with contextlib.suppress(OSError):
                os.rmdir(os.path.dirname(directory))  # the model's directory, once no rank is left in it
        except OSError as exc:
            logger.warning("tiercache: disk tier: cannot remove %s (%s): remove it by hand", directory, exc)
            continue
        freed.append((directory, size))
    if freed:
        logger.warning(
            "tiercache: disk tier under %s: removed %d directories (%s) of blocks in a value format this "
            "version never reads (tiercache before values carried their piece checksums): %s", root,
            len(freed), format_bytes(sum(size for _, size in freed)), ", ".join(d for d, _ in freed),
        )  # fmt: skip
    return sum(size for _, size in freed)


def _value_version(directory: str) -> int | None:
    """The format version of the first block of a disk tier's directory (its slot's value header), or None
    (no index, no block, or not a value)."""
    found = read_index(os.path.join(directory, INDEX_NAME))
    if found.head is None or not found.entries:
        return None
    segment, k = divmod(found.entries[0].slot, found.head.segment_slots)
    try:
        with open(os.path.join(directory, segment_name(segment)), "rb") as f:
            f.seek(k * found.head.slot_bytes)
            head = f.read(6)
    except OSError:
        return None
    if len(head) < 6 or head[:4] != MAGIC:
        return None
    return struct.unpack_from("<H", head, 4)[0]


def _end(entries: list[Entry]) -> int:
    return max((e.slot + 1 for e in entries), default=0)


def _remove_leftovers(directory: str) -> None:
    old, old_bytes = 0, 0
    for entry in os.scandir(directory):
        name = entry.name
        old_format = name.endswith(OLD_SUFFIX) or name.endswith(OLD_SUFFIX + TMP_SUFFIX)
        if not (old_format or name.endswith(TMP_SUFFIX)) or not entry.is_file(follow_symlinks=False):
            continue
        size = entry.stat(follow_symlinks=False).st_size
        try:
            os.unlink(entry.path)
        except OSError as exc:
            logger.warning("tiercache: disk tier: cannot remove %s (%s): remove it by hand", entry.path, exc)
            continue
        old, old_bytes = old + old_format, old_bytes + size * old_format
    if old:
        logger.warning(
            "tiercache: disk tier at %s: removed %d block files (%s) of the format before segment files (one "
            "file per block, tiercache before 2026-11-29), which this version does not read: those blocks "
            "are recomputed when asked for", directory, old, format_bytes(old_bytes),
        )  # fmt: skip


def _start_afresh(directory: str, path: str, head: IndexHead | None) -> None:
    numbers = segment_numbers(directory)
    exists = os.path.exists(path)
    if numbers or exists:
        why = "cannot be read" if head is None else f"describes slots of {head.slot_bytes} bytes"
        logger.warning(
            "tiercache: disk tier at %s: its index %s %s; the tier starts empty (%d segment files deleted)",
            directory, INDEX_NAME, why if exists else "is missing", len(numbers),
        )  # fmt: skip
    for k in numbers:
        os.unlink(os.path.join(directory, segment_name(k)))
    if exists:
        os.unlink(path)


def _move_below(entries: list[Entry], slots: int, index: SlotIndex, segments: Segments) -> list[Entry]:
    """Entries with their slot below `slots`: those beyond moved into free slots there (new record first,
    then the old one cleared, so a crash meanwhile leaves a duplicate that read_index resolves)."""
    beyond = [e for e in entries if e.slot >= slots]
    if not beyond:
        return entries
    used = {e.slot for e in entries}
    free = iter(s for s in range(slots) if s not in used)
    buf = aligned(segments.slot_bytes)
    kept = [e for e in entries if e.slot < slots]
    lost = 0
    for entry in beyond:
        moved = Entry(next(free), entry.block_hash, entry.time_ns)
        try:
            if segments.read(entry.slot, memoryview(buf)) != segments.slot_bytes:
                raise OSError("the slot is past the end of its segment file")
            segments.write(moved.slot, [buf])
            index.write([moved])
            kept.append(moved)
        except OSError as exc:
            lost += 1
            block = entry.block_hash.hex()[:16]
            logger.warning("tiercache: disk tier: block %s not moved below the size, dropped: %s", block, exc)
        index.clear([entry.slot])
    buf.close()
    logger.info("tiercache: disk tier: %d blocks moved below the size, %d lost", len(beyond) - lost, lost)
    return kept
