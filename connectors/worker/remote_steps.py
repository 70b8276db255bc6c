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
        fetch(items) -> dict[bytes, str]    fetch, verify (MAC when a secret is set; header: codec id, block
                                            hash, size; checksum) and write into DRAM the blocks; the blocks
                                            that were not, with why. Each block on its own: a bad value is a
                                            miss for its block, the others of the fetch are served
        take_counts() -> tuple[RemoteCount, ...]   since the last call, for the worker's report (the
                                            scheduler's remote_<event> counters): the writer's outcomes
                                            (written, already_stored, dropped_full, write_failures) and the
                                            blocks whose value was refused (READ_EVENTS: bad_values,
                                            bad_macs, vanished; a refused value is told to the store, which
                                            then neither fetches it again for a while nor skips its rewrite)
        stats() -> dict                     the writer's, the reads' and the store's counters
        close(timeout)                      wait for queued writes (at most timeout), then stop

Order within a step (the worker keeps it): uploads, then fetches, then loads. A fetch asks the store which
blocks it holds first (a GET of a key that is not there costs a timeout and the adapter's connections).

A refused value is logged once per kind, as a warning naming its real cause (vanished: info, it is what
eviction does), then only counted; a block's own line is at debug level. The store warns when it goes down.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from tiercache.config_remote import RemoteConfig
from tiercache.remote.format import BAD_MAC, BAD_VALUE, VANISHED, RemoteMiss, RemoteNamespace
from tiercache.remote.store import open_store
from tiercache.wire import RemoteCount, RemoteItem
from tiercache.worker.remote_io import (
    RemoteBlock,
    RemoteWriter,
    batches_of,
    read_blocks,
    rows_of,
    upload_rows,
)
from tiercache.worker.tier_worker import TierWorker

logger = logging.getLogger(__name__)
WRITE_EVENTS = ("written", "already_stored", "dropped_full", "write_failures")
READ_EVENTS = ("bad_values", "bad_macs", "vanished")  # blocks refused: value empty, of another size, wrong
# header or checksum; MAC failed, missing or unexpected; key gone after the lookup
_EVENT_OF = {BAD_VALUE: "bad_values", BAD_MAC: "bad_macs", VANISHED: "vanished"}


class RemoteSteps:
    def __init__(
        self, config: RemoteConfig, namespace: RemoteNamespace, tiers: TierWorker, store=None
    ) -> None:
        self.tiers = tiers
        self.store = store if store is not None else open_store(config, namespace)
        self.writer = RemoteWriter(self.store, config.queue_blocks)
        self._reported = dict.fromkeys(WRITE_EVENTS + READ_EVENTS, 0)  # totals at the last take_counts
        self._refused = dict.fromkeys(READ_EVENTS, 0)  # blocks whose value was refused, by event
        self.not_uploaded = 0  # uploads whose slot no longer held the block (a bug upstream if ever > 0)

    def upload(self, items: Sequence[RemoteItem]) -> int:
        queued = 0
        for item, got in zip(items, upload_rows(self.tiers, items), strict=True):
            if isinstance(got, str):
                self.not_uploaded += 1
                logger.warning("tiercache: block %s %s", item.block_hash.hex()[:16], got)
                continue
            row, checksum = got
            queued += self.writer.offer(item.block_hash, row, checksum)
        return queued

    def fetch(self, items: Sequence[RemoteItem]) -> dict[bytes, str]:
        if not items:
            return {}
        failed, todo = self._held(items)
        got = read_blocks(self.store, [item.block_hash for item in todo]) if todo else []
        failed.update(self._fill(todo, got))
        return failed

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
        return failed

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
        return {**self.writer.stats(), **self._refused, **store, "not_uploaded": self.not_uploaded}

    def close(self, timeout: float = 10.0) -> None:
        if not self.writer.flush(timeout):
            tier = self.store.tier_name
            logger.warning("tiercache: %s writes still queued after %gs at shutdown: dropped", tier, timeout)
        self.writer.close()
        self.store.close()


def _log_missed(failed: dict[bytes, str]) -> None:
    for block_hash, reason in failed.items():
        logger.debug("tiercache: block %s: %s (recomputed)", block_hash.hex()[:16], reason)
