"""The TierManager's disk-tier verbs (scheduler side): which blocks the disk holds, and DRAM slots for blocks
read from it. A mixin of ManagerCore (core.py), whose DiskIndex (disk_index.py) is the one record of the
files; TierManager (manager.py) combines it with the other verb groups.

Provides:
    DiskVerbs                                   the TierManager's disk verbs (a mixin of ManagerCore)
        disk_prefix(hashes) -> int              leading blocks on disk that the manager does not hold (a read
                                                of a block known here would be refused)
        prepare_disk_read(hashes) -> PrepareLoadOutput | None   DRAM slots for them (prepare_fetch), their
                                                disk blocks pinned; None: no room, or a block is known here
        complete_disk_read(hashes, ok, reason, keep_file=False)   the read and its load are done: ready in
                                                DRAM, or released and (unless keep_file: it was never read)
                                                the disk block forgotten
        take_disk_plan() -> (writes, drops)     DiskIndex.take (nothing without a disk tier)
        restore_disk(hashes)                    the blocks a scan of the disk tier's index found at start,
                                                oldest first (DiskIndex.restore)
"""

from __future__ import annotations

from collections.abc import Sequence

from tiercache.scheduler.abstract import PrepareLoadOutput
from tiercache.scheduler.core import ManagerCore
from tiercache.wire import DISK, RemoteItem


class DiskVerbs(ManagerCore):
    def disk_prefix(self, hashes: Sequence[bytes]) -> int:
        if self._disk is None:
            return 0
        n = self._disk.prefix(hashes)
        return next((i for i, h in enumerate(hashes[:n]) if h in self._index), n)

    def prepare_disk_read(self, hashes: Sequence[bytes]) -> PrepareLoadOutput | None:
        if self._disk is None or self._disk.prefix(hashes) < len(hashes):
            return self._fetch_refused(hashes, "a block is not on disk", DISK)
        self._disk.pin(hashes)  # first: the DRAM room made for them may write others, dropping old blocks
        try:
            out = self.prepare_fetch(hashes, source=DISK)
        except Exception:
            self._disk.unpin(hashes)
            raise
        if out is None:
            self._disk.unpin(hashes)
        return out

    def complete_disk_read(
        self, hashes: Sequence[bytes], ok: bool = True, reason: str = "", keep_file: bool = False
    ) -> None:
        self.complete_fetch(hashes, ok, reason, source=DISK)
        if self._disk is not None:
            self._disk.unpin(hashes)
            if not ok and not keep_file:
                self._disk.forget(hashes)

    def take_disk_plan(self) -> tuple[list[RemoteItem], list[bytes]]:
        return self._disk.take() if self._disk is not None else ([], [])

    def restore_disk(self, hashes: Sequence[bytes]) -> None:
        if self._disk is not None:
            self._disk.restore(hashes)
