"""Worker side of the remote tier: write-behind of blocks leaving DRAM, and verified reads of remote blocks.

Provides:
    RemoteWriter(store, max_blocks, batch_blocks=32)
        offer(block_hash, row, checksum) -> bool   queue one block (row: [dram_stride] uint8, copied now, so
                                         its DRAM slot may be reused at once); False: the queue is full and
                                         the block is dropped (counted, logged once per burst)
        flush(timeout) -> bool           wait until every queued block was tried
        stats() -> dict                  queued, written, dropped_full, write_failures, last_error
        close()
    read_blocks(store, hashes) -> list[RemoteBlock | str]   fetch values and check each: header (codec id,
                                         block hash, size) and the payload's checksum; a str says why the
                                         block is a miss
    RemoteBlock                          row [dram_stride] uint8 (DRAM format), checksum (s1, s2)

The queue is bounded (max_blocks values of HEADER_BYTES + dram_stride bytes each); one daemon thread drains
it in batches of up to batch_blocks through RemoteStore.put (timeouts and reconnects are the store's). A
failed batch is counted and dropped, never retried: the blocks are a cache.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tiercache.remote.format import encode_value, parse_header
from tiercache.remote.store import RemoteStore
from tiercache.worker.integrity import checksums_of
from tiercache.worker.pools import block_views

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RemoteBlock:
    row: torch.Tensor  # [dram_stride] uint8, the DRAM tier's bytes of the block
    checksum: tuple[int, int]


class RemoteWriter:
    def __init__(self, store: RemoteStore, max_blocks: int, batch_blocks: int = 32) -> None:
        if max_blocks < 1:
            raise ValueError(f"RemoteWriter: max_blocks must be ≥ 1, got {max_blocks}")
        self.store = store
        self.batch_blocks = batch_blocks
        self._queue: queue.Queue[tuple[bytes, torch.Tensor] | None] = queue.Queue(max_blocks)
        self._stats: Counter[str] = Counter()
        self._last_error = ""
        self._lock = threading.Lock()
        self._pending = 0  # offered and not yet tried
        self._idle = threading.Condition(self._lock)
        self._dropping = False  # inside a burst of drops (one log line per burst)
        self._thread = threading.Thread(target=self._run, name="tiercache-remote-writer", daemon=True)
        self._thread.start()

    def offer(self, block_hash: bytes, row: torch.Tensor, checksum: tuple[int, int]) -> bool:
        value = encode_value(self.store.namespace, block_hash, checksum, row.cpu())
        with self._lock:
            try:
                self._queue.put_nowait((block_hash, value))
            except queue.Full:
                self._stats["dropped_full"] += 1
                if not self._dropping:
                    self._dropping = True
                    logger.warning(
                        "tiercache: remote write queue full (%d blocks): dropping blocks until it drains",
                        self._queue.maxsize,
                    )
                return False
            self._dropping = False
            self._pending += 1
            self._stats["queued"] += 1
        return True

    def flush(self, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def stats(self) -> dict[str, int | str]:
        with self._lock:
            return {**self._stats, "waiting": self._pending, "last_error": self._last_error}

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            batch = [item] if item is not None else []
            while item is not None and len(batch) < self.batch_blocks:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    batch.append(item)
            if batch:
                self._write(batch)
            if item is None:
                return

    def _write(self, batch: list[tuple[bytes, torch.Tensor]]) -> None:
        try:
            reason = self.store.put([h for h, _ in batch], [v for _, v in batch])
        except Exception as exc:  # a bug in the store path must not kill the thread
            logger.exception("tiercache: remote write failed")
            reason = f"write raised {exc!r}"
        with self._idle:
            if reason is None:
                self._stats["written"] += len(batch)
            else:
                self._stats["write_failures"] += len(batch)
                self._last_error = reason
            self._pending -= len(batch)
            self._idle.notify_all()


def read_blocks(store: RemoteStore, hashes: Sequence[bytes]) -> list[RemoteBlock | str]:
    """Per block: its verified bytes, or why it is a miss (not loaded, wrong header, checksum mismatch)."""
    values, reasons = store.get(hashes)
    out: list[RemoteBlock | str] = []
    parsed = []
    for block_hash, value, reason in zip(hashes, values, reasons, strict=True):
        if value is None:
            out.append(f"remote: {reason}")
            continue
        header = parse_header(value, store.namespace, block_hash)
        if isinstance(header, str):
            out.append(f"remote value refused: {header}")
            continue
        parsed.append((len(out), header))
        out.append("")  # filled below
    if parsed:
        rows = torch.stack([payload for _, (_, payload) in parsed])  # [n, dram_stride] uint8
        got = checksums_of(block_views(rows, store.namespace.layout)).tolist()
        for (i, (expected, _)), row, sums in zip(parsed, rows, got, strict=True):
            if tuple(sums) == tuple(expected):
                out[i] = RemoteBlock(row, (sums[0], sums[1]))
            else:
                out[i] = (
                    f"remote value refused: checksum mismatch (sums {_hex(expected[0])}/{_hex(expected[1])} "
                    f"stored, {_hex(sums[0])}/{_hex(sums[1])} read)"
                )
    return out


def _hex(value: int) -> str:
    return f"{value & (2**64 - 1):016x}"
