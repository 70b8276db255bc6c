"""A step's disk-tier work on one rank: the remote tier's steps (remote_steps.py) over this rank's DiskStore,
and the drops of blocks the scheduler dropped. Nothing here decides anything.

Provides:
    DiskSteps(config, namespace, tiers, direct=None)   config: tiers.disk (DiskConfig); namespace: this
                                            rank's keys; direct: DiskStore's (None: where the file system
                                            allows it). Allocates its host buffers now, once, and logs their
                                            size: the write queue's values (queue_blocks and a batch) and two
                                            read buffers of READ_BATCH_BYTES (huge pages where offered:
                                            allocating those can take 100 ms, never on a step's thread)
        upload(items) -> int                write each RemoteItem's DRAM block (copied now) on the bounded
                                            write-behind queue; a full queue drops and counts
        start_fetch(items) -> DiskFetch, fetch(items)   as RemoteSteps: read and verify (header: codec id,
                                            block hash, size; checksum) on the READERS reader threads,
                                            READ_BATCH_BYTES of blocks a batch, and write into DRAM; the
                                            blocks that were not, with why (a missing, truncated or corrupted
                                            slot: a miss; a refused block's slot is freed)
        drop(hashes)                        free these blocks' slots, and cancel their queued writes
        take_counts(), stats(), close(timeout)   as RemoteSteps (the counters become disk_<event>)

    DiskFetch                               a fetch whose batches are read into BUFFERS buffers of its own
                                            (store.ReadBuffer, reused from fetch to fetch): the batches of
                                            fetches of several steps in flight never share one (a later
                                            fetch's read would overwrite rows an earlier one has checked but
                                            not yet copied into DRAM). Its buffers go back to the steps'
                                            spares once it is done; an abandoned fetch's are freed with it
    READERS                                 2: one batch read while the one before it is checked (the header
                                            and checksum checks of a 64 MiB batch take about as long as its
                                            read on two cores: issue 39's profile): a pipeline of two stages,
                                            reads taking turns (one batch at a time, several requests in
                                            flight: two batches read at once, from two places, got 1.7 GB/s
                                            where one after the other got 2.3 on this project's box) and
                                            checks taking turns (two at once on two cores, each on two
                                            threads, were slower than one after the other)
    BUFFERS                                 2 a fetch (three or four, with as many readers, were no faster
                                            on two cores: the checks and the copies into DRAM are the bound)

Order within a step (the worker keeps it): writes, drops, then reads (drops after writes: a block written
and dropped in one plan ends off the disk).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from tiercache.config_disk import DiskConfig
from tiercache.disk.buffers import ReadBuffer
from tiercache.disk.files import disk_slots
from tiercache.disk.store import DiskStore
from tiercache.remote.format import RemoteNamespace
from tiercache.units import format_bytes
from tiercache.wire import RemoteItem
from tiercache.worker.remote_io import check_values
from tiercache.worker.tier_worker import TierWorker

from .remote_steps import PendingFetch, RemoteSteps

logger = logging.getLogger(__name__)
READ_BATCH_BYTES = 64 << 20
READERS = 2
BUFFERS = 2


class DiskSteps(RemoteSteps):
    def __init__(
        self, config: DiskConfig, namespace: RemoteNamespace, tiers: TierWorker, direct: bool | None = None
    ) -> None:
        store = DiskStore(config.path, namespace, disk_slots(config, namespace.layout), direct)
        super().__init__(config, namespace, tiers, store=store)
        self._reader.shutdown()
        self._reader = ThreadPoolExecutor(READERS, thread_name_prefix="tiercache-disk-reader")
        self._spare = [ReadBuffer() for _ in range(BUFFERS)]  # of fetches that are done, for the next ones
        read_bytes = self.batch_blocks() * store.file_bytes
        for buffer in self._spare:
            buffer.take(read_bytes)
        write_bytes = store.reserve(config.queue_blocks + self.writer.batch_blocks)
        logger.info(
            "tiercache: disk tier host buffers: %s for the write queue (%d blocks and a batch), %d x %s to "
            "read into", format_bytes(write_bytes), config.queue_blocks, BUFFERS, format_bytes(read_bytes),
        )  # fmt: skip
        self._spare_lock = threading.Lock()
        self._read_turn = threading.Lock()  # one batch read at a time: the first stage
        self._check_turn = threading.Lock()  # one batch checked at a time: the second

    def start_fetch(self, items: Sequence[RemoteItem]) -> DiskFetch:
        return DiskFetch(self, items)

    def batch_blocks(self) -> int:
        return max(1, READ_BATCH_BYTES // self.store.file_bytes)

    def _read(self, items: Sequence[RemoteItem], buffer: ReadBuffer):
        """RemoteSteps._read on READERS threads: the reads one at a time, then the checks one at a time (a
        batch is checked while the next is read); each stage's seconds added under its own turn."""
        start = time.perf_counter()
        missing, todo = self._held(items)
        held = time.perf_counter()
        hashes = [item.block_hash for item in todo]
        with self._read_turn:
            read_start = time.perf_counter()
            values, misses = self.store.get(hashes, buffer)
            self.fetch_seconds["exists"] += held - start
            self.fetch_seconds["get"] += time.perf_counter() - read_start
            self.fetch_bytes += sum(v.numel() for v in values if v is not None)
        with self._check_turn:
            check_start = time.perf_counter()
            checked = check_values(self.store, hashes, values, misses, verify=self.verify)
            self.fetch_seconds["check"] += time.perf_counter() - check_start
        return missing, todo, checked

    def take_buffers(self) -> list[ReadBuffer]:
        with self._spare_lock:
            taken, self._spare = self._spare[:BUFFERS], self._spare[BUFFERS:]
        return taken + [ReadBuffer() for _ in range(BUFFERS - len(taken))]

    def give_back(self, buffers: list[ReadBuffer]) -> None:
        with self._spare_lock:
            self._spare = (self._spare + buffers)[:BUFFERS]  # one fetch's worth kept: memory stays bounded

    def drop(self, hashes: Sequence[bytes]) -> None:
        self.writer.withdraw(hashes, self.store.remove)


class DiskFetch(PendingFetch):
    def __init__(self, steps: DiskSteps, items: Sequence[RemoteItem]) -> None:
        self._buffers = steps.take_buffers()
        super().__init__(steps, items)  # batches 0 and 1 submitted
        for buffer in range(2, len(self._buffers)):
            self._read_next(buffer)

    def poll(self) -> dict[bytes, str] | None:
        failed = super().poll()
        if failed is not None and self._buffers:  # every batch read and copied into DRAM
            self.steps.give_back(self._buffers)
            self._buffers = []
        return failed

    def _read_next(self, buffer: int) -> None:
        """PendingFetch's, reading into this fetch's own buffer number `buffer` (< BUFFERS)."""
        if self._batches:
            batch = self._batches.popleft()
            future = self.steps._reader.submit(self.steps._read, batch, self._buffers[buffer])
            self._reading.append((future, buffer))
