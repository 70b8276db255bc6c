"""The disk tier's files on real directories (issue 39): the write-behind queue writes each block once, reads
verify header and checksum, and every bad file is a miss of its own block; tiers.disk's config checks."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from tiercache.codecs import KVCodecSpec
from tiercache.config import TierCacheConfig
from tiercache.disk.direct import TMP_SUFFIX
from tiercache.disk.files import disk_blocks, file_bytes, scan
from tiercache.disk.store import DiskStore
from tiercache.errors import ConfigError
from tiercache.layout import BlockLayout
from tiercache.remote.format import BAD_VALUE, VANISHED, RemoteMiss, RemoteNamespace
from tiercache.wire import DRAM
from tiercache.worker.integrity import block_checksum, checksums_of
from tiercache.worker.pools import block_views
from tiercache.worker.remote_io import RemoteBlock, RemoteWriter, read_blocks

LAYOUT = BlockLayout.from_spec(KVCodecSpec.from_preset("k8v4"), 2, 2, 64, 32)
DIRECT = [None, False]  # probed (direct where the file system allows it), buffered


def namespace(codec: str = "codec-a", model: str = "org/model") -> RemoteNamespace:
    return RemoteNamespace(model, codec, LAYOUT, rank=0)


def rows(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, LAYOUT.dram_stride), dtype=torch.uint8, generator=g)


def write(store: DiskStore, hashes: list[bytes], data: torch.Tensor) -> RemoteWriter:
    writer = RemoteWriter(store, max_blocks=64, batch_blocks=4)
    sums = block_checksum(checksums_of(block_views(data, LAYOUT)), LAYOUT).tolist()
    for h, row, (s1, s2) in zip(hashes, data, sums, strict=True):
        assert writer.offer(h, row, (s1, s2))
    assert writer.flush(30)
    return writer


@pytest.mark.parametrize("direct", DIRECT)
def test_blocks_written_once_read_back_byte_exact(tmp_path, direct):
    store = DiskStore(str(tmp_path), namespace(), direct=direct)
    hashes = [bytes([i]) * 16 for i in range(6)]
    data = rows(6)
    writer = write(store, hashes, data)
    write_again = write(store, hashes[:2], data[:2])
    assert writer.stats()["written"] == 6 and write_again.stats()["already_stored"] == 2
    got = read_blocks(store, hashes)
    assert all(isinstance(b, RemoteBlock) for b in got)
    assert torch.equal(torch.stack([b.row for b in got]), data)
    assert {f.block_hash for f in scan(store.directory)} == set(hashes)
    assert all(f.size == file_bytes(LAYOUT) for f in scan(store.directory))
    writer.close()
    write_again.close()


@pytest.mark.parametrize("direct", DIRECT)
def test_each_bad_file_is_a_miss_of_its_own_block(tmp_path, direct):
    store = DiskStore(str(tmp_path), namespace(), direct=direct)
    hashes = [bytes([i]) * 16 for i in range(4)]
    write(store, hashes, rows(4)).close()
    path = store.path
    with open(path(hashes[0]), "r+b") as f:
        f.seek(300)  # a payload byte
        byte = f.read(1)[0]
        f.seek(300)
        f.write(bytes([byte ^ 1]))
    os.truncate(path(hashes[1]), 1000)
    os.unlink(path(hashes[2]))
    corrupted, truncated, missing, good = read_blocks(store, hashes)
    assert isinstance(corrupted, RemoteMiss) and "checksum mismatch" in corrupted.reason
    assert corrupted.reason.startswith("disk value refused")
    assert (
        isinstance(truncated, RemoteMiss) and truncated.kind == BAD_VALUE and "truncated" in truncated.reason
    )
    assert isinstance(missing, RemoteMiss) and missing.kind == VANISHED
    assert isinstance(good, RemoteBlock)
    store.refuse(hashes[0], corrupted)
    assert not os.path.exists(path(hashes[0]))


def test_a_file_renamed_to_another_block_is_refused(tmp_path):
    store = DiskStore(str(tmp_path), namespace(), direct=False)
    a, b = b"a" * 16, b"b" * 16
    write(store, [a], rows(1)).close()
    os.rename(store.path(a), store.path(b))
    (got,) = read_blocks(store, [b])
    assert isinstance(got, RemoteMiss) and "block hash mismatch" in got.reason


def test_other_codecs_and_models_use_other_directories(tmp_path):
    dirs = {DiskStore(str(tmp_path), ns, direct=False).directory for ns in
            (namespace(), namespace(codec="codec-b"), namespace(model="org/other"))}  # fmt: skip
    assert len(dirs) == 3 and all(d.startswith(str(tmp_path)) for d in dirs)


def test_withdrawn_blocks_leave_no_file(tmp_path):
    """A drop of a block whose write is queued or being written: no file stays behind."""
    store = DiskStore(str(tmp_path), namespace(), direct=False)
    writer = RemoteWriter(store, max_blocks=256, batch_blocks=8)
    hashes = [i.to_bytes(2, "little") * 8 for i in range(64)]
    data = rows(64)
    for h, row in zip(hashes, data, strict=True):
        writer.offer(h, row, (0, 0))
    writer.withdraw(hashes[::2], store.remove)
    assert writer.flush(30)
    left = {f.block_hash for f in scan(store.directory)}
    assert left == set(hashes[1::2])
    writer.close()


def test_a_crash_mid_write_leaves_nothing_served(tmp_path):
    store = DiskStore(str(tmp_path), namespace(), direct=False)
    torn = os.path.join(store.directory, (b"t" * 16).hex() + ".blk" + TMP_SUFFIX)
    with open(torn, "wb") as f:
        f.write(b"\0" * 100)
    DiskStore(str(tmp_path), namespace(), direct=False)  # a restart
    assert not os.path.exists(torn) and scan(store.directory) == []


def test_a_write_that_fails_is_counted_not_raised(tmp_path):
    """The directory gone under the store (a failed or unmounted disk): writes fail, reads miss."""
    store = DiskStore(str(tmp_path), namespace(), direct=False)
    shutil.rmtree(store.directory)
    writer = write(store, [b"x" * 16], rows(1))
    assert writer.stats()["write_failures"] == 1 and store.stats()["write_errors"] == 1
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
    assert disk_blocks(cfg, LAYOUT) == 2**30 // file_bytes(LAYOUT)
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
    with pytest.raises(ConfigError, match=f"at least .*{file_bytes(LAYOUT):,} bytes"):
        disk_blocks(config(tmp_path, size="4KiB"), LAYOUT)


def test_disk_steps_write_dram_slots_and_read_them_back_in_bounded_batches(tmp_path, monkeypatch):
    """The worker's disk steps on a real TierWorker (CPU): DRAM slots written to files, then read back into
    other slots a few files at a time (the read buffer reused), byte-exact and tagged; a corrupted file is a
    miss of its block only, and a dropped block's file is gone."""
    from tiercache.config_disk import DiskConfig
    from tiercache.connectors.worker import disk_steps
    from tiercache.units import Size
    from tiercache.wire import RemoteItem
    from tiercache.worker.tier_worker import TierWorker

    monkeypatch.setattr(disk_steps, "READ_BATCH_BYTES", 2 * file_bytes(LAYOUT))
    tiers = TierWorker.create(LAYOUT, 2, 16, "codec-a", device="cpu")
    steps = disk_steps.DiskSteps(DiskConfig(str(tmp_path), Size(bytes=2**30)), namespace(), tiers)
    hashes = [bytes([i]) * 16 for i in range(5)]
    data = rows(5)
    sums = checksums_of(block_views(data, LAYOUT))
    tiers.fill_dram([RemoteItem(h, i) for i, h in enumerate(hashes)], data, sums)
    assert steps.upload([RemoteItem(h, i) for i, h in enumerate(hashes)]) == 5
    assert steps.writer.flush(30)
    corrupt = steps.store.path(hashes[3])
    with open(corrupt, "r+b") as f:
        f.seek(5000)
        f.write(b"\xff\x00\xff")
    failed = steps.fetch([RemoteItem(h, 8 + i) for i, h in enumerate(hashes)])
    assert list(failed) == [hashes[3]] and "checksum mismatch" in failed[hashes[3]]
    for i, h in enumerate(hashes):
        if i != 3:
            assert torch.equal(tiers.dram.buffer[8 + i], data[i]) and tiers.tags.tag(DRAM, 8 + i)[0] == h
    steps.drop(hashes[:2])
    assert {f.block_hash for f in scan(steps.store.directory)} == {hashes[2], hashes[4]}
    assert dict((c.event, c.blocks) for c in steps.take_counts()) == {"written": 5, "bad_values": 1}
    steps.close()


@pytest.mark.parametrize("direct", DIRECT)
def test_the_writer_reuses_its_value_buffers_and_files_stay_exact(tmp_path, direct):
    """Values are encoded into the store's page-aligned buffers (written to their files as they are) and
    come back to it once written: rounds of writes reuse the same buffers, and every file reads back
    byte-exact, zero padding included; values a full queue dropped go back too."""
    store = DiskStore(str(tmp_path), namespace(), direct=direct)
    data = rows(12, seed=3)
    for round_ in range(3):  # a round's buffers are free again once flushed
        hashes = [bytes([round_, i]) * 8 for i in range(4)]
        writer = write(store, hashes, data[4 * round_ : 4 * round_ + 4])
        assert writer.stats()["written"] == 4
        writer.close()
        got = read_blocks(store, hashes)
        assert torch.equal(torch.stack([b.row for b in got]), data[4 * round_ : 4 * round_ + 4])
    assert len(store._files) <= 4 + 4 and len(store._free) == len(store._files)  # queue + a writing batch
    for path in (store.path(bytes([2, i]) * 8) for i in range(4)):
        with open(path, "rb") as f:
            content = f.read()
        assert len(content) == file_bytes(LAYOUT) and not any(content[namespace().value_bytes :])
    full = RemoteWriter(store, max_blocks=1, batch_blocks=1)
    sums = block_checksum(checksums_of(block_views(data[:1], LAYOUT)), LAYOUT).tolist()[0]
    offered = [full.offer(bytes([9, i]) * 8, data[0], (sums[0], sums[1])) for i in range(50)]
    assert full.flush(30) and full.stats()["dropped_full"] == offered.count(False)  # a queue of one: some
    full.close()
    assert len(store._free) == len(store._files)  # every buffer back, the dropped ones included
