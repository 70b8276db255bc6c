"""A step's disk-tier work on one rank: the remote tier's steps (remote_steps.py) over this rank's DiskStore,
and the deletions of files the scheduler dropped. Nothing here decides anything.

Provides:
    DiskSteps(config, namespace, tiers)     config: tiers.disk (DiskConfig); namespace: this rank's keys
        upload(items) -> int                write each RemoteItem's DRAM block (copied now) on the bounded
                                            write-behind queue; a full queue drops and counts
        fetch(items) -> dict[bytes, str]    read, verify (header: codec id, block hash, size; checksum) and
                                            write into DRAM the blocks, READ_BATCH_BYTES of files at a time:
                                            a reader thread reads the next batch into the store's other read
                                            buffer while this one is verified and copied (the buffers are
                                            reused: memory stays bounded); the blocks that were not, with why
                                            (a missing, truncated or corrupted file: a miss; a refused file
                                            is removed)
        drop(hashes)                        delete these blocks' files, and cancel their queued writes
        take_counts(), stats(), close(timeout)   as RemoteSteps (the counters become disk_<event>)

Order within a step (the worker keeps it): writes, drops, then reads (drops after writes: a block written
and dropped in one plan ends with no file).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

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
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="tiercache-disk-reader")

    def fetch(self, items: Sequence[RemoteItem]) -> dict[bytes, str]:
        per = max(1, READ_BATCH_BYTES // self.store.file_bytes)
        batches = [items[start : start + per] for start in range(0, len(items), per)]
        failed: dict[bytes, str] = {}
        reading = self._reader.submit(self._read, batches[0], 0) if batches else None
        for k in range(len(batches)):
            missing, todo, values, misses = reading.result()
            if k + 1 < len(batches):  # one reader: it starts on the other buffer once this batch is read
                reading = self._reader.submit(self._read, batches[k + 1], (k + 1) % 2)
            failed.update(missing)
            hashes = [item.block_hash for item in todo]
            failed.update(self._fill(todo, check_values(self.store, hashes, values, misses)))
        return failed

    def _read(self, items: Sequence[RemoteItem], buffer: int):
        """(the blocks without a file, with why; the items with one; their values and misses: store.get)"""
        missing, todo = self._held(items)
        values, misses = self.store.get([item.block_hash for item in todo], buffer)
        return missing, todo, values, misses

    def drop(self, hashes: Sequence[bytes]) -> None:
        self.writer.withdraw(hashes, self.store.remove)

    def close(self, timeout: float = 10.0) -> None:
        super().close(timeout)
        self._reader.shutdown()
