"""The manager's disk tier (issue 39): blocks dropped from DRAM are written once, within the size limit (the
least recently used files dropped, never one being read), read back into DRAM slots, forgotten when a read
fails, and restored from a scan within the size limit."""

from __future__ import annotations

import pytest

from tiercache.scheduler.disk_index import DiskIndex
from tiercache.scheduler.manager import TierManager
from tiercache.wire import DRAM, VRAM


def h(i: int) -> bytes:
    return i.to_bytes(4, "little") * 4


def manager(disk_blocks: int = 4, write: str = "evicted") -> TierManager:
    return TierManager(2, 2, "c", spill_watermark=0, disk_blocks=disk_blocks, disk_write=write)


def store(m: TierManager, hashes: list[bytes]) -> None:
    out = m.prepare_store(hashes)
    m.complete_store(out.block_hashes)
    for job in m.take_jobs():
        m.complete_transfer(job.job_id)


def test_blocks_dropped_from_dram_are_written_once_from_their_slots():
    m = manager()
    slots = {}
    for i in range(0, 6, 2):
        store(m, [h(i), h(i + 1)])
        slots.update({b.block_hash: b.slot for b in m.view().blocks(DRAM)})
    writes, drops = m.take_disk_plan()
    gone = [h(i) for i in range(6) if h(i) not in m.view()]
    assert len(gone) == 2 and sorted(w.block_hash for w in writes) == sorted(gone) and drops == []
    assert all(w.tier == DRAM and w.slot == slots[w.block_hash] for w in writes)
    assert m.disk_prefix([*gone, h(99)]) == 2 and m.stats()["disk_blocks"] == 2
    out = m.prepare_disk_read(gone)
    assert out is not None and out.tiers == (DRAM, DRAM)
    m.complete_disk_read(gone)
    assert all(m.view().block(b).ready for b in gone)
    for i in range(10, 18, 2):  # pushes them out of DRAM again: not written twice
        store(m, [h(i), h(i + 1)])
    assert all(b not in m.view() for b in gone)
    writes, _ = m.take_disk_plan()
    assert not {w.block_hash for w in writes} & set(gone)
    m.check()


def test_the_size_limit_drops_the_least_recently_used_file_not_one_being_read():
    index = DiskIndex(2)
    index.evicted(h(1), 0, 0)
    index.evicted(h(2), 1, 0)
    index.pin([h(1)])  # a read in flight
    index.evicted(h(3), 0, 0)  # room: h(2) goes, h(1) stays
    writes, drops = index.take()
    assert [w.block_hash for w in writes] == [h(1), h(2), h(3)] and drops == [h(2)]
    index.pin([h(3)])
    index.evicted(h(4), 0, 0)  # every file is being read: not written
    assert index.take() == ([], []) and index.stats()["disk_not_written"] == 1
    index.unpin([h(1)])
    index.forget([h(1)])  # a read failed: unindexed, deleted
    assert index.take() == ([], [h(1)]) and h(1) not in index


def test_write_reused_writes_only_blocks_that_had_a_hit():
    index = DiskIndex(8, write="reused")
    index.evicted(h(1), 0, hits=0)
    index.evicted(h(2), 1, hits=3)
    assert [w.block_hash for w in index.take()[0]] == [h(2)]


def test_restore_keeps_the_newest_files_within_the_size():
    index = DiskIndex(3)
    index.restore([h(i) for i in range(5)])  # oldest first
    assert index.hashes == [h(2), h(3), h(4)] and index.take() == ([], [h(0), h(1)])


def test_a_failed_read_forgets_the_file_and_a_refused_step_keeps_it():
    m = manager()
    m.restore_disk([h(1), h(2)])
    assert m.prepare_disk_read([h(1)]) is not None
    m.complete_disk_read([h(1)], ok=False, reason="disk fetch: checksum mismatch")
    assert m.disk_prefix([h(1)]) == 0 and m.take_disk_plan() == ([], [h(1)])
    assert m.prepare_disk_read([h(2)]) is not None
    m.complete_disk_read([h(2)], ok=False, reason="step refused", keep_file=True)
    assert m.disk_prefix([h(2)]) == 1 and m.view().block(h(2)) is None
    m.check()


def test_a_block_held_here_is_not_read_from_disk():
    m = manager()
    m.restore_disk([h(1)])
    store(m, [h(1)])  # stored again (recomputed)
    assert m.view().block(h(1)).tier == VRAM
    assert m.disk_prefix([h(1)]) == 0 and m.prepare_disk_read([h(1)]) is None


@pytest.mark.parametrize("capacity, write", [(0, "evicted"), (4, "always")])
def test_disk_index_checks_its_arguments(capacity, write):
    with pytest.raises(ValueError):
        DiskIndex(capacity, write)


def test_the_room_made_for_a_read_never_drops_the_files_being_read():
    """A disk read takes DRAM slots; the blocks DRAM drops for them are written, and the disk's room for
    those comes from other files: never from the ones being read."""
    m = TierManager(1, 2, "c", spill_watermark=0, disk_blocks=2)
    m.restore_disk([h(1), h(2)])
    for i in (10, 11, 12):  # VRAM 1 + DRAM 2: full
        store(m, [h(i)])
    m.take_disk_plan()
    out = m.prepare_disk_read([h(1), h(2)])  # drops 2 DRAM blocks, whose writes need the disk's room
    assert out is not None
    writes, drops = m.take_disk_plan()
    assert drops == [] and m.view().on_disk(h(1)) and m.view().on_disk(h(2))
    assert writes == [] and m.stats()["disk_not_written"] == 2  # no unpinned file to make room with
    m.complete_disk_read([h(1), h(2)])
    m.check()
