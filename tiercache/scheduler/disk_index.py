"""The disk tier's index (scheduler side): which blocks are on disk, what to write and what to drop. The
TierManager owns it (ManagerCore._disk, its verbs in disk_tier.py); the workers execute its writes, reads and
drops (StepPlan.disk_writes, disk_reads, disk_drops) in their stores' slots (tiercache.disk.store).

Provides:
    DiskIndex(capacity, write="evicted")        capacity: blocks per rank (tiercache.disk.files.disk_blocks);
                                                write: tiers.disk.write
        evicted(block_hash, slot, hits)         a block dropped from DRAM (its DRAM slot still holds it until
                                                the next step's start): queued for writing when the policy
                                                says so (write "reused": only blocks that had a hit) and
                                                it is not on disk yet; room made by dropping the least
                                                recently used blocks that no read holds
        restore(hashes)                         the blocks a scan found at start (oldest first): indexed;
                                                those beyond the capacity (a smaller size than before) are
                                                dropped: the oldest, as the store drops them at its start
        prefix(hashes) -> int                   leading blocks on disk
        pin(hashes) / unpin(hashes)             a read in flight (its block is not dropped meanwhile)
        forget(hashes)                          a block that failed a read (missing, torn, corrupted, I/O
                                                error): unindexed and dropped, never read again
        take() -> (writes, drops)               RemoteItem (DRAM slot → disk) and block hashes to drop,
                                                queued since the last call
        stats() -> dict                         disk_capacity, disk_blocks, disk_pinned, and counts:
                                                disk_planned_writes, disk_evictions, disk_not_written
        hashes                                  indexed blocks, least recently used first

A block is indexed when its write is planned: a write that fails (disk full, I/O error, the queue full)
leaves an index entry with nothing on disk, which the first read of it finds missing (a miss, then
forgotten). The index holds at most `capacity` blocks, as each rank's store holds at most `capacity` slots
(rank 0's index of slots is what this one is rebuilt from at start; every rank writes and drops the same
blocks), so the files on disk never exceed tiers.disk.size.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from collections.abc import Sequence
from itertools import islice

from tiercache.config_disk import DISK_WRITES
from tiercache.wire import DRAM, RemoteItem

logger = logging.getLogger("tiercache.scheduler.manager")


class DiskIndex:
    def __init__(self, capacity: int, write: str = "evicted") -> None:
        if capacity < 1 or write not in DISK_WRITES:
            raise ValueError(
                f"DiskIndex: capacity {capacity} (≥ 1) and write {write!r} (one of {DISK_WRITES})"
            )
        self.capacity = capacity
        self.write = write
        self._files: OrderedDict[bytes, int] = OrderedDict()  # block hash → reads in flight; LRU first
        self._writes: list[RemoteItem] = []
        self._drops: list[bytes] = []
        self._counts: Counter[str] = Counter()

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self._files

    def __len__(self) -> int:
        return len(self._files)

    @property
    def hashes(self) -> list[bytes]:
        return list(self._files)

    def evicted(self, block_hash: bytes, slot: int, hits: int) -> None:
        if block_hash in self._files or (self.write == "reused" and hits == 0):
            return
        if len(self._files) >= self.capacity and not self._make_room(1):
            self._counts["disk_not_written"] += 1  # every block is being read: rare, and only a lost copy
            return
        self._files[block_hash] = 0
        self._writes.append(RemoteItem(block_hash, slot, DRAM))
        self._counts["disk_planned_writes"] += 1

    def restore(self, hashes: Sequence[bytes]) -> None:
        for block_hash in hashes:
            self._files[block_hash] = 0
            self._files.move_to_end(block_hash)
        excess = len(self._files) - self.capacity
        if excess > 0:
            logger.info("tiercache: disk tier holds %d blocks beyond its size: the oldest dropped", excess)
            self._make_room(excess)

    def prefix(self, hashes: Sequence[bytes]) -> int:
        return next((i for i, h in enumerate(hashes) if h not in self._files), len(hashes))

    def pin(self, hashes: Sequence[bytes]) -> None:
        for block_hash in hashes:
            self._files[block_hash] += 1
            self._files.move_to_end(block_hash)

    def unpin(self, hashes: Sequence[bytes]) -> None:
        for block_hash in hashes:
            if self._files.get(block_hash, 0) > 0:
                self._files[block_hash] -= 1

    def forget(self, hashes: Sequence[bytes]) -> None:
        for block_hash in hashes:
            if self._files.get(block_hash) == 0:
                del self._files[block_hash]
                self._drops.append(block_hash)

    def take(self) -> tuple[list[RemoteItem], list[bytes]]:
        writes, drops = self._writes, self._drops
        self._writes, self._drops = [], []
        return writes, drops

    def stats(self) -> dict[str, int]:
        pinned = sum(1 for refs in self._files.values() if refs)
        base = {"disk_capacity": self.capacity, "disk_blocks": len(self._files), "disk_pinned": pinned}
        return {**base, **self._counts}

    def _make_room(self, n: int) -> bool:
        """Drop the n least recently used blocks no read holds; False when fewer than n could go."""
        victims = list(islice((h for h, refs in self._files.items() if not refs), n))
        for block_hash in victims:
            del self._files[block_hash]
        self._drops += victims
        self._counts["disk_evictions"] += len(victims)
        return len(victims) == n
