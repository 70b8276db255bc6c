"""The disk tier's config section, `tiers.disk`, and its checks.

Provides:
    DiskConfig          path (a directory, ~ expanded), size (Size: bytes or tokens, per rank), write
                        ("evicted" | "reused"), queue_blocks (the write-behind queue's bound; the host
                        memory of that many blocks' values, and of a batch, is allocated at start and
                        reused)
    disk_config(raw, source) -> DiskConfig | None     None when tiers.disk is left out or null
    DISK_KEYS, DISK_WRITES

Write policies (tiers.disk.write), which blocks dropped from DRAM are written (a block already on disk is
never written again):
    evicted   every block the manager drops from DRAM (the default)
    reused    only blocks that had a hit while cached: cold blocks never reach the disk (spares the SSD)

Shape:
    tiers:
      disk: {path: /nvme/tiercache, size: 500GiB, write: evicted, queue_blocks: 256}
The path is checked here: an existing path must be a writable directory; a missing one needs a writable
directory above it (it is created when the engine starts). A size larger than the file system that holds the
path is refused with both numbers. A size that holds no whole block is refused where the layout is known
(tiercache.disk.files.disk_slots), naming the minimum. The size counts each block's slot in the segment files
and its 128-byte index record (plus the index's 4 KiB head); once filled, the files keep that space (freed
slots are written over), and a smaller size at the next start cuts them down to it.

One engine per path: the files of one model, codec and layout are one engine's (its size limit, its deletes);
engines that share blocks do so through tiers.remote, each with a disk path of its own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tiercache.config_remote import check_section, queue_blocks
from tiercache.errors import ConfigError, clipped, shown
from tiercache.units import SIZE_FORMS, Size, format_bytes, parse_size

DISK_KEYS = ("path", "size", "write", "queue_blocks")
DISK_WRITES = ("evicted", "reused")
_EXAMPLE = "{path: /nvme/tiercache, size: 500GiB}"


@dataclass(frozen=True)
class DiskConfig:
    path: str  # the tier's directory (absolute, ~ expanded); per-namespace subdirectories below it
    size: Size  # per rank: the segment files and index of this model, codec and layout never exceed it
    write: str = "evicted"  # DISK_WRITES
    queue_blocks: int = 256  # blocks waiting for the disk before further writes are dropped

    def to_dict(self) -> dict[str, Any]:
        size = f"{self.size.bytes}" if self.size.bytes is not None else f"{self.size.tokens} tokens"
        return {"path": self.path, "size": size, "write": self.write, "queue_blocks": self.queue_blocks}


def disk_config(raw: Any, source: str) -> DiskConfig | None:
    if raw is None:
        return None
    check_section(raw, "tiers.disk", DISK_KEYS, _EXAMPLE, source)
    for key in ("path", "size"):
        if raw.get(key) is None:
            raise ConfigError(f"tiers.disk.{key} is required ({source}); for example {_EXAMPLE}")
    path = _path(raw["path"], source)
    return DiskConfig(
        path=path,
        size=_size(raw["size"], path, source),
        write=_write(raw.get("write", "evicted"), source),
        queue_blocks=queue_blocks(raw.get("queue_blocks", 256), source, "tiers.disk", "the disk"),
    )


def _path(raw: Any, source: str) -> str:
    if not isinstance(raw, str) or not raw.strip() or "\x00" in raw:
        raise ConfigError(
            f"tiers.disk.path: got {shown(raw, 80)} ({source}); expected a directory path such as "
            "/nvme/tiercache"
        )
    path = Path(raw).expanduser().absolute()
    name = clipped(str(path), 120)
    existing = path
    while not existing.exists():
        existing = existing.parent
    if existing == path and not path.is_dir():
        raise ConfigError(
            f"tiers.disk.path: {name} exists and is not a directory ({source}); name a directory (it is "
            "created if missing)"
        )
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        what = "is not writable"
        if existing != path:
            what = f"cannot be created: {clipped(str(existing), 120)} is not writable"
        raise ConfigError(
            f"tiers.disk.path: {name} {what} by this user ({source}); name a directory this user can "
            "write, or change its permissions"
        )
    return str(path)


def _size(raw: Any, path: str, source: str) -> Size:
    try:
        size = parse_size(raw)
    except ValueError as exc:
        raise ConfigError(f"tiers.disk.size: {exc} ({source})") from None
    if size.bytes == 0 or size.tokens == 0:
        raise ConfigError(
            f"tiers.disk.size: got {shown(raw, 80)} ({source}); expected a size above 0 such as 500GiB or "
            f"{SIZE_FORMS}; remove tiers.disk for no disk tier"
        )
    existing = Path(path)
    while not existing.exists():
        existing = existing.parent
    fs = os.statvfs(existing)
    total = fs.f_frsize * fs.f_blocks
    if size.bytes is not None and size.bytes > total:
        raise ConfigError(
            f"tiers.disk.size: {size} ({size.bytes:,} bytes) is more than the {format_bytes(total)} "
            f"({total:,} bytes) of the file system holding {clipped(path, 120)} ({source}); lower "
            "tiers.disk.size"
        )
    return size


def _write(raw: Any, source: str) -> str:
    if raw not in DISK_WRITES:
        raise ConfigError(
            f"tiers.disk.write: got {shown(raw, 80)} ({source}); expected evicted (every block dropped from "
            "DRAM is written: the default) or reused (only blocks that had a hit: spares the SSD)"
        )
    return raw
