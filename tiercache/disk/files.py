"""Where the disk tier's files live and how many blocks fit: shared by the scheduler side (its index, rebuilt
from a scan at start) and the worker side (the store that writes and reads them).

Provides:
    block_dir(root, namespace) -> str        root/<model>-<key>/rank<r>: key is a hash of the model name and
                                             the namespace's salt (format version, codec id, layout), so an
                                             engine with another model, codec or layout never opens these
    file_bytes(layout) -> int                one block's slot in a segment file: the remote tier's value
                                             (header + DRAM row), padded to direct.ALIGN
    disk_slots(disk, layout, source) -> int  blocks a DiskConfig's size holds per rank: slots and their index
                                             records; ConfigError naming the minimum when it holds none
    disk_blocks(config, layout) -> int       the same for a TierCacheConfig (0 without a disk tier)
    scan(directory) -> list[Entry]           the blocks the directory's index names (index.Entry: slot,
                                             block hash, time written), oldest first; [] without an index
    OLD_SUFFIX                               ".blk": the files of the format before segments (one file per
                                             block, named by its hash): never read, removed by the store

The directory holds segment files (segments.py) and their index (index.py). An index entry only says which
block a slot claims to hold: the slot's header (block hash, codec id, payload size and checksum:
tiercache.remote.format) and payload checksum are checked when it is read, so a slot that is torn,
truncated, corrupted or holds another block is a miss, never served.
"""

from __future__ import annotations

import hashlib
import os
import re

from tiercache.disk.direct import ALIGN
from tiercache.disk.index import HEAD_BYTES, INDEX_NAME, RECORD_BYTES, Entry, read_index
from tiercache.errors import ConfigError
from tiercache.layout import BlockLayout
from tiercache.remote.format import value_bytes

OLD_SUFFIX = ".blk"
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def block_dir(root: str, namespace) -> str:
    """namespace: a tiercache.remote.format.RemoteNamespace (model, salt, rank)."""
    key = hashlib.blake2b(f"{namespace.model}|{namespace.salt}".encode(), digest_size=8).hexdigest()
    model = _SAFE.sub("_", namespace.model)[:64] or "model"
    return os.path.join(root, f"{model}-{key}", f"rank{namespace.rank}")


def file_bytes(layout: BlockLayout) -> int:
    return -(-value_bytes(layout) // ALIGN) * ALIGN


def disk_slots(disk, layout: BlockLayout, source: str = "") -> int:
    """disk: a tiercache.config_disk.DiskConfig."""
    size, per = disk.size, file_bytes(layout) + RECORD_BYTES
    blocks = size.tokens // layout.block_size if size.tokens is not None else (size.bytes - HEAD_BYTES) // per
    if blocks < 1:
        least = HEAD_BYTES + per
        where = f" ({source})" if source else ""
        raise ConfigError(
            f"tiers.disk.size: {size} holds no whole block{where}: one block of this model and codec is "
            f"{layout.block_size} tokens = {least:,} bytes per rank (a slot of {file_bytes(layout):,} bytes "
            f'and its index); set tiers.disk.size to at least "{layout.block_size} tokens" or {least:,} bytes'
        )
    return blocks


def disk_blocks(config, layout: BlockLayout) -> int:
    disk = config.tiers.disk
    return 0 if disk is None else disk_slots(disk, layout, config.source)


def scan(directory: str) -> list[Entry]:
    return read_index(os.path.join(directory, INDEX_NAME)).entries
