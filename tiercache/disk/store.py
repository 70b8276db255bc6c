"""The disk tier's files on one rank (worker side): block values written and read in parallel, with direct
I/O where the file system allows it. The calls of a RemoteStore that the remote tier's write-behind queue
(worker/remote_io.RemoteWriter) and steps (connectors/worker/remote_steps.RemoteSteps) make, so both serve
this tier unchanged; failure is a value (a reason, a RemoteMiss), never an exception.

Provides:
    DiskStore(root, namespace, direct=None)   namespace: this rank's (tiercache.remote.format, mac None);
                                        direct None: probe O_DIRECT in the directory (direct.probe_direct),
                                        False: buffered I/O. Creates its directory (files.block_dir) and
                                        removes the temporary files a crash left there
        directory, file_bytes, direct (bool), direct_refusal (why not direct, or None), tier_name "disk"
        exists(hashes) -> RemoteAnswer      which blocks have a file (the writer's "not written twice")
        new_value() -> [value_bytes] uint8  a buffer for one value: the head of a page-aligned, zero-padded
                                            file-sized buffer, reused after release (a pool of at most the
                                            writer's queue and batch), which put writes to its file as it is
        release(values)                     values the writer is done with (their buffers are reused)
        put(hashes, values) -> str | None   write each value (format.encode_value's [value_bytes] uint8) to
                                            its file: a temporary name, then a rename; None, or why a file
                                            was not written (the first failure: disk full, I/O error)
        get(hashes, buffer=0) -> (values, misses)   per block its value ([value_bytes] uint8, rows of the
                                            store's read buffer `buffer`, 0 or 1: valid until the next get
                                            into the same buffer, so the caller copies them into DRAM slots
                                            first; two, so that one batch is read while the other is checked)
                                            or a RemoteMiss: VANISHED (no file), BAD_VALUE (a file of another
                                            size: truncated or torn), DOWN (an I/O error)
        refuse(hash, miss)                  a file its reader refused (header or checksum): removed
        refused(hash) -> False              (a refused file is gone: the writer writes it again)
        remove(hashes)                      delete these blocks' files (absent ones are skipped)
        stats() -> dict                     reads, read_bytes, read_errors, writes, write_bytes,
                                            write_errors, removed, refused, direct (1 or 0), last_error
        close()

Reads and writes of a batch run on kernels.checksum_host.host_threads (os.pread/os.pwrite release the GIL):
several requests in flight, which an NVMe drive needs to reach its bandwidth. The files are the remote
tier's values (format.py: a 256-byte header naming the block, codec, size and payload checksum, then the
DRAM row), zero-padded to direct.ALIGN. The read buffers are allocated once (grown to the largest batch):
populating fresh pages for every batch costs about as much as reading them. Thread-safe, except that two gets
into one buffer must not overlap.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
from collections import Counter
from collections.abc import Sequence

import numpy as np
import torch

from tiercache.disk.direct import TMP_SUFFIX, aligned, probe_direct, read_file, write_file
from tiercache.disk.files import SUFFIX, block_dir, file_bytes
from tiercache.kernels.checksum_host import host_threads
from tiercache.remote.format import BAD_VALUE, DOWN, VANISHED, RemoteMiss, RemoteNamespace
from tiercache.remote.store import RemoteAnswer

logger = logging.getLogger(__name__)


class DiskStore:
    tier_name = "disk"

    def __init__(self, root: str, namespace: RemoteNamespace, direct: bool | None = None) -> None:
        self.namespace = namespace
        self.directory = block_dir(root, namespace)
        os.makedirs(self.directory, exist_ok=True)
        self.file_bytes = file_bytes(namespace.layout)
        self.direct_refusal = probe_direct(self.directory) if direct is not False else "turned off"
        self.direct = self.direct_refusal is None
        self._stats: Counter[str] = Counter()
        self._last_error = ""
        self._lock = threading.Lock()
        self._buffers = threading.local()  # one aligned [file_bytes] write buffer per thread
        self._files: dict[int, mmap.mmap] = {}  # new_value's buffers by the address of their value
        self._free: list[torch.Tensor] = []  # released values, reused by new_value
        self._read_bufs = [aligned(0), aligned(0)]  # [batch, file_bytes] uint8 each, reused by the gets
        for name in os.listdir(self.directory):
            if name.endswith(TMP_SUFFIX):  # a write a crash interrupted
                _unlink(os.path.join(self.directory, name))
        logger.info(
            "tiercache: disk tier at %s: %s I/O, files of %d bytes", self.directory,
            "direct" if self.direct else f"buffered ({self.direct_refusal})", self.file_bytes,
        )  # fmt: skip

    def path(self, block_hash: bytes) -> str:
        return os.path.join(self.directory, block_hash.hex() + SUFFIX)

    # ------------------------------------------------------------------ the writer's calls
    def exists(self, hashes: Sequence[bytes]) -> RemoteAnswer:
        return RemoteAnswer(tuple(os.path.exists(self.path(h)) for h in hashes))

    def refused(self, block_hash: bytes) -> bool:
        return False

    def new_value(self) -> torch.Tensor:
        with self._lock:
            if self._free:
                return self._free.pop()
        buf = aligned(self.file_bytes)  # zeroed: the padding past the value stays zero
        value = torch.frombuffer(buf, dtype=torch.uint8, count=self.namespace.value_bytes)
        with self._lock:
            self._files[value.data_ptr()] = buf
        return value

    def release(self, values: Sequence[torch.Tensor]) -> None:
        with self._lock:
            self._free.extend(v for v in values if v.data_ptr() in self._files)

    def put(self, hashes: Sequence[bytes], values: Sequence[torch.Tensor]) -> str | None:
        errors = [e for e in host_threads().map(self._write_one, hashes, values) if e]
        return errors[0] if errors else None

    def _write_one(self, block_hash: bytes, value: torch.Tensor) -> str | None:
        buf = self._files.get(value.data_ptr())  # new_value's: written as it is
        if buf is None:
            buf = getattr(self._buffers, "buf", None)
            if buf is None:
                buf = self._buffers.buf = aligned(self.file_bytes)  # its padding stays zero
            np.frombuffer(buf, dtype=np.uint8, count=value.numel())[:] = value.numpy()
        path = self.path(block_hash)
        try:
            write_file(path + TMP_SUFFIX, buf, self.direct)
            os.rename(path + TMP_SUFFIX, path)
        except OSError as exc:
            _unlink(path + TMP_SUFFIX)
            return self._failed("write_errors", f"disk write failed: {_oserror(exc)}")
        self._count(writes=1, write_bytes=self.file_bytes)
        return None

    # ------------------------------------------------------------------ the reader's calls
    def get(
        self, hashes: Sequence[bytes], buffer: int = 0
    ) -> tuple[list[torch.Tensor | None], list[RemoteMiss | None]]:
        n, size = len(hashes), self.file_bytes
        if not n:
            return [], []
        if len(self._read_bufs[buffer]) < n * size:  # each file's slice page-aligned, as direct I/O needs
            self._read_bufs[buffer] = aligned(n * size)
        buf = self._read_bufs[buffer]
        view = memoryview(buf)
        got = list(host_threads().map(lambda i: self._read_one(hashes[i], view[i * size : (i + 1) * size]),
                                      range(n)))  # fmt: skip
        rows = torch.frombuffer(buf, dtype=torch.uint8, count=n * size).view(n, size)
        values: list[torch.Tensor | None] = []
        misses: list[RemoteMiss | None] = []
        for i, miss in enumerate(got):
            values.append(None if miss else rows[i, : self.namespace.value_bytes])
            misses.append(miss)
        return values, misses

    def _read_one(self, block_hash: bytes, view: memoryview) -> RemoteMiss | None:
        try:
            size = read_file(self.path(block_hash), view, self.direct)
        except FileNotFoundError:
            return RemoteMiss(VANISHED, "disk file missing (removed, or never written: the write failed)")
        except OSError as exc:
            return RemoteMiss(DOWN, self._failed("read_errors", f"disk read failed: {_oserror(exc)}"))
        if size != self.file_bytes:
            self._count(read_errors=1)
            return RemoteMiss(
                BAD_VALUE, f"disk file is {size} bytes, expected {self.file_bytes}: truncated or torn"
            )
        self._count(reads=1, read_bytes=size)
        return None

    def refuse(self, block_hash: bytes, miss: RemoteMiss) -> None:
        self._count(refused=1)
        _unlink(self.path(block_hash))

    def remove(self, hashes: Sequence[bytes]) -> None:
        removed = sum(_unlink(self.path(h)) for h in hashes)
        self._count(removed=removed)

    # ------------------------------------------------------------------ counters
    def stats(self) -> dict[str, int | str]:
        with self._lock:
            return {**self._stats, "direct": int(self.direct), "last_error": self._last_error}

    def close(self) -> None:
        """Nothing to release: every call opens and closes its own files."""

    def _count(self, **counts: int) -> None:
        with self._lock:
            self._stats.update(counts)

    def _failed(self, counter: str, reason: str) -> str:
        with self._lock:
            self._stats[counter] += 1
            first = self._last_error != reason
            self._last_error = reason
        (logger.warning if first else logger.debug)("tiercache: %s", reason)
        return reason


def _oserror(exc: OSError) -> str:
    return f"{exc.strerror or exc} ({os.path.basename(exc.filename or '')})" if exc.filename else str(exc)


def _unlink(path: str) -> bool:
    try:
        os.unlink(path)
        return True
    except OSError:
        return False
