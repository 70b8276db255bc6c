"""Where the disk tier's block files live and how many fit: shared by the scheduler side (its index, rebuilt
from a scan at start) and the worker side (the store that writes and reads them).

Provides:
    SUFFIX                                   ".blk": one file per block, named by its hash in hex
    block_dir(root, namespace) -> str        root/<model>-<key>/rank<r>: key is a hash of the model name and
                                             the namespace's salt (format version, codec id, layout), so an
                                             engine with another model, codec or layout never opens these
    file_bytes(layout) -> int                one block's file: the remote tier's value (header + DRAM row),
                                             padded to direct.ALIGN
    disk_blocks(config, layout) -> int       blocks tiers.disk.size holds per rank (0 without a disk tier);
                                             ConfigError naming the minimum when it holds none
    DiskFile(block_hash, mtime, size)        one file found by scan
    scan(directory) -> list[DiskFile]        the block files there, oldest first (by modification time);
                                             names that are not a block file's are skipped

A file's name only says which block it claims to hold: its header (block hash, codec id, payload size and
checksum: tiercache.remote.format) and payload checksum are checked when it is read, so a file that is torn,
truncated, corrupted or renamed is a miss, never served.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass

from tiercache.disk.direct import ALIGN
from tiercache.errors import ConfigError
from tiercache.layout import BlockLayout
from tiercache.remote.format import HEADER_BYTES

SUFFIX = ".blk"
_NAME = re.compile(r"^([0-9a-f]{2,128})\.blk$")
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class DiskFile:
    block_hash: bytes
    mtime: float
    size: int


def block_dir(root: str, namespace) -> str:
    """namespace: a tiercache.remote.format.RemoteNamespace (model, salt, rank)."""
    key = hashlib.blake2b(f"{namespace.model}|{namespace.salt}".encode(), digest_size=8).hexdigest()
    model = _SAFE.sub("_", namespace.model)[:64] or "model"
    return os.path.join(root, f"{model}-{key}", f"rank{namespace.rank}")


def file_bytes(layout: BlockLayout) -> int:
    return -(-(HEADER_BYTES + layout.dram_stride) // ALIGN) * ALIGN


def disk_blocks(config, layout: BlockLayout) -> int:
    disk = config.tiers.disk
    if disk is None:
        return 0
    size, per = disk.size, file_bytes(layout)
    blocks = size.tokens // layout.block_size if size.tokens is not None else size.bytes // per
    if blocks < 1:
        raise ConfigError(
            f"tiers.disk.size: {size} holds no whole block ({config.source}): one block of this model and "
            f"codec is {layout.block_size} tokens = a file of {per:,} bytes per rank; set tiers.disk.size to "
            f'at least "{layout.block_size} tokens" or {per:,} bytes'
        )
    return blocks


def scan(directory: str) -> list[DiskFile]:
    found = []
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return []
    for entry in entries:
        m = _NAME.match(entry.name)
        if m is None or len(m[1]) % 2:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if entry.is_file(follow_symlinks=False):
            found.append(DiskFile(bytes.fromhex(m[1]), st.st_mtime, st.st_size))
    found.sort(key=lambda f: f.mtime)
    return found
