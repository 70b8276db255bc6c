"""The disk tier's on-disk format (issue 39): segment files of slots and their index. A restart finds the
blocks again, within the size it is given (the same blocks the scheduler's index keeps); a crash mid-write
loses at most the blocks in flight and never serves a torn one; an index that cannot be read and a directory
of the format before segments are handled and logged, never served from."""

from __future__ import annotations

import logging
import os

import pytest
import torch
from disk_helpers import LAYOUT, namespace, rows, segment_bytes, where, write

from tiercache.disk import segments as segments_module
from tiercache.disk.files import file_bytes, scan
from tiercache.disk.index import HEAD_BYTES, INDEX_NAME, RECORD_BYTES, Entry, IndexHead, SlotIndex, read_index
from tiercache.disk.segments import runs, segment_name
from tiercache.disk.store import DiskStore
from tiercache.remote.format import BAD_VALUE, RemoteMiss
from tiercache.scheduler.disk_index import DiskIndex
from tiercache.worker.remote_io import RemoteBlock, read_blocks

FB = file_bytes(LAYOUT)


def hashes_of(n: int, tag: int = 0) -> list[bytes]:
    return [bytes([tag, i]) * 8 for i in range(n)]


def test_a_restart_finds_the_blocks_and_serves_them(tmp_path):
    store = DiskStore(str(tmp_path), namespace(), 16, direct=None)
    hashes, data = hashes_of(6), rows(6)
    write(store, hashes, data).close()
    store.remove(hashes[:1])
    store.close()
    again = DiskStore(str(tmp_path), namespace(), 16, direct=None)
    assert again.exists(hashes).found == (False,) + (True,) * 5
    got = read_blocks(again, hashes[1:])
    assert torch.equal(torch.stack([b.row for b in got]), data[1:])
    assert [e.block_hash for e in scan(again.directory)] == hashes[1:]  # oldest first: write order
    write(again, hashes_of(1, tag=1), rows(1)).close()  # a free slot is taken: the removed block's
    assert again.stats()["held"] == 6 and segment_bytes(again.directory) == 6 * FB


@pytest.mark.parametrize("scan_first", [True, False])
def test_a_smaller_size_after_a_restart_keeps_the_newest_blocks_as_the_scheduler_does(tmp_path, scan_first):
    """Eight blocks written (in four writes, oldest first), then a restart with room for three: the store
    keeps the three newest (moving those beyond the new size into free slots below it) and cuts its files
    to three slots; the scheduler's DiskIndex, restored from a scan made before or after the store's start,
    keeps the same three."""
    store = DiskStore(str(tmp_path), namespace(), 8, direct=None)
    hashes, data = hashes_of(8), rows(8, seed=1)
    for k in range(0, 8, 2):
        write(store, hashes[k : k + 2], data[k : k + 2]).close()
    store.remove([hashes[0], hashes[7]])  # slots 0 and 7 free: the newest kept move into slots below 3
    store.close()
    found = scan(store.directory) if scan_first else None
    small = DiskStore(str(tmp_path), namespace(), 3, direct=None)
    index = DiskIndex(3)
    index.restore([e.block_hash for e in (found if scan_first else scan(small.directory))])
    assert set(index.hashes) == {hashes[4], hashes[5], hashes[6]}
    assert small.exists(index.hashes).found == (True, True, True) and small.stats()["held"] == 3
    got = read_blocks(small, [hashes[4], hashes[5], hashes[6]])
    assert torch.equal(torch.stack([b.row for b in got]), data[4:7])
    assert segment_bytes(small.directory) <= 3 * FB
    assert os.path.getsize(os.path.join(small.directory, INDEX_NAME)) == HEAD_BYTES + 3 * RECORD_BYTES
    assert sorted(e.slot for e in scan(small.directory)) == [0, 1, 2]


def test_a_crash_mid_write_loses_only_the_blocks_in_flight_and_serves_no_torn_one(tmp_path):
    """What a crash can leave: a slot whose data was half written under a record (its block a miss: header
    and checksum are checked), a record half written (not an entry: its slot is free again), and the
    direct-I/O probe's file (removed). The other blocks are served after the restart."""
    store = DiskStore(str(tmp_path), namespace(), 16, direct=False)
    hashes, data = hashes_of(3), rows(3, seed=2)
    write(store, hashes, data).close()
    store.close()
    path, at = where(store.directory, hashes[1])
    with open(path, "r+b") as f:  # the second half of its slot never reached the disk
        f.seek(at + FB // 2)
        f.write(bytes(FB - FB // 2))
    torn = read_index(os.path.join(store.directory, INDEX_NAME)).entries[2].slot
    with open(os.path.join(store.directory, INDEX_NAME), "r+b") as f:
        f.seek(HEAD_BYTES + torn * RECORD_BYTES + 40)  # inside the block hash: the record's check fails
        f.write(b"\xff" * 8)
    probe = os.path.join(store.directory, ".probe-x.tmp")
    open(probe, "wb").close()
    again = DiskStore(str(tmp_path), namespace(), 16, direct=False)
    assert not os.path.exists(probe)
    assert again.exists(hashes).found == (True, True, False)
    good, half = read_blocks(again, hashes[:2])
    assert isinstance(good, RemoteBlock) and torch.equal(good.row, data[0])
    assert (
        isinstance(half, RemoteMiss) and half.kind == BAD_VALUE and "corrupted piece checksums" in half.reason
    )
    assert torn in again._free  # the torn record's slot is free again


def test_a_deleted_segment_file_makes_its_blocks_misses(tmp_path, monkeypatch):
    monkeypatch.setattr(segments_module, "SEGMENT_BYTES", 3 * FB)  # three slots a segment
    store = DiskStore(str(tmp_path), namespace(), 9, direct=None)
    hashes, data = hashes_of(7), rows(7, seed=3)
    write(store, hashes, data, batch=7).close()
    store.close()
    assert sorted(os.listdir(store.directory)) == sorted([INDEX_NAME, *(segment_name(k) for k in range(3))])
    os.unlink(os.path.join(store.directory, segment_name(1)))  # slots 3-5
    again = DiskStore(str(tmp_path), namespace(), 9, direct=None)
    got = read_blocks(again, hashes)
    assert [isinstance(b, RemoteBlock) for b in got] == [True] * 3 + [False] * 3 + [True]
    assert all("truncated" in b.reason for b in got[3:6])
    assert torch.equal(torch.stack([b.row for b in got[:3] + got[6:]]), torch.cat([data[:3], data[6:]]))


@pytest.mark.parametrize("direct", [None, False])
def test_blocks_across_several_segments_are_written_and_read_in_runs(tmp_path, monkeypatch, direct):
    monkeypatch.setattr(segments_module, "SEGMENT_BYTES", 4 * FB + 100)  # four whole slots a segment
    store = DiskStore(str(tmp_path), namespace(), 10, direct=direct)
    hashes, data = hashes_of(10), rows(10, seed=4)
    write(store, hashes, data, batch=10).close()
    got = read_blocks(store, hashes[::-1] + hashes)  # a reversed run, then the slots in order
    assert torch.equal(torch.stack([b.row for b in got]), torch.cat([data.flip(0), data]))
    sizes = [os.path.getsize(os.path.join(store.directory, segment_name(k))) for k in range(3)]
    assert sizes == [4 * FB, 4 * FB, 2 * FB]


@pytest.mark.parametrize(
    "slots, segment_slots, most, expected",
    [
        ([0, 1, 2, 3], 8, 8, [range(0, 4)]),
        ([0, 1, 2, 3], 2, 8, [range(0, 2), range(2, 4)]),  # a segment's end
        ([0, 1, 2, 3, 4], 8, 2, [range(0, 2), range(2, 4), range(4, 5)]),  # at most `most`
        ([5, 6, 2, 3, 9], 16, 8, [range(0, 2), range(2, 4), range(4, 5)]),  # gaps and order
        ([None, 1, 2, None, None, 7], 16, 8, [range(1, 3), range(5, 6)]),  # no slot: in no run
        ([3, 2, 1], 16, 8, [range(0, 1), range(1, 2), range(2, 3)]),  # descending: one each
        ([], 4, 4, []),
    ],
)
def test_runs_grid(slots, segment_slots, most, expected):
    assert runs(slots, segment_slots, most) == expected


def test_the_index_keeps_each_blocks_newest_record_and_marks_the_rest_stale(tmp_path):
    path = str(tmp_path / INDEX_NAME)
    index = SlotIndex(path, IndexHead(FB, 100), 8)
    a, b = b"a" * 32, b"b" * 64
    index.write([Entry(0, a, 5), Entry(1, b, 7)])
    index.write([Entry(3, a, 9)])  # a moved (a crash between writing its new record and clearing the old)
    index.write([Entry(5, b"c" * 20, 1)])
    index.clear([5])
    index.close()
    found = read_index(path)
    assert found.head == IndexHead(FB, 100)
    assert found.entries == [Entry(1, b, 7), Entry(3, a, 9)] and found.stale == [0]
    with pytest.raises(ValueError, match="1 to 64"):
        SlotIndex(path, IndexHead(FB, 100), 8).write([Entry(2, b"x" * 65, 1)])


def test_an_unreadable_index_starts_the_tier_afresh_and_says_so(tmp_path, caplog):
    store = DiskStore(str(tmp_path), namespace(), 8, direct=False)
    write(store, hashes_of(2), rows(2)).close()
    store.close()
    with open(os.path.join(store.directory, INDEX_NAME), "r+b") as f:
        f.write(b"JUNK")
    with caplog.at_level(logging.WARNING, logger="tiercache.disk.store"):
        again = DiskStore(str(tmp_path), namespace(), 8, direct=False)
    assert "cannot be read; the tier starts empty (1 segment files deleted)" in caplog.text
    assert again.stats()["held"] == 0 and segment_bytes(again.directory) == 0
    assert read_index(os.path.join(again.directory, INDEX_NAME)).head == IndexHead(FB, (1 << 30) // FB)


def test_a_directory_of_the_format_before_segments_is_never_served_and_is_removed(tmp_path, caplog):
    """One file per block named by its hash (tiercache before segments): this version does not read them;
    it removes them (their count and bytes logged once), so they neither stay beyond tiers.disk.size nor
    are served, and the tier works in the same directory."""
    first = DiskStore(str(tmp_path), namespace(), 8, direct=False)
    directory = first.directory
    first.close()
    os.unlink(os.path.join(directory, INDEX_NAME))
    old = hashes_of(3, tag=9)
    for h in old:
        with open(os.path.join(directory, h.hex() + ".blk"), "wb") as f:
            f.write(bytes(FB))
    open(os.path.join(directory, old[0].hex() + ".blk.tmp"), "wb").close()
    with caplog.at_level(logging.WARNING, logger="tiercache.disk.store"):
        store = DiskStore(str(tmp_path), namespace(), 8, direct=False)
    assert "removed 4 block files" in caplog.text and "format before segment files" in caplog.text
    assert not [n for n in os.listdir(directory) if ".blk" in n]
    assert store.exists(old).found == (False,) * 3 and scan(directory) == []
    hashes, data = hashes_of(2), rows(2)
    write(store, hashes, data).close()
    assert torch.equal(torch.stack([b.row for b in read_blocks(store, hashes)]), data)


def test_directories_of_older_value_formats_are_removed_at_start_and_others_kept(
    tmp_path, monkeypatch, caplog
):
    """Blocks an engine of value format 2 wrote (under a salt of its own: a directory never read again) are
    deleted when a disk tier of this version starts on the same root, logged; another codec's directory of
    this format stays."""
    from tiercache.remote import format as fmt

    other = DiskStore(str(tmp_path), namespace(codec="codec-b"), 8, direct=False)
    write(other, hashes_of(2), rows(2, seed=8)).close()
    other.close()
    with monkeypatch.context() as m:
        m.setitem(fmt._CODEC_MAX, 2, fmt._CODEC_MAX[fmt.VERSION])
        m.setattr(fmt, "VERSION", 2)
        old = DiskStore(str(tmp_path), namespace(), 8, direct=False)
        write(old, hashes_of(2), rows(2, seed=7)).close()
        old.close()
    assert os.path.isdir(old.directory) and os.path.isdir(other.directory)
    with caplog.at_level(logging.WARNING, logger="tiercache"):
        ours = DiskStore(str(tmp_path), namespace(), 8, direct=False)
    assert ours.directory != old.directory and ours.exists(hashes_of(2)).found == (False, False)
    assert not os.path.exists(old.directory) and not os.path.exists(os.path.dirname(old.directory))
    assert "value format this version never reads" in caplog.text and old.directory in caplog.text
    assert {e.block_hash for e in scan(other.directory)} == set(hashes_of(2))
    ours.close()
