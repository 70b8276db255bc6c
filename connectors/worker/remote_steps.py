"""A step's remote-tier work on one rank: uploads of the blocks the manager sends up (tiers.remote.write says
when), fetches of blocks the scheduler found in the remote store (into the DRAM slots it reserved). Nothing
here decides anything.

Provides:
    RemoteSteps(config, namespace, tiers, store=None)   config: tiers.remote (RemoteConfig); namespace: this
                                            rank's keys; store: the store to use instead of opening
                                            config's (the disk tier's DiskStore: disk_steps.py)
        upload(items) -> int                queue each RemoteItem's bytes, from its VRAM or DRAM slot in the
                                            DRAM format (copied now: the slot may be reused later in the step;
                                            remote_io.upload_rows) on the bounded write-behind queue; returns
                                            how many were queued (a full queue drops and counts)
        start_fetch(items) -> PendingFetch  fetch and check (MAC when a secret is set; header: codec id,
                                            block hash, size, the piece checksums' fold; the payload's piece
                                            checksums on the host only when the tiers keep none: .verify,
                                            else each load checks them on the device) on the reader thread,
                                            in batches of batch_blocks(); .poll() on the caller's thread
                                            writes the batches read into their DRAM slots and returns, once
                                            all are, the blocks that were not, with why (None before). Each
                                            block on its own: a bad value is a miss for its block, the
                                            others are served
        fetch(items) -> dict[bytes, str]    the same, waited for
        refuse_loaded(block_hash, reason)   a fetched block refused by its load's check: its value refused
        take_counts() -> tuple[RemoteCount, ...]   since the last call, for the worker's report (the
                                            scheduler's remote_<event> counters): the writer's outcomes
                                            (written, already_stored, dropped_full, write_failures) and the
                                            blocks whose value was refused (READ_EVENTS: bad_values,
                                            bad_macs, vanished; a refused value is told to the store, which
                                            then neither fetches it again for a while nor skips its rewrite)
        stats() -> dict                     the writer's, the reads' and the store's counters, and the
                                            fetches' seconds by stage (fetch_s_exists, fetch_s_get,
                                            fetch_s_check on the reader thread; fetch_s_fill on the
                                            poller's) with the bytes of the values checked (fetch_bytes)
        close(timeout)                      wait for queued writes (at most timeout), then stop

Order within a step (the worker keeps it): uploads, then fetches, then loads (once the fetch is in: the
worker defers that step's loads, connector_worker.py). A fetch asks the store which blocks it holds first (a
GET of a key that is not there costs a timeout and the adapter's connections).

A refused value is logged once per kind, as a warning naming its real cause (vanished: info, it is what
eviction does), then only counted; a block's own line is at debug level. The store warns when it goes down.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

from tiercache.config_remote import RemoteConfig
from tiercache.remote.format import BAD_MAC, BAD_VALUE, VANISHED, RemoteMiss, RemoteNamespace
from tiercache.remote.store import open_store
from tiercache.wire import RemoteCount, RemoteItem
from tiercache.worker.remote_io import (
    PendingRow,
    RemoteBlock,
    RemoteWriter,
    batches_of,
    check_values,
    rows_of,
    upload_rows,
)
from tiercache.worker.tier_worker import TierWorker

logger = logging.getLogger(__name__)
WRITE_EVENTS = ("written", "already_stored", "dropped_full", "write_failures")
READ_EVENTS = ("bad_values", "bad_macs", "vanished")  # blocks refused: value empty, of another size, wrong
# header or checksum; MAC failed, missing or unexpected; key gone after the lookup
FETCH_STAGES = ("exists", "get", "check", "fill")  # a fetch's stages, timed (stats: fetch_s_<stage>)
_EVENT_OF = {BAD_VALUE: "bad_values", BAD_MAC: "bad_macs", VANISHED: "vanished"}


class RemoteSteps:
    def __init__(
        self, config: RemoteConfig, namespace: RemoteNamespace, tiers: TierWorker, store=None
    ) -> None:
        self.tiers = tiers
        self.store = store if store is not None else open_store(config, namespace)
        self.writer = RemoteWriter(self.store, config.queue_blocks)
        self._reader = ThreadPoolExecutor(1, thread_name_prefix=f"tiercache-{self.store.tier_name}-reader")
        self._reported = dict.fromkeys(WRITE_EVENTS + READ_EVENTS, 0)  # totals at the last take_counts
        self._refused = dict.fromkeys(READ_EVENTS, 0)  # blocks whose value was refused, by event
        self.not_uploaded = 0  # uploads whose slot no longer held the block (a bug upstream if ever > 0)
        self.fetch_seconds = dict.fromkeys(FETCH_STAGES, 0.0)  # each stage written by one thread at a time
        self.fetch_bytes = 0
        # the fetched bytes' piece checksums computed on the host only where no load verifies them: the
        # worker's tiers record the values' own and check each piece on the device at every load
        self.verify = tiers.checksums is None

    def upload(self, items: Sequence[RemoteItem]) -> int:
        queued = 0
        for item, got in zip(items, upload_rows(self.tiers, items), strict=True):
            if isinstance(got, str):
                self.not_uploaded += 1
                logger.warning("tiercache: block %s %s", item.block_hash.hex()[:16], got)
                continue
            if isinstance(got, PendingRow):  # a VRAM block still on its way to the host
                queued += self.writer.offer_pending(item.block_hash, got)
                continue
            row, pieces = got  # a DRAM slot's row: copied into its value now (the writer writes meanwhile)
            queued += self.writer.offer(item.block_hash, row, pieces)
        return queued

    def start_fetch(self, items: Sequence[RemoteItem]) -> PendingFetch:
        return PendingFetch(self, items)

    def fetch(self, items: Sequence[RemoteItem]) -> dict[bytes, str]:
        return self.start_fetch(items).wait()

    def batch_blocks(self) -> int:
        """Blocks read per call of the reader thread (one batch: the remote store splits its own calls)."""
        return 1 << 30

    def _read(self, items: Sequence[RemoteItem], buffer: int):
        """On the reader thread: (the blocks the store does not hold, with why; the items of those it holds;
        their checked values: RemoteBlock or RemoteMiss each). buffer: the store's read buffer (disk)."""
        start = time.perf_counter()
        missing, todo = self._held(items)
        held = time.perf_counter()
        self.fetch_seconds["exists"] += held - start
        if not todo:
            return missing, todo, []
        hashes = [item.block_hash for item in todo]
        values, misses = self.store.get(hashes)
        got = time.perf_counter()
        self.fetch_seconds["get"] += got - held
        self.fetch_bytes += sum(v.numel() for v in values if v is not None)
        checked = check_values(self.store, hashes, values, misses, verify=self.verify)
        self.fetch_seconds["check"] += time.perf_counter() - got
        return missing, todo, checked

    def _held(self, items: Sequence[RemoteItem]) -> tuple[dict[bytes, str], list[RemoteItem]]:
        """(the blocks the store does not hold, with why; the items of those it holds): one existence call."""
        hashes = [item.block_hash for item in items]
        answer = self.store.exists(hashes)
        tier = self.store.tier_name
        failed = {
            h: f"{tier} fetch: {answer.reason or f'not in the {tier} store'}"
            for h, found in zip(hashes, answer.found, strict=True)
            if not found
        }
        _log_missed(failed)
        return failed, [item for item in items if item.block_hash not in failed]

    def _fill(self, todo: Sequence[RemoteItem], got: Sequence[RemoteBlock | RemoteMiss]) -> dict[bytes, str]:
        """got: the checked values of todo's blocks (read_blocks). The verified ones written into their DRAM
        slots; the others, with why (each refusal counted)."""
        start = time.perf_counter()
        tier = self.store.tier_name
        failed: dict[bytes, str] = {}
        good = [
            (item, block) for item, block in zip(todo, got, strict=True) if isinstance(block, RemoteBlock)
        ]
        for item, block in zip(todo, got, strict=True):
            if isinstance(block, RemoteMiss):
                failed[item.block_hash] = f"{tier} fetch: {block.reason}"
                self._refusal(item.block_hash, block)
        blocks = [block for _, block in good]
        for run in batches_of(blocks):  # each get call's rows copied once, into their DRAM slots
            rows = rows_of(blocks[run.start : run.stop])  # [n, dram_stride] uint8
            sums = torch.stack([block.pieces for block in blocks[run.start : run.stop]])  # [n, 2, L, 2]
            self.tiers.fill_dram([item for item, _ in good[run.start : run.stop]], rows, sums)
        _log_missed(failed)
        self.fetch_seconds["fill"] += time.perf_counter() - start
        return failed

    def refuse_loaded(self, block_hash: bytes, reason: str) -> None:
        """A block this tier's fetch filled into DRAM failed its load's check (its bytes do not have the piece
        checksums its value carries): the value is refused as a fetch's check would have (counted, not fetched
        again for a while, dropped from the disk tier)."""
        self._refusal(block_hash, RemoteMiss(BAD_VALUE, f"refused at its load: {reason}"))

    def _refusal(self, block_hash: bytes, miss: RemoteMiss) -> None:
        event = _EVENT_OF.get(miss.kind)
        if event is None:  # the store is down: it says so itself
            return
        if miss.kind in (BAD_VALUE, BAD_MAC):  # not fetched again for a while; the next upload rewrites it
            self.store.refuse(block_hash, miss)
        self._refused[event] += 1
        if self._refused[event] == 1:
            log = logger.info if miss.kind == VANISHED else logger.warning
            log(
                "tiercache: %s block %s refused: %s; it is recomputed, the other blocks are served and "
                "the store stays up; further ones are only counted (%s_%s)", self.store.tier_name,
                block_hash.hex()[:16], miss.reason, self.store.tier_name, event,
            )  # fmt: skip

    def take_counts(self) -> tuple[RemoteCount, ...]:
        totals = {**self.writer.stats(), **self._refused}
        counts = []
        for event in WRITE_EVENTS + READ_EVENTS:
            total = int(totals.get(event, 0))
            if total > self._reported[event]:
                counts.append(RemoteCount(event, total - self._reported[event]))
                self._reported[event] = total
        return tuple(counts)

    def stats(self) -> dict[str, int | str]:
        store = {f"store_{k}": v for k, v in self.store.stats().items()}
        fetch = {f"fetch_s_{stage}": s for stage, s in self.fetch_seconds.items()}
        return {
            **self.writer.stats(), **self._refused, **store, "not_uploaded": self.not_uploaded, **fetch,
            "fetch_bytes": self.fetch_bytes,
        }  # fmt: skip

    def close(self, timeout: float = 10.0) -> None:
        if not self.writer.flush(timeout):
            tier = self.store.tier_name
            logger.warning("tiercache: %s writes still queued after %gs at shutdown: dropped", tier, timeout)
        self.writer.close()
        self._reader.shutdown(cancel_futures=True)
        self.store.close()


class PendingFetch:
    """One step's fetch: its batches read and checked on the steps' reader thread, at most two ahead of the
    fills (a store may reuse its two read buffers: batch k reads into buffer k % 2, after batch k − 2 was
    filled), and filled into their DRAM slots by whoever polls."""

    def __init__(self, steps: RemoteSteps, items: Sequence[RemoteItem]) -> None:
        self.steps = steps
        per = steps.batch_blocks()
        self._batches = deque(items[start : start + per] for start in range(0, len(items), per))
        self._reading: deque = deque()  # (future, buffer), in batch order
        self._failed: dict[bytes, str] = {}
        for buffer in (0, 1):
            self._read_next(buffer)

    def poll(self) -> dict[bytes, str] | None:
        """Fill the batches read so far; once every batch is filled, the blocks not in DRAM, with why."""
        while self._reading and self._reading[0][0].done():
            future, buffer = self._reading.popleft()
            missing, todo, got = future.result()
            self._failed.update(missing)
            self._failed.update(self.steps._fill(todo, got))
            self._read_next(buffer)
        return None if self._reading else self._failed

    def wait(self) -> dict[bytes, str]:
        while (failed := self.poll()) is None:
            self._reading[0][0].result()
        return failed

    def _read_next(self, buffer: int) -> None:
        if self._batches:
            batch = self._batches.popleft()
            self._reading.append((self.steps._reader.submit(self.steps._read, batch, buffer), buffer))


def _log_missed(failed: dict[bytes, str]) -> None:
    for block_hash, reason in failed.items():
        logger.debug("tiercache: block %s: %s (recomputed)", block_hash.hex()[:16], reason)
