"""The disk tier's write and read bandwidth against the disk's own, measured in the same run (issue 39).

    python benchmarks/disk_tier.py [--dir DIR] [--blocks 1024] [--repeat 3] [--buffered]

Blocks at Llama-3.1-8B shapes per rank (32 layers, 8 KV heads, head_dim 128, 16-token blocks, k8v4 bytes:
tiercache.layout.BlockLayout), through the worker's disk steps (connectors/worker/disk_steps.DiskSteps) on a
CPU TierWorker whose DRAM pool holds them all. Each round, in this order:
    disk write            a new file of the same total size written sequentially, then fsync: the disk's
                          rate into space not yet written (as an empty tier's)
    disk overwrite        that file written over again, then fsync: the disk's rate into space already
                          written (as a full tier's, whose freed slots are written over)
    disk read             that file read once, sequentially
                          Each of the three the fastest of SHAPES: 8 MiB requests one at a time, 16 MiB four
                          in flight (the tier's own: DiskStore.RUN_BYTES calls, several at once), 32 MiB four
                          in flight; a file each. This box's virtual disk read at 1.3-3.9 GB/s from minute to
                          minute, and at times at twice the rate with 16 MiB requests as with 8 MiB: one 8 MiB
                          request at a time (this benchmark's baseline until 2026-11-29) was not the disk's
                          own rate
    upload (step thread)  DiskSteps.upload of every DRAM slot into an empty tier: what the engine's step pays
                          (rows read out of their slots and encoded into values, queued for the writer)
    tier write            the same upload, then until the write-behind queue is empty: every block into an
                          empty tier's slots (compared with disk write)
    tier read (raw)       DiskStore.get, READ_BATCH_BYTES of blocks a call (slots into the read buffer)
    tier rewrite          every block dropped, then as many other blocks uploaded and written: into the
                          freed slots (compared with disk overwrite)
    tier read (into DRAM) DiskSteps.fetch of the rewritten blocks (read once, as the disk's file is): read,
                          header checked (the piece checksums' fold; the payload's piece checksums are
                          recorded for the loads' check, as in an engine, whose tiers keep slot checksums),
                          the next batch read meanwhile, copied into its DRAM slot, tagged
    tier write (put)      DiskStore.put into another empty tier of values encoded beforehand into the store's
                          own buffers (new_value, as the writer does: the writer thread's call alone, no
                          copies from DRAM, no encoding), READ_BATCH_BYTES of blocks a call
Each round starts with empty directories (the previous round's removed, synced and settled). Every write
measure ends with fsync of what it wrote, the disk's and the tier's alike. With --buffered the page cache is
dropped (fsync, then POSIX_FADV_DONTNEED) before each read, so reads come from the disk.
The table, last, shows each measure's GB/s (median and range over the rounds), and each tier measure as a
share of the disk's own figure named beside it, measured in the same round (median and range of the rounds'
shares: the disk's rate moves from minute to minute on a shared machine).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from tiercache.codecs import KVCodecSpec
from tiercache.config_disk import DiskConfig
from tiercache.connectors.worker.disk_steps import READ_BATCH_BYTES, DiskSteps
from tiercache.disk.buffers import ReadBuffer
from tiercache.disk.direct import aligned, open_data, read_at, write_at
from tiercache.disk.files import file_bytes
from tiercache.disk.index import HEAD_BYTES, RECORD_BYTES
from tiercache.disk.store import DiskStore
from tiercache.layout import BlockLayout
from tiercache.remote.format import RemoteNamespace, encode_value
from tiercache.units import Size
from tiercache.wire import RemoteItem
from tiercache.worker.integrity import checksums_of
from tiercache.worker.pools import block_views
from tiercache.worker.tier_worker import TierWorker

SHAPES = [(8 << 20, 1), (16 << 20, 4), (32 << 20, 4)]  # (request bytes, requests in flight)
SETTLE_S = 2.0
MEASURES = {  # measure → the disk's own figure it is compared with
    "disk write": "disk write",
    "disk overwrite": "disk overwrite",
    "disk read": "disk read",
    "upload (step thread)": "disk write",
    "tier write": "disk write",
    "tier rewrite": "disk overwrite",
    "tier write (put)": "disk write",
    "tier read (raw)": "disk read",
    "tier read (into DRAM)": "disk read",
}


def sequential(directory: str, nbytes: int, direct: bool, seconds: dict[str, list[float]]) -> None:
    """disk write, disk overwrite and disk read of nbytes, each the fastest of SHAPES; each shape a file of
    its own, written, written over, then read once (as the tier reads what it wrote once). Seconds appended to
    `seconds`; the files are removed at the end."""
    largest = max(size * depth for size, depth in SHAPES)
    buf = aligned(largest)
    buf.write(os.urandom(1 << 20) * (largest >> 20))
    paths = [os.path.join(directory, f"sequential{k}.bin") for k in range(len(SHAPES))]
    times: dict[str, list[float]] = {"disk write": [], "disk overwrite": [], "disk read": []}
    try:
        for path, shape in zip(paths, SHAPES, strict=True):
            fd = open_data(path, direct)
            try:
                times["disk write"].append(_pass(fd, buf, *shape, nbytes, write=True))
                times["disk overwrite"].append(_pass(fd, buf, *shape, nbytes, write=True))
                drop_cache([path])
                times["disk read"].append(_pass(fd, buf, *shape, nbytes, write=False))
            finally:
                os.close(fd)
    finally:
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    for name, found in times.items():
        seconds[name].append(min(found))


def _pass(fd: int, buf, size: int, depth: int, nbytes: int, write: bool) -> float:
    """Seconds for nbytes of the file, in requests of `size` bytes (the last one whole), `depth` in flight;
    a write ends with fsync."""
    chunks = -(-nbytes // size)
    view = memoryview(buf)

    def one(t: int) -> None:
        part = view[t * size : (t + 1) * size]
        for i in range(t, chunks, depth):
            if write:
                write_at(fd, [part], i * size)
            else:
                read_at(fd, part, i * size)

    start = time.perf_counter()
    with ThreadPoolExecutor(depth) as pool:
        list(pool.map(one, range(depth)))
    if write:
        os.fsync(fd)
    return (time.perf_counter() - start) * nbytes / (chunks * size)


def drop_cache(paths: list[str]) -> None:
    """Written back and dropped from the page cache (no effect on what direct I/O wrote: it is not cached)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", default=None, help="a directory on the disk to measure (default: the "
                        "current directory); a temporary directory is made there")  # fmt: skip
    parser.add_argument("--blocks", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3, help="rounds of every measure (medians shown)")
    parser.add_argument("--buffered", action="store_true", help="no direct I/O, even where it is allowed")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="tiercache-disk-bench-", dir=args.dir or ".")
    try:
        run(root, args)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(root: str, args) -> None:
    layout = BlockLayout.from_spec(KVCodecSpec.from_preset("k8v4"), 32, 8, 128, 16)
    namespace = RemoteNamespace("meta-llama/Llama-3.1-8B", "k8v4-bench", layout)
    n = args.blocks
    tiers = TierWorker.create(layout, 1, n, namespace.codec_id, device="cpu")
    sets = [[(s * n + i).to_bytes(8, "little") * 2 for i in range(n)] for s in range(2)]  # two sets of blocks
    rows = torch.randint(
        0, 256, (n, layout.dram_stride), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)
    )
    sums = checksums_of(block_views(rows, layout))
    size = Size(bytes=HEAD_BYTES + n * (file_bytes(layout) + RECORD_BYTES))  # n slots: a rewrite reuses them
    direct = False if args.buffered else None
    total = n * file_bytes(layout)
    per = max(1, READ_BATCH_BYTES // file_bytes(layout))
    seconds: dict[str, list[float]] = {name: [] for name in MEASURES}
    how = ""
    for r in range(args.repeat):  # interleaved, so that a slower moment of a shared disk hits every measure
        config = DiskConfig(os.path.join(root, f"round{r}"), size, queue_blocks=n)
        os.makedirs(config.path)
        items = [RemoteItem(h, i) for i, h in enumerate(sets[0])]  # block i in DRAM slot i
        tiers.fill_dram(items, rows, sums)
        steps = DiskSteps(config, namespace, tiers, direct)
        store = steps.store
        how = "direct" if store.direct else f"buffered ({store.direct_refusal})"
        sequential(store.directory, total, store.direct, seconds)
        start = time.perf_counter()
        assert steps.upload(items) == n
        seconds["upload (step thread)"].append(time.perf_counter() - start)
        assert steps.writer.flush(600)
        sync_segments(store)
        seconds["tier write"].append(time.perf_counter() - start)
        drop_segments(store)
        buffer = ReadBuffer()
        buffer.take(per * file_bytes(layout))  # allocated before, as DiskSteps' are at start
        start = time.perf_counter()
        for k in range(0, n, per):
            assert not any(store.get(sets[0][k : k + per], buffer)[1])
        seconds["tier read (raw)"].append(time.perf_counter() - start)
        steps.drop(sets[0])
        others = [RemoteItem(h, i) for i, h in enumerate(sets[1])]
        tiers.fill_dram(others, rows, sums)
        settle()
        start = time.perf_counter()
        assert steps.upload(others) == n and steps.writer.flush(600)
        sync_segments(store)
        seconds["tier rewrite"].append(time.perf_counter() - start)
        assert store.stats()["held"] == n and steps.writer.stats().get("write_failures", 0) == 0
        tiers.dram.buffer[:n] = 0  # read back over zeros: the check below sees what the fetch wrote
        drop_segments(store)
        start = time.perf_counter()
        assert steps.fetch(others) == {}
        seconds["tier read (into DRAM)"].append(time.perf_counter() - start)
        assert torch.equal(tiers.dram.buffer[:n], rows)
        steps.close()
        settle()
        store = DiskStore(os.path.join(root, f"put{r}"), namespace, n, direct)
        values = [store.new_value() for _ in range(n)]  # as the writer encodes them: put copies nothing
        for h, row, pieces, value in zip(sets[0], rows, sums, values, strict=True):
            encode_value(namespace, h, pieces, row, out=value)
        start = time.perf_counter()
        for k in range(0, n, per):
            assert store.put(sets[0][k : k + per], values[k : k + per]) is None
        sync_segments(store)
        seconds["tier write (put)"].append(time.perf_counter() - start)
        store.close()
        shutil.rmtree(config.path)
        shutil.rmtree(os.path.join(root, f"put{r}"))
        settle()
    print(f"{n} blocks of {layout.block_bytes:,} bytes (slots of {file_bytes(layout):,}): "
          f"{total / 1e9:.3f} GB; {how} I/O; {args.repeat} rounds")  # fmt: skip
    report(seconds, total)


def report(seconds: dict[str, list[float]], total: int) -> None:
    """Per measure: GB/s (median over the rounds, and range); a tier measure's share of the disk's own figure
    in the same round (median and range over the rounds)."""
    print(f"\n{'measure':<22}{'GB/s':>7}{'range':>12}{'of disk':>9}{'range':>11}  against (same round)")
    for name, against in MEASURES.items():
        gbps = [total / s / 1e9 for s in seconds[name]]
        line = f"{name:<22}{statistics.median(gbps):>7.2f}{f'{min(gbps):.2f}-{max(gbps):.2f}':>12}"
        if name != against:
            shares = [100 * d / s for d, s in zip(seconds[against], seconds[name], strict=True)]
            spread = f"{min(shares):.0f}-{max(shares):.0f}%"
            line += f"{statistics.median(shares):>8.0f}%{spread:>11}  {against}"
        print(line)


def sync_segments(store: DiskStore) -> None:
    """What the tier wrote on the disk, as the disk's own write figures end with fsync (with direct I/O: its
    metadata; buffered: the data too)."""
    for entry in os.scandir(store.directory):
        if entry.name.endswith(".dat"):
            fd = os.open(entry.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def drop_segments(store: DiskStore) -> None:
    drop_cache([e.path for e in os.scandir(store.directory) if e.name.endswith(".dat")])


def settle() -> None:
    """Let the file system finish with what the round wrote and removed (a file system mounted with `discard`
    trims freed blocks after the journal commits, which slows the I/O that follows)."""
    os.sync()
    time.sleep(SETTLE_S)


if __name__ == "__main__":
    main()
