"""A step's disk-tier work on one rank: the remote tier's steps (remote_steps.py) over this rank's DiskStore,
and the deletions of files the scheduler dropped. Nothing here decides anything.

Provides:
    DiskSteps(config, namespace, tiers)     config: tiers.disk (DiskConfig); namespace: this rank's keys
        upload(items) -> int                write each RemoteItem's DRAM block (copied now) on the bounded
                                            write-behind queue; a full queue drops and counts
        start_fetch(items), fetch(items)    as RemoteSteps: read and verify (header: codec id, block hash,
                                            size; checksum) on the reader thread, READ_BATCH_BYTES of files
                                            a batch, each into one of the store's two read buffers (reused:
                                            memory stays bounded), and write into DRAM; the blocks that were
                                            not, with why (a missing, truncated or corrupted file: a miss; a
                                            refused file is removed)
        drop(hashes)                        delete these blocks' files, and cancel their queued writes
        take_counts(), stats(), close(timeout)   as RemoteSteps (the counters become disk_<event>)

Order within a step (the worker keeps it): writes, drops, then reads (drops after writes: a block written
and dropped in one plan ends with no file).
"""

from __future__ import annotations

from collections.abc import Sequence

from tiercache.config_disk import DiskConfig
from tiercache.disk.store import DiskStore
from tiercache.remote.format import RemoteNamespace
from tiercache.wire import RemoteItem
from tiercache.worker.remote_io import check_values
from tiercache.worker.tier_worker import TierWorker

from .remote_steps import RemoteSteps

READ_BATCH_BYTES = 64 << 20


class DiskSteps(RemoteSteps):
    def __init__(self, config: DiskConfig, namespace: RemoteNamespace, tiers: TierWorker) -> None:
        super().__init__(config, namespace, tiers, store=DiskStore(config.path, namespace))

    def batch_blocks(self) -> int:
        return max(1, READ_BATCH_BYTES // self.store.file_bytes)

    def _read(self, items: Sequence[RemoteItem], buffer: int):
        missing, todo = self._held(items)
        hashes = [item.block_hash for item in todo]
        values, misses = self.store.get(hashes, buffer)
        return missing, todo, check_values(self.store, hashes, values, misses)

    def drop(self, hashes: Sequence[bytes]) -> None:
        self.writer.withdraw(hashes, self.store.remove)
