"""The disk tier's blocks on real directories (issue 39): the write-behind queue writes each block once into a
slot of a segment file, reads verify header and checksum, and every bad slot is a miss of its own block;
tiers.disk's config checks. Restarts, the index and old-format directories: test_disk_format.py."""

from __future__ import annotations

import os
import shutil
import threading

import pytest
import torch
from disk_helpers import LAYOUT, namespace, rows, segment_bytes, where, write

from tiercache.config import TierCacheConfig
from tiercache.disk import store as store_module
from tiercache.disk.buffers import ARENA_SLOTS
from tiercache.disk.files import disk_blocks, file_bytes, scan
from tiercache.disk.index import HEAD_BYTES, RECORD_BYTES
from tiercache.disk.store import DiskStore
from tiercache.errors import ConfigError
from tiercache.remote.format import BAD_VALUE, DOWN, VANISHED, RemoteMiss, encode_value
from tiercache.wire import DRAM
from tiercache.worker.integrity import checksums_of
from tiercache.worker.pools import block_views
from tiercache.worker.remote_io import RemoteBlock, RemoteWriter, read_blocks

DIRECT = [None, False]  # probed (direct where the file system allows it), buffered
SLOTS = 64


@pytest.mark.parametrize("direct", DIRECT)
def test_blocks_written_once_read_back_byte_exact(tmp_path, direct):
    store = DiskStore(str(tmp_path), namespace(), SLOTS, direct=direct)
    hashes = [bytes([i]) * 16 for i in range(6)]
    data = rows(6)
    writer = write(store, hashes, data)
    write_again = write(store, hashes[:2], data[:2])
    assert writer.stats()["written"] == 6 and write_again.stats()["already_stored"] == 2
    got = read_blocks(store, hashes)
    assert all(isinstance(b, RemoteBlock) for b in got)
    assert torch.equal(torch.stack([b.row for b in got]), data)
    assert {e.block_hash for e in scan(store.directory)} == set(hashes)
    assert sorted(e.slot for e in scan(store.directory)) == list(range(6))  # the lowest slots, in runs
    assert segment_bytes(store.directory) == 6 * file_bytes(LAYOUT)
    assert store.stats()["held"] == 6 and store.stats()["writes"] == 6
    writer.close()
    write_again.close()


@pytest.mark.parametrize("direct", DIRECT)
def test_each_bad_slot_is_a_miss_of_its_own_block(tmp_path, direct):
    store = DiskStore(str(tmp_path), namespace(), SLOTS, direct=direct)
    hashes = [bytes([i]) * 16 for i in range(4)]
    write(store, hashes[:2] + hashes[3:], rows(3)).close()  # hashes[2] never written
    path, at = where(store.directory, hashes[0])
    with open(path, "r+b") as f:
        f.seek(at + 300)  # a payload byte
        byte = f.read(1)[0]
        f.seek(at + 300)
        f.write(bytes([byte ^ 1]))
    path, at = where(store.directory, hashes[3])  # the last slot: the file cut inside it
    os.truncate(path, at + 1000)
    corrupted, good, missing, truncated = read_blocks(store, hashes)
    assert isinstance(corrupted, RemoteMiss) and "checksum mismatch" in corrupted.reason
    assert corrupted.reason.startswith("disk value refused")
    assert (
        isinstance(truncated, RemoteMiss) and truncated.kind == BAD_VALUE and "truncated" in truncated.reason
    )
    assert isinstance(missing, RemoteMiss) and missing.kind == VANISHED
    assert isinstance(good, RemoteBlock)
    store.refuse(hashes[0], corrupted)
    assert store.exists(hashes).found == (False, True, False, True)
    assert hashes[0] not in {e.block_hash for e in scan(store.directory)}  # its record cleared


def test_a_slot_holding_another_block_is_refused(tmp_path):
    store = DiskStore(str(tmp_path), namespace(), SLOTS, direct=False)
    a, b = b"a" * 16, b"b" * 16
    write(store, [a, b], rows(2)).close()
    (path_a, at_a), (_, at_b) = where(store.directory, a), where(store.directory, b)
    with open(path_a, "r+b") as f:
        f.seek(at_b)
        value_b = f.read(file_bytes(LAYOUT))
        f.seek(at_a)
        f.write(value_b)
    got_a, got_b = read_blocks(store, [a, b])
    assert isinstance(got_a, RemoteMiss) and "block hash mismatch" in got_a.reason
    assert isinstance(got_b, RemoteBlock)


def test_other_codecs_and_models_use_other_directories(tmp_path):
    dirs = {DiskStore(str(tmp_path), ns, SLOTS, direct=False).directory for ns in
            (namespace(), namespace(codec="codec-b"), namespace(model="org/other"))}  # fmt: skip
    assert len(dirs) == 3 and all(d.startswith(str(tmp_path)) for d in dirs)


def test_withdrawn_blocks_leave_nothing_on_disk(tmp_path):
    """A drop of a block whose write is queued or being written: it does not stay on disk."""
    store = DiskStore(str(tmp_path), namespace(), SLOTS, direct=False)
    writer = RemoteWriter(store, max_blocks=256, batch_blocks=8)
    hashes = [i.to_bytes(2, "little") * 8 for i in range(64)]
    data = rows(64)
    pieces = checksums_of(block_views(data, LAYOUT))
    for h, row, p in zip(hashes, data, pieces, strict=True):
        writer.offer(h, row, p)
    writer.withdraw(hashes[::2], store.remove)
    assert writer.flush(30)
    assert {e.block_hash for e in scan(store.directory)} == set(hashes[1::2])
    assert store.exists(hashes).found == (False, True) * 32
    writer.close()


@pytest.mark.parametrize("direct", DIRECT)
def test_freed_slots_are_written_over_and_the_files_never_grow_past_the_size(tmp_path, direct):
    """Blocks dropped free their slots, which the next blocks take (the lowest first): the segment files stay
    within `slots` slots however many blocks pass through, and every block reads back exact."""
    store = DiskStore(str(tmp_path), namespace(), 8, direct=direct)
    data = rows(40, seed=2)
    for round_ in range(5):
        hashes = [bytes([round_, i]) * 8 for i in range(8)]
        write(store, hashes, data[8 * round_ : 8 * round_ + 8], batch=3).close()
        got = read_blocks(store, hashes)
        assert torch.equal(torch.stack([b.row for b in got]), data[8 * round_ : 8 * round_ + 8])
        assert segment_bytes(store.directory) <= 8 * file_bytes(LAYOUT)
        store.remove(hashes[::2] if round_ % 2 else hashes)
        store.remove(hashes)
    assert store.stats()["held"] == 0 and store.stats()["removed"] == 40


def test_no_free_slot_is_a_counted_write_failure(tmp_path):
    """More blocks than slots (the scheduler's index never plans that; a write withdrawn mid-write can):
    the blocks that find no slot are not written, counted and named; the others are."""
    store = DiskStore(str(tmp_path), namespace(), 3, direct=False)
    hashes = [bytes([i]) * 16 for i in range(5)]
    writer = write(store, hashes, rows(5), batch=5)
    assert writer.stats()["write_failures"] >= 2  # the writer counts a batch with a failure whole
    assert store.stats()["write_errors"] == 2 and "slots all hold blocks" in store.stats()["last_error"]
    assert store.exists(hashes).found == (True, True, True, False, False)
    writer.close()


def test_a_write_that_fails_is_counted_not_raised(tmp_path):
    """The directory gone under the store (a failed or unmounted disk): writes fail, reads miss."""
    store = DiskStore(str(tmp_path), namespace(), SLOTS, direct=False)
    shutil.rmtree(store.directory)
    writer = write(store, [b"x" * 16], rows(1))
    assert writer.stats()["write_failures"] == 1 and store.stats()["write_errors"] == 1
    assert "disk write failed" in store.stats()["last_error"]
    (got,) = read_blocks(store, [b"x" * 16])
    assert isinstance(got, RemoteMiss) and got.kind == VANISHED
    writer.close()


# ------------------------------------------------------------------ tiers.disk
def config(tmp_path, **disk) -> TierCacheConfig:
    return TierCacheConfig.from_dict(
        {"tiers": {"disk": {"path": str(tmp_path / "cache"), "size": "1GiB", **disk}}}
    )


def test_config_round_trips_and_sizes_blocks(tmp_path):
    cfg = config(tmp_path, write="reused")
    assert TierCacheConfig.from_dict(cfg.to_dict()) == cfg
    assert disk_blocks(cfg, LAYOUT) == (2**30 - HEAD_BYTES) // (file_bytes(LAYOUT) + RECORD_BYTES)
    assert disk_blocks(config(tmp_path, size="320 tokens"), LAYOUT) == 10


@pytest.mark.parametrize(
    "disk, words",
    [
        ({"path": None, "size": "1GiB"}, "tiers.disk.path is required"),
        ({"path": "FILE/cache", "size": "1GiB"}, "cannot be created"),
        ({"size": 0}, "above 0"),
        ({"size": "1000TiB"}, "more than the"),
        ({"size": "1GiB", "write": "always"}, "evicted"),
        ({"size": "1GiB", "queue_blocks": 0}, "queue_blocks"),
        ({"size": "1GiB", "paht": "/x"}, "unknown key"),
    ],
)
def test_config_errors_name_the_fix(tmp_path, disk, words):
    (tmp_path / "FILE").write_text("")
    disk = {"path": str(tmp_path), **disk}
    if disk["path"] is not None:
        disk["path"] = disk["path"].replace("FILE", str(tmp_path / "FILE"))
    with pytest.raises(ConfigError, match=words):
        TierCacheConfig.from_dict({"tiers": {"disk": disk}})


def test_a_file_as_path_and_a_size_below_one_block_are_refused(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(ConfigError, match="not a directory"):
        TierCacheConfig.from_dict({"tiers": {"disk": {"path": str(tmp_path / "f"), "size": "1GiB"}}})
    least = HEAD_BYTES + file_bytes(LAYOUT) + RECORD_BYTES
    with pytest.raises(ConfigError, match=f"at least .*{least:,} bytes"):
        disk_blocks(config(tmp_path, size=f"{least - 1}B"), LAYOUT)
    assert disk_blocks(config(tmp_path, size=f"{least}B"), LAYOUT) == 1


@pytest.mark.parametrize("verify", [False, True])
def test_disk_steps_write_dram_slots_and_read_them_back_in_bounded_batches(tmp_path, monkeypatch, verify):
    """The worker's disk steps on a real TierWorker (CPU): DRAM slots written to disk, then read back into
    other slots a few blocks at a time (the read buffers reused), byte-exact and tagged; a slot past the end
    of its cut segment file is a miss of its block only, and a dropped block is gone. A corrupted slot: with
    verify (a worker whose loads check nothing) a miss at the read; without (the worker's tiers keep slot
    checksums: the default), filled into DRAM with the piece checksums it was written with, and refused by
    the load's check."""
    from tiercache.config_disk import DiskConfig
    from tiercache.connectors.worker import disk_steps
    from tiercache.units import Size
    from tiercache.wire import LoadItem, RemoteItem
    from tiercache.worker.tier_worker import TierWorker

    monkeypatch.setattr(disk_steps, "READ_BATCH_BYTES", 2 * file_bytes(LAYOUT))
    tiers = TierWorker.create(LAYOUT, 2, 16, "codec-a", device="cpu")
    steps = disk_steps.DiskSteps(DiskConfig(str(tmp_path), Size(bytes=2**24)), namespace(), tiers)
    assert steps.verify is False  # the tiers verify every load
    steps.verify = verify
    reserved = steps.store.values.held  # the write queue's values, allocated at start
    assert reserved >= 256 + steps.writer.batch_blocks
    hashes = [bytes([i]) * 16 for i in range(5)]
    data = rows(5)
    sums = checksums_of(block_views(data, LAYOUT))
    tiers.fill_dram([RemoteItem(h, i) for i, h in enumerate(hashes)], data, sums)
    assert steps.upload([RemoteItem(h, i) for i, h in enumerate(hashes)]) == 5
    assert steps.writer.flush(30)
    assert steps.store.values.held == reserved  # nothing allocated on the step's thread
    path, at = where(steps.store.directory, hashes[3])
    with open(path, "r+b") as f:
        f.seek(at + 5000)
        f.write(b"\xff\x00\xff")
    path, at = where(steps.store.directory, hashes[4])  # the highest slot
    os.truncate(path, at + file_bytes(LAYOUT) // 3)
    failed = steps.fetch([RemoteItem(h, 8 + i) for i, h in enumerate(hashes)])
    assert "truncated" in failed[hashes[4]]
    for i, h in enumerate(hashes):
        if i < 3:
            assert torch.equal(tiers.dram.buffer[8 + i], data[i]) and tiers.tags.tag(DRAM, 8 + i)[0] == h
    if verify:
        assert list(failed) == [hashes[3], hashes[4]] and "checksum mismatch" in failed[hashes[3]]
    else:
        assert list(failed) == [hashes[4]]
        items = [LoadItem(hashes[2], DRAM, 10, 0), LoadItem(hashes[3], DRAM, 11, 1)]
        refused = tiers.verify(items, tiers.load(items))
        assert refused[0] is None and "checksum" in refused[1], refused
    steps.drop(hashes[:2])
    left = {hashes[2]} if verify else {hashes[2], hashes[3]}  # blocks refused at the read are freed
    assert {e.block_hash for e in scan(steps.store.directory)} == left
    refusals = 2 if verify else 1
    assert dict((c.event, c.blocks) for c in steps.take_counts()) == {"written": 5, "bad_values": refusals}
    steps.close()


def test_fetches_of_several_steps_in_flight_each_read_into_buffers_of_their_own(tmp_path):
    """Two steps' fetches started before either is polled (a slow disk: the engine steps on meanwhile): the
    second's reads must not overwrite rows the first has checked but not yet copied into DRAM; finished
    fetches give their buffers back for the next ones."""
    from tiercache.config_disk import DiskConfig
    from tiercache.connectors.worker.disk_steps import DiskSteps
    from tiercache.units import Size
    from tiercache.wire import RemoteItem
    from tiercache.worker.tier_worker import TierWorker

    tiers = TierWorker.create(LAYOUT, 2, 16, "codec-a", device="cpu")
    steps = DiskSteps(DiskConfig(str(tmp_path), Size(bytes=2**24)), namespace(), tiers)
    hashes = [bytes([i]) * 16 for i in range(4)]
    data = rows(4, seed=5)
    items = [RemoteItem(h, i) for i, h in enumerate(hashes)]
    tiers.fill_dram(items, data, checksums_of(block_views(data, LAYOUT)))
    assert steps.upload(items) == 4 and steps.writer.flush(30)
    first = steps.start_fetch([RemoteItem(hashes[0], 8), RemoteItem(hashes[1], 9)])
    second = steps.start_fetch([RemoteItem(hashes[2], 10), RemoteItem(hashes[3], 11)])
    assert second.wait() == {}  # both read and checked; only the second copied into DRAM
    assert first.wait() == {}
    for i in range(4):
        assert torch.equal(tiers.dram.buffer[8 + i], data[i]), i
    assert len(steps._spare) == 2  # one fetch's buffers kept for the next
    steps.close()


@pytest.mark.parametrize("direct", DIRECT)
def test_the_writer_reuses_its_value_buffers_and_slots_stay_exact(tmp_path, direct):
    """Values are encoded into the store's page-aligned buffers (written to their slots as they are) and
    come back to it once written: rounds of writes reuse the same buffers, and every slot reads back
    byte-exact, zero padding included; values a full queue dropped go back too."""
    store = DiskStore(str(tmp_path), namespace(), SLOTS, direct=direct)
    data = rows(12, seed=3)
    for round_ in range(3):  # a round's buffers are free again once flushed
        hashes = [bytes([round_, i]) * 8 for i in range(4)]
        writer = write(store, hashes, data[4 * round_ : 4 * round_ + 4])
        assert writer.stats()["written"] == 4
        writer.close()
        got = read_blocks(store, hashes)
        assert torch.equal(torch.stack([b.row for b in got]), data[4 * round_ : 4 * round_ + 4])
    assert store.values.held == ARENA_SLOTS  # one arena: at most queue + batch in use
    assert store.values.free == store.values.held
    for h in (bytes([2, i]) * 8 for i in range(4)):
        path, at = where(store.directory, h)
        with open(path, "rb") as f:
            f.seek(at)
            content = f.read(file_bytes(LAYOUT))
        assert len(content) == file_bytes(LAYOUT) and not any(content[namespace().value_bytes :])
    full = RemoteWriter(store, max_blocks=1, batch_blocks=1)
    pieces = checksums_of(block_views(data[:1], LAYOUT))[0]
    offered = [full.offer(bytes([9, i]) * 8, data[0], pieces) for i in range(50)]
    assert full.flush(30) and full.stats()["dropped_full"] == offered.count(False)  # a queue of one: some
    full.close()
    assert store.values.free == store.values.held  # every buffer back, the dropped ones included


@pytest.mark.parametrize("direct", DIRECT)
def test_values_not_from_the_store_are_staged_and_written_exact(tmp_path, direct):
    """put of values the caller encoded itself (not new_value's): copied into aligned staging rows, runs
    written in parallel; every slot exact, zero padding included."""
    store = DiskStore(str(tmp_path), namespace(), SLOTS, direct=direct)
    hashes = [bytes([7, i]) * 8 for i in range(20)]
    data = rows(20, seed=4)
    sums = checksums_of(block_views(data, LAYOUT))
    values = [encode_value(namespace(), h, s, r) for h, r, s in zip(hashes, data, sums, strict=True)]
    store._run_slots = 3  # several runs a put: several staging buffers at once
    assert store.put(hashes, values) is None
    got = read_blocks(store, hashes)
    assert torch.equal(torch.stack([b.row for b in got]), data)
    path, at = where(store.directory, hashes[-1])
    with open(path, "rb") as f:
        f.seek(at)
        assert not any(f.read(file_bytes(LAYOUT))[namespace().value_bytes :])


def test_close_waits_for_a_write_in_flight_and_later_calls_fail_counted(tmp_path, monkeypatch, caplog):
    """A write still running when the store closes (a writer thread that outlived its join): close waits for
    it before closing the files, so no write ever goes to a closed (or reused) descriptor; past the wait the
    files are left open. Calls after close fail, counted, and touch nothing."""
    store = DiskStore(str(tmp_path), namespace(), SLOTS, direct=False)
    gate, writing = threading.Event(), threading.Event()
    segment_write = store._segments.write

    def slow_write(slot, bufs):
        writing.set()
        assert gate.wait(10)
        segment_write(slot, bufs)

    monkeypatch.setattr(store._segments, "write", slow_write)
    data = rows(1)
    pieces = checksums_of(block_views(data, LAYOUT))[0]
    value = store.new_value()
    encode_value(namespace(), b"w" * 16, pieces, data[0], out=value)
    put = threading.Thread(target=lambda: store.put([b"w" * 16], [value]))
    put.start()
    assert writing.wait(10)
    closing = threading.Thread(target=store.close)
    closing.start()
    closing.join(0.3)
    assert closing.is_alive()  # waiting for the write
    gate.set()
    put.join(10)
    closing.join(10)
    assert not closing.is_alive() and store.stats()["writes"] == 1
    assert "closed" in store.put([b"x" * 16], [value]) and store.stats()["write_errors"] == 1
    _, (miss,) = store.get([b"w" * 16])
    assert miss.kind == DOWN
    again = DiskStore(str(tmp_path), namespace(), SLOTS, direct=False)  # the write made it to disk
    assert isinstance(read_blocks(again, [b"w" * 16])[0], RemoteBlock)

    stuck = DiskStore(str(tmp_path / "b"), namespace(), SLOTS, direct=False)
    monkeypatch.setattr(store_module, "CLOSE_WAIT_S", 0.1)
    assert stuck._enter()  # a call in flight that never ends
    with caplog.at_level("WARNING", logger="tiercache.disk.store"):
        stuck.close()
    assert "left open" in caplog.text
    os.fstat(stuck._index._fd)  # still open: nothing closed under the call
