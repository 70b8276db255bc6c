"""Worker side of the remote tier: write-behind of blocks going up, and verified reads of remote blocks.

Provides:
    upload_rows(tiers, items) -> list[(row, pieces) | PendingRow | str]   per upload (RemoteItem of VRAM
                                         or DRAM), its slot's bytes in the DRAM format ([dram_stride] uint8 on
                                         the host: a DRAM slot's a view, to be copied before the step goes on,
                                         as RemoteWriter.offer does; a VRAM slot's a copy) and the piece
                                         checksums recorded at its store ([2, L, 2] int64 on the host); a
                                         str: the slot does not hold that block. DRAM: TierWorker.dram_rows;
                                         VRAM: the slots' sections packed into DRAM rows on the device (on
                                         the current stream), then copied to the host: on a CPU pool at once,
                                         on a GPU on the upload stream into pinned memory (a PendingRow:
                                         nothing waits for the step's work)
    PendingRow                           a VRAM block's row and piece sums on their way to the host;
                                         result() -> (row, pieces) waits for them
    RemoteWriter(store, max_blocks, batch_blocks=32)
        offer(block_hash, row, pieces) -> bool   queue one block (row: [dram_stride] uint8, encoded now
                                         into a buffer of the store's (new_value; back to it by release once
                                         tried), so its slot may be reused at once; its MAC, when the store's
                                         namespace has a secret, is computed on the writer's thread); False:
                                         the queue is full and the block is dropped (counted, logged once
                                         per burst)
        offer_pending(block_hash, pending) -> bool   the same for a PendingRow: waited for and encoded on
                                         the writer's thread
        withdraw(hashes, remove)         these blocks must not stay written: queued ones are skipped (or
                                         removed again if being written now), then remove(hashes) runs (the
                                         disk tier deletes files the scheduler dropped: never one left behind
                                         by a write that was queued before the drop)
        flush(timeout) -> bool           wait until every queued block was tried
        stats() -> dict                  queued, written, already_stored, dropped_full, write_failures,
                                         last_error
        close()
    check_values(store, hashes, values, misses, verify=True) -> the same, for values store.get answered
    read_blocks(store, hashes, verify=True) -> list[RemoteBlock | RemoteMiss]   fetch values and check each:
                                         size, MAC (when a secret is set: before anything else of the value
                                         is trusted), header (codec id, block hash, size, the piece
                                         checksums' fold) and, with verify, the payload's piece checksums
                                         (on the host: without, a load's device pass checks them); a
                                         RemoteMiss says why the block is a miss, and of what kind
                                         (format.py): each block is served or refused on its own
    RemoteBlock                          row [dram_stride] uint8 (DRAM format), checksum (s1, s2): the
                                         block's (integrity.block_checksum), pieces [2, L, 2] int64: its
                                         piece checksums, what the DRAM tier records
    rows_of(blocks) -> [n, dram_stride] uint8   the blocks' rows as one tensor: their batch's own when they
                                         are all of it, in order (no copy), else stacked
    batches_of(blocks) -> list[range]    runs of blocks that rows_of turns into a batch without a copy
A read's values arrive in get calls whose values are rows of one buffer; read_blocks checks each such run
as one strided view (header stripped, no copy) and keeps it as the blocks' batch, so that the fetch copies
each block once, into its DRAM slot.

The queue is bounded (max_blocks values of RemoteNamespace.value_bytes each); one daemon thread drains
it in batches of up to batch_blocks: one RemoteStore.exists call for the batch, then RemoteStore.put of the
blocks the store does not hold yet or holds a refused value of (RemoteStore.refused); the others are counted
as already_stored, not written again: engines sharing a store write a common prefix once. Timeouts and
reconnects are the store's. A failed batch (the
existence call or the put) is counted and dropped, never retried: the blocks are a cache.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from tiercache.remote.format import BAD_MAC, BAD_VALUE, RemoteMiss, encode_value, parse_headers, sign_value
from tiercache.remote.store import RemoteStore
from tiercache.wire import DRAM, VRAM, RemoteItem
from tiercache.worker.integrity import block_checksum, checksums_of
from tiercache.worker.pools import block_views
from tiercache.worker.tier_worker import TierWorker

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RemoteBlock:
    row: torch.Tensor  # [dram_stride] uint8, the DRAM tier's bytes of the block
    checksum: tuple[int, int]
    pieces: torch.Tensor = field(compare=False, repr=False)  # [2, L, 2] int64
    batch: torch.Tensor | None = field(default=None, compare=False, repr=False)  # its read's rows: row is
    index: int = field(default=0, compare=False, repr=False)  # batch[index]


def rows_of(blocks: Sequence[RemoteBlock]) -> torch.Tensor:
    batch = blocks[0].batch if blocks else None
    if (
        batch is not None
        and len(blocks) == batch.shape[0]
        and all(b.batch is batch and b.index == i for i, b in enumerate(blocks))
    ):
        return batch
    return torch.stack([b.row for b in blocks])


def batches_of(blocks: Sequence[RemoteBlock]) -> list[range]:
    """Runs of consecutive blocks that are, in order, all the rows of one read's batch: rows_of each run
    is that batch (no copy); any other block is a run of its own."""
    runs: list[range] = []
    k = 0
    while k < len(blocks):
        batch, end = blocks[k].batch, k + 1
        if batch is not None and blocks[k].index == 0:
            while end < len(blocks) and blocks[end].batch is batch and blocks[end].index == end - k:
                end += 1
            if end - k != batch.shape[0]:
                end = k + 1
        runs.append(range(k, end))
        k = end
    return runs


@dataclass(frozen=True)
class PendingRow:
    row: torch.Tensor  # [dram_stride] uint8, pinned host memory, written by the upload stream
    pieces: torch.Tensor  # [2, L, 2] int64 piece sums recorded at the block's store, pinned, the same
    ready: torch.cuda.Event  # recorded on the upload stream after both copies

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(row, pieces), once the copies are done."""
        self.ready.synchronize()
        return self.row, self.pieces


Upload = tuple[torch.Tensor, torch.Tensor] | PendingRow | str  # (row, pieces), or why it is not read
_upload_streams: dict[torch.device, torch.cuda.Stream] = {}


def upload_rows(tiers: TierWorker, items: Sequence[RemoteItem]) -> list[Upload]:
    out: list[Upload] = [""] * len(items)
    for tier, read in ((DRAM, tiers.dram_rows), (VRAM, _vram_rows)):
        at = [i for i, item in enumerate(items) if item.tier == tier]
        if at:
            got = read([items[i] for i in at]) if tier == DRAM else read(tiers, [items[i] for i in at])
            for i, upload in zip(at, got, strict=True):
                out[i] = upload
    return out


def _vram_rows(tiers: TierWorker, items: Sequence[RemoteItem]) -> list[Upload]:
    """VRAM slots' blocks as DRAM rows, with the piece checksums recorded at their stores (of the bytes read,
    when checksums are off); an item whose slot does not hold its block (tag) is not read."""
    wrongs = [tiers.tags.refusal(VRAM, item.slot, item.block_hash, tiers.codec_id) for item in items]
    out: list[Upload] = [f"not uploaded: {wrong}" for wrong in wrongs]
    slots = [item.slot for item, wrong in zip(items, wrongs, strict=True) if wrong is None]
    if not slots:
        return out
    layout = tiers.vram.layout
    blocks = tiers.vram.read(slots)  # [L, n, …] per section, on the pool's device
    device = blocks.k_packed.device
    staging = torch.zeros(len(slots), layout.dram_stride, dtype=torch.uint8, device=device)  # padding: 0
    for name, view in block_views(staging, layout).tensors().items():
        view.copy_(getattr(blocks, name))
    if tiers.checksums is not None:
        pieces = tiers.checksums.get(VRAM, tiers.vram.slot_index(slots))  # [n, 2, L, 2] int64
    else:
        pieces = checksums_of(blocks)
    if device.type == "cuda":
        got = iter(_to_host_later(staging, pieces))
    else:
        got = iter(zip(staging, pieces.cpu(), strict=True))
    for i, wrong in enumerate(wrongs):
        if wrong is None:
            out[i] = next(got)
    return out


def _to_host_later(staging: torch.Tensor, pieces: torch.Tensor) -> list[PendingRow]:
    """Copies of staging [n, dram_stride] and pieces [n, 2, L, 2] (the current stream's, on a GPU) into
    pinned host memory on the device's upload stream, after the current stream's work so far; the current
    stream goes on at once (the two tensors are kept from reuse until the copies are done)."""
    device = staging.device
    stream = _upload_streams.get(device)
    if stream is None:
        stream = _upload_streams[device] = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        rows = torch.empty(staging.shape, dtype=torch.uint8, pin_memory=True)
        sums = torch.empty(pieces.shape, dtype=torch.int64, pin_memory=True)
        rows.copy_(staging, non_blocking=True)
        sums.copy_(pieces, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record(stream)
    staging.record_stream(stream)
    pieces.record_stream(stream)
    return [PendingRow(rows[i], sums[i], ready) for i in range(rows.shape[0])]


class RemoteWriter:
    def __init__(self, store: RemoteStore, max_blocks: int, batch_blocks: int = 32) -> None:
        if max_blocks < 1:
            raise ValueError(f"RemoteWriter: max_blocks must be ≥ 1, got {max_blocks}")
        self.store = store
        self.batch_blocks = batch_blocks
        self._queue: queue.Queue[tuple[bytes, torch.Tensor | PendingRow] | None] = queue.Queue(max_blocks)
        self._stats: Counter[str] = Counter()
        self._last_error = ""
        self._lock = threading.Lock()
        self._pending = 0  # offered and not yet tried
        self._queued: Counter[bytes] = Counter()  # offered and not yet tried, per block
        self._withdrawn: set[bytes] = set()  # queued blocks withdrawn: not written, or removed once written
        self._idle = threading.Condition(self._lock)
        self._dropping = False  # inside a burst of drops (one log line per burst)
        self._thread = threading.Thread(target=self._run, name="tiercache-remote-writer", daemon=True)
        self._thread.start()

    def offer(self, block_hash: bytes, row: torch.Tensor, pieces: torch.Tensor) -> bool:
        if self._queue.full():  # dropped before any copy (the writer only takes, so put may still fit)
            return self._drop()
        value = self.store.new_value()
        encode_value(self.store.namespace, block_hash, pieces, row, sign=False, out=value)
        if self._enqueue(block_hash, value):
            return True
        self.store.release([value])
        return self._drop()

    def offer_pending(self, block_hash: bytes, pending: PendingRow) -> bool:
        if self._queue.full() or not self._enqueue(block_hash, pending):
            return self._drop()
        return True

    def _enqueue(self, block_hash: bytes, item: torch.Tensor | PendingRow) -> bool:
        with self._lock:
            try:
                self._queue.put_nowait((block_hash, item))
            except queue.Full:
                return False
            self._dropping = False
            self._pending += 1
            self._queued[block_hash] += 1
            self._stats["queued"] += 1
            return True

    def _drop(self) -> bool:
        """A block dropped for a full queue: counted, logged once per burst."""
        with self._lock:
            self._stats["dropped_full"] += 1
            if self._dropping:
                return False
            self._dropping = True
        logger.warning(
            "tiercache: %s write queue full (%d blocks): dropping blocks until it drains",
            self.store.tier_name, self._queue.maxsize,
        )  # fmt: skip
        return False

    def withdraw(self, hashes: Sequence[bytes], remove) -> None:
        with self._lock:
            self._withdrawn.update(h for h in hashes if self._queued[h])
        remove(hashes)

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

    def _write(self, batch: list[tuple[bytes, torch.Tensor | PendingRow]]) -> None:
        """One existence call for the batch, then one put of the blocks the store does not hold (withdrawn
        blocks skipped; those withdrawn while being written are removed again)."""
        held = 0
        with self._lock:
            skipped = [item for item in batch if item[0] in self._withdrawn]
        if skipped:
            batch = [item for item in batch if item[0] not in self._withdrawn]
            self._settle(skipped, written=False)
        batch = self._encode_pending(batch)
        if not batch:
            return
        try:
            answer = self.store.exists([h for h, _ in batch])
            reason = answer.reason
            if reason is None:
                todo = [  # a held value this store refused (bad) is written over
                    item
                    for item, found in zip(batch, answer.found, strict=True)
                    if not found or self.store.refused(item[0])
                ]
                held = len(batch) - len(todo)
                reason = self._put(todo) if todo else None
        except Exception as exc:  # a bug in the store path must not kill the thread
            logger.exception("tiercache: remote write failed")
            reason = f"write raised {exc!r}"
        with self._idle:
            if reason is None:
                self._stats["written"] += len(batch) - held
                self._stats["already_stored"] += held
            else:
                self._stats["write_failures"] += len(batch) - held
                self._last_error = reason
        self._settle(batch, written=True)

    def _encode_pending(
        self, batch: list[tuple[bytes, torch.Tensor | PendingRow]]
    ) -> list[tuple[bytes, torch.Tensor]]:
        """The batch with each PendingRow's block encoded into a new value of the store's; a block whose copy
        to the host failed (a CUDA error) is counted as a failed write and settled."""
        encoded: list[tuple[bytes, torch.Tensor]] = []
        broken = []
        for block_hash, item in batch:
            if isinstance(item, torch.Tensor):
                encoded.append((block_hash, item))
                continue
            try:
                row, pieces = item.result()
            except Exception as exc:
                logger.exception("tiercache: a block's copy to the host for its upload failed")
                broken.append((block_hash, item))
                with self._lock:
                    self._stats["write_failures"] += 1
                    self._last_error = f"copy to the host raised {exc!r}"
                continue
            value = self.store.new_value()
            encode_value(self.store.namespace, block_hash, pieces, row, sign=False, out=value)
            encoded.append((block_hash, value))
        if broken:
            self._settle(broken, written=False)
        return encoded

    def _settle(self, batch: list[tuple[bytes, torch.Tensor | PendingRow]], written: bool) -> None:
        """The batch was tried: no longer queued, its values released to the store; written: its blocks
        withdrawn meanwhile are removed."""
        self.store.release([value for _, value in batch if isinstance(value, torch.Tensor)])
        with self._lock:
            remove = [h for h, _ in batch if h in self._withdrawn] if written else []
        if remove:
            self.store.remove(remove)
        with self._idle:
            for block_hash, _ in batch:
                self._queued[block_hash] -= 1
                if not self._queued[block_hash]:
                    del self._queued[block_hash]
                    self._withdrawn.discard(block_hash)
            self._pending -= len(batch)
            self._idle.notify_all()

    def _put(self, batch: list[tuple[bytes, torch.Tensor]]) -> str | None:
        namespace = self.store.namespace
        if namespace.mac is not None:
            for _, value in batch:
                sign_value(namespace, value)
        return self.store.put([h for h, _ in batch], [v for _, v in batch])


def read_blocks(
    store: RemoteStore, hashes: Sequence[bytes], verify: bool = True
) -> list[RemoteBlock | RemoteMiss]:
    """Per block: its checked bytes, or why it is a miss (not loaded, MAC, header, checksum)."""
    return check_values(store, hashes, *store.get(hashes), verify=verify)


def check_values(
    store: RemoteStore,
    hashes: Sequence[bytes],
    values: Sequence[torch.Tensor | None],
    misses: Sequence[RemoteMiss | None],
    verify: bool = True,
) -> list[RemoteBlock | RemoteMiss]:
    """read_blocks for the answer of store.get(hashes): (values, misses). verify=False: the payloads' piece
    checksums are not computed here, the value's own are kept (their fold checked against the header, and the
    MAC when a secret is set): for a reader whose every load verifies each piece on the device."""
    got = [i for i, value in enumerate(values) if value is not None]
    headers = iter(parse_headers([values[i] for i in got], store.namespace, [hashes[i] for i in got]))
    out: list[RemoteBlock | RemoteMiss] = []
    parsed = []
    for value, miss in zip(values, misses, strict=True):
        if value is None:
            assert miss is not None
            what = "value refused" if miss.kind in (BAD_VALUE, BAD_MAC) else "load failed"
            what = f"{store.tier_name} {what}"
            out.append(RemoteMiss(miss.kind, f"{what}: {miss.reason}"))  # words the scheduler's causes read
            continue
        header = next(headers)
        if isinstance(header, RemoteMiss):
            out.append(RemoteMiss(header.kind, f"{store.tier_name} value refused: {header.reason}"))
            continue
        parsed.append((len(out), header))
        out.append(RemoteMiss(BAD_VALUE, "not checked"))  # replaced below
    payloads = [payload for _, (_, _, payload) in parsed]
    layout = store.namespace.layout
    for run in _runs(payloads):
        rows = _rows(run, payloads)  # [m, dram_stride] uint8
        stored = torch.stack([parsed[k][1][1] for k in run])  # [m, 2, L, 2] int64, the values' own
        pieces, wrong = stored, [False] * len(run)
        if verify:
            pieces = checksums_of(block_views(rows, layout))  # of the bytes read
            wrong = (pieces != stored).flatten(1).any(1).tolist()
        for j, k in enumerate(run):
            i, (checksum, _, _) = parsed[k]
            if not wrong[j]:
                out[i] = RemoteBlock(rows[j], checksum, pieces[j], rows, j)
                continue
            read = block_checksum(pieces[j : j + 1], layout)[0].tolist()
            out[i] = RemoteMiss(
                BAD_VALUE,
                f"{store.tier_name} value refused: checksum mismatch (sums {_hex(checksum[0])}/"
                f"{_hex(checksum[1])} stored, {_hex(read[0])}/{_hex(read[1])} read)",
            )
    return out


def _runs(payloads: Sequence[torch.Tensor]) -> list[range]:
    """Maximal runs of payloads that sit in one buffer at one spacing, in order (a get call's values are rows
    of one tensor): each run is read as one strided [m, dram_stride] view, without a copy."""
    runs: list[range] = []
    start = 0
    for k in range(1, len(payloads) + 1):
        if k < len(payloads) and _follows(payloads, start, k):
            continue
        runs.append(range(start, k))
        start = k
    return runs


def _follows(payloads: Sequence[torch.Tensor], start: int, k: int) -> bool:
    a, b = payloads[k - 1], payloads[k]
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    step = b.data_ptr() - a.data_ptr()
    first = payloads[start + 1].data_ptr() - payloads[start].data_ptr() if k > start + 1 else step
    return step == first and step >= a.numel()


def _rows(run: range, payloads: Sequence[torch.Tensor]) -> torch.Tensor:
    first = payloads[run.start]
    if len(run) == 1:
        return first.unsqueeze(0)
    step = payloads[run.start + 1].data_ptr() - first.data_ptr()
    return first.as_strided((len(run), first.numel()), (step, 1))


def _hex(value: int) -> str:
    return f"{value & (2**64 - 1):016x}"
