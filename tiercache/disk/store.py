"""The disk tier's blocks on one rank (worker side): slots of segment files (segments.py) named by an index
(index.py), written and read in runs, with direct I/O where the file system allows it. The calls of a
RemoteStore that the remote tier's write-behind queue (worker/remote_io.RemoteWriter) and steps
(connectors/worker/remote_steps.RemoteSteps) make, so both serve this tier unchanged; failure is a value (a
reason, a RemoteMiss), never an exception.

Provides:
    DiskStore(root, namespace, slots, direct=None)   namespace: this rank's (tiercache.remote.format, mac
                                        None); slots: blocks tiers.disk.size holds (files.disk_slots);
                                        direct None: probe O_DIRECT in the directory (direct.probe_direct),
                                        False: buffered I/O. Creates its directory (files.block_dir),
                                        deletes this rank's directories of older value formats under root
                                        (restore.remove_older_formats) and finds the blocks there
                                        (restore.py)
        directory, file_bytes (one slot), slots, direct (bool), direct_refusal (why not direct, or None),
        values (the writer's buffers.ValuePool), tier_name "disk"
        exists(hashes) -> RemoteAnswer      which blocks are on disk (the writer's "not written twice")
        new_value(), release(values), reserve(values)   the writer's values (buffers.ValuePool: slot-sized,
                                            zero padded, reused; reserve at start), which put writes to their
                                            slots as they are; put copies other values into aligned rows
        put(hashes, values) -> str | None   write each value (format.encode_value's [value_bytes] uint8) into
                                            a free slot, the lowest first: each run of consecutive slots one
                                            write, then its index records; None, or why a block was not
                                            written (the first failure: disk full, I/O error, no free slot)
        get(hashes, buffer=None) -> (values, misses)   per block its value ([value_bytes] uint8, rows of
                                            `buffer`, a buffers.ReadBuffer, or the store's own when None:
                                            valid until the next get into the same buffer, so the caller
                                            copies them into DRAM slots first) or a RemoteMiss: VANISHED
                                            (not on disk), BAD_VALUE (its slot is past the end of its
                                            segment file: truncated), DOWN (an I/O error)
        refuse(hash, miss)                  a block its reader refused (header or checksum): its slot freed
        refused(hash) -> False              (a refused block is gone: the writer writes it again)
        remove(hashes)                      free these blocks' slots (absent ones are skipped)
        stats() -> dict                     reads, read_bytes, read_errors, writes, write_bytes,
                                            write_errors, index_errors (a record not cleared), removed,
                                            refused, held, slots, direct (1 or 0), last_error
        close()                             once the calls in flight are done (at most CLOSE_WAIT_S: else
                                            the files are left open, never closed under a write), the index
                                            and segments synced (a clean shutdown is durable) and closed;
                                            later calls fail (counted) or do nothing

Reads and writes of a batch run on kernels.checksum_host.host_threads, RUN_BYTES a call at most (os.preadv and
os.pwritev release the GIL): several requests in flight, which an NVMe drive needs to reach its bandwidth.
A slot holds the remote tier's value (format.py: a 256-byte header naming the block, codec, size and payload
checksum, then the DRAM row), zero-padded to direct.ALIGN. No file is created, renamed or deleted per block
(each cost ~1 ms of CPU on ext4: issue 39's profile): a freed slot is written over. Thread-safe, except that
two gets into one buffer must not overlap.
"""

from __future__ import annotations

import errno
import heapq
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Sequence

import torch

from tiercache.disk.buffers import ReadBuffer, ValuePool
from tiercache.disk.direct import probe_direct
from tiercache.disk.files import block_dir, file_bytes
from tiercache.disk.index import Entry
from tiercache.disk.restore import remove_older_formats, restore
from tiercache.disk.segments import runs, segment_name
from tiercache.kernels.checksum_host import host_threads
from tiercache.remote.format import BAD_VALUE, DOWN, VANISHED, RemoteMiss, RemoteNamespace
from tiercache.remote.store import RemoteAnswer

logger = logging.getLogger(__name__)
RUN_BYTES = 16 << 20
CLOSE_WAIT_S = 30.0
_CLOSED = "disk tier closed (the engine is shutting down)"


class DiskStore:
    tier_name = "disk"

    def __init__(self, root: str, namespace: RemoteNamespace, slots: int, direct: bool | None = None) -> None:
        self.namespace = namespace
        self.directory = block_dir(root, namespace)
        os.makedirs(self.directory, exist_ok=True)
        remove_older_formats(root, namespace.rank, self.directory)
        self.file_bytes = file_bytes(namespace.layout)
        self.slots = slots
        self.direct_refusal = probe_direct(self.directory) if direct is not False else "turned off"
        self.direct = self.direct_refusal is None
        found = restore(self.directory, self.file_bytes, slots, self.direct)
        self._index, self._segments, self._slot_of = found.index, found.segments, found.held
        used = set(self._slot_of.values())
        self._free = [s for s in range(slots) if s not in used]  # ascending: a heap; the lowest taken first
        self._run_slots = max(1, RUN_BYTES // self.file_bytes)
        self._stats: Counter[str] = Counter()
        self._last_error = ""
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # notified when a call's I/O is done
        self._ops = 0  # calls doing I/O now: close waits for them
        self.values = ValuePool(self.file_bytes, namespace.value_bytes)  # what the writer encodes into
        self._read_buffer = ReadBuffer()  # gets that name none
        self._closed = False
        logger.info(
            "tiercache: disk tier at %s: %s I/O, %d of %d slots of %d bytes hold blocks", self.directory,
            "direct" if self.direct else f"buffered ({self.direct_refusal})", len(used), slots,
            self.file_bytes,
        )  # fmt: skip

    # ------------------------------------------------------------------ the writer's calls
    def exists(self, hashes: Sequence[bytes]) -> RemoteAnswer:
        with self._lock:
            return RemoteAnswer(tuple(h in self._slot_of for h in hashes))

    def refused(self, block_hash: bytes) -> bool:
        return False

    def new_value(self) -> torch.Tensor:
        return self.values.new_value()

    def release(self, values: Sequence[torch.Tensor]) -> None:
        self.values.release(values)

    def reserve(self, values: int) -> int:
        return self.values.reserve(values)

    def put(self, hashes: Sequence[bytes], values: Sequence[torch.Tensor]) -> str | None:
        if not self._enter():
            return self._failed("write_errors", _CLOSED, len(hashes))
        try:
            return self._put(hashes, values)
        finally:
            self._leave()

    def _put(self, hashes: Sequence[bytes], values: Sequence[torch.Tensor]) -> str | None:
        with self._lock:
            slots = [heapq.heappop(self._free) for _ in range(min(len(hashes), len(self._free)))]
        reason = None
        if len(slots) < len(hashes):
            reason = self._failed(
                "write_errors", f"disk tier full: its {self.slots} slots all hold blocks (tiers.disk.size)",
                len(hashes) - len(slots),
            )  # fmt: skip
        now = time.time_ns()
        parts = runs(slots, self._segments.segment_slots, self._run_slots)
        errors = list(host_threads().map(lambda run: self._write_run(run, slots, hashes, values, now), parts))
        written = [k for run, error in zip(parts, errors, strict=True) if error is None for k in run]
        replaced = []
        with self._lock:
            for k in written:
                old = self._slot_of.get(hashes[k])
                if old is not None:
                    replaced.append(old)
                self._slot_of[hashes[k]] = slots[k]
            for run, error in zip(parts, errors, strict=True):
                for k in run if error else ():
                    heapq.heappush(self._free, slots[k])
        self._release_slots(replaced)
        self._count(writes=len(written), write_bytes=len(written) * self.file_bytes)
        return reason or next((e for e in errors if e), None)

    def _write_run(
        self, run: range, slots: list[int], hashes: Sequence[bytes], values: Sequence[torch.Tensor], now: int
    ) -> str | None:
        """On a host thread: the run's values (copied into this thread's staging buffer where they are not
        new_value's), then their index records."""
        first = slots[run.start]
        try:
            self._segments.write(first, self.values.slot_buffers(values[run.start : run.stop]))
            self._index.write([Entry(slots[k], hashes[k], now) for k in run])
        except OSError as exc:
            return self._failed("write_errors", f"disk write failed: {self._oserror(exc, first)}", len(run))
        return None

    # ------------------------------------------------------------------ the reader's calls
    def get(
        self, hashes: Sequence[bytes], buffer: ReadBuffer | None = None
    ) -> tuple[list[torch.Tensor | None], list[RemoteMiss | None]]:
        if not hashes:
            return [], []
        if not self._enter():
            return [None] * len(hashes), [RemoteMiss(DOWN, _CLOSED)] * len(hashes)
        try:
            return self._get(hashes, buffer or self._read_buffer)
        finally:
            self._leave()

    def _get(
        self, hashes: Sequence[bytes], buffer: ReadBuffer
    ) -> tuple[list[torch.Tensor | None], list[RemoteMiss | None]]:
        n, size = len(hashes), self.file_bytes
        buf = buffer.take(n * size)  # rows page-aligned, as direct I/O needs
        with self._lock:
            slots = [self._slot_of.get(h) for h in hashes]
        misses: list[RemoteMiss | None] = [
            None if slot is not None else RemoteMiss(VANISHED, "not on disk (dropped, or its write failed)")
            for slot in slots
        ]
        parts = runs(slots, self._segments.segment_slots, self._run_slots)
        view = memoryview(buf)
        got_runs = host_threads().map(lambda run: self._read_run(run, slots, view), parts)
        for run, got in zip(parts, got_runs, strict=True):
            for k in run:
                misses[k] = got if isinstance(got, RemoteMiss) else self._short(got, k - run.start)
        rows = torch.frombuffer(buf, dtype=torch.uint8, count=n * size).view(n, size)
        width = self.namespace.value_bytes
        values = [rows[k, :width] if miss is None else None for k, miss in enumerate(misses)]
        served = sum(miss is None for miss in misses)
        self._count(reads=served, read_bytes=served * size)
        return values, misses

    def _read_run(self, run: range, slots: list[int | None], view: memoryview) -> int | RemoteMiss:
        size, first = self.file_bytes, slots[run.start]
        try:
            return self._segments.read(first, view[run.start * size : run.stop * size])
        except OSError as exc:
            reason = f"disk read failed: {self._oserror(exc, first)}"
            return RemoteMiss(DOWN, self._failed("read_errors", reason, len(run)))

    def _short(self, got: int, k: int) -> RemoteMiss | None:
        """The k-th slot of a run read `got` bytes: None when whole, else a truncated-file miss (counted)."""
        if got >= (k + 1) * self.file_bytes:
            return None
        self._count(read_errors=1)
        return RemoteMiss(BAD_VALUE, "disk slot past the end of its segment file: truncated")

    def refuse(self, block_hash: bytes, miss: RemoteMiss) -> None:
        self._count(refused=1)
        self._forget([block_hash])

    def remove(self, hashes: Sequence[bytes]) -> None:
        self._count(removed=self._forget(hashes))

    def _forget(self, hashes: Sequence[bytes]) -> int:
        if not self._enter():
            return 0  # shutting down: the blocks stay on disk, found again at the next start
        try:
            with self._lock:
                slots = [s for s in (self._slot_of.pop(h, None) for h in hashes) if s is not None]
            self._release_slots(slots)
            return len(slots)
        finally:
            self._leave()

    def _release_slots(self, slots: list[int]) -> None:
        """Clear the slots' records, then free the slots (no record is cleared after its slot's reuse)."""
        if not slots:
            return
        try:
            self._index.clear(slots)
        except OSError as exc:  # the records stay: a restart finds these blocks, or their slots' next ones
            self._failed("index_errors", f"disk index not updated: {exc.strerror or exc}", 1)
        with self._lock:
            for slot in slots:
                heapq.heappush(self._free, slot)

    # ------------------------------------------------------------------ counters
    def stats(self) -> dict[str, int | str]:
        with self._lock:
            held = len(self._slot_of)
            return {**self._stats, "held": held, "slots": self.slots, "direct": int(self.direct),
                    "last_error": self._last_error}  # fmt: skip

    def close(self) -> None:
        with self._idle:
            if self._closed:
                return
            self._closed = True
            drained = self._idle.wait_for(lambda: self._ops == 0, CLOSE_WAIT_S)
        if not drained:
            logger.warning(
                "tiercache: disk tier at %s: I/O still in flight %gs after shutdown began: its files are "
                "left open", self.directory, CLOSE_WAIT_S,
            )  # fmt: skip
            return
        try:
            self._segments.sync()
            self._index.sync()
        except OSError as exc:
            logger.warning("tiercache: disk tier at %s: sync at shutdown failed: %s", self.directory, exc)
        self._segments.close()
        self._index.close()

    def _enter(self) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._ops += 1
            return True

    def _leave(self) -> None:
        with self._idle:
            self._ops -= 1
            self._idle.notify_all()

    def _count(self, **counts: int) -> None:
        with self._lock:
            self._stats.update(counts)

    def _failed(self, counter: str, reason: str, blocks: int) -> str:
        with self._lock:
            self._stats[counter] += blocks
            first = self._last_error != reason
            self._last_error = reason
        (logger.warning if first else logger.debug)("tiercache: %s", reason)
        return reason

    def _oserror(self, exc: OSError, slot: int) -> str:
        where = segment_name(slot // self._segments.segment_slots)
        fix = "; free space there or lower tiers.disk.size" if exc.errno == errno.ENOSPC else ""
        return f"{exc.strerror or exc} ({where} in {self.directory}){fix}"
