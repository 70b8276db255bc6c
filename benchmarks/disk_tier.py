"""The disk tier's write and read bandwidth against the disk's own, measured in the same run (issue 39).

    python benchmarks/disk_tier.py [--dir DIR] [--blocks 1024] [--repeat 3] [--buffered]

Blocks at Llama-3.1-8B shapes per rank (32 layers, 8 KV heads, head_dim 128, 16-token blocks, k8v4 bytes:
tiercache.layout.BlockLayout), one file each, through the worker's disk steps (connectors/worker/
disk_steps.DiskSteps) on a CPU TierWorker whose DRAM pool holds them all. Measured, in this order:
    disk write / read     one file of the same total size, written and read sequentially in 8 MiB
                          requests, with direct I/O where the file system allows it (else buffered; the read
                          then may come from the page cache, and says so)
    upload (step thread)  DiskSteps.upload of every DRAM slot alone: what the engine's step pays (rows read
                          out of their slots and encoded into values, queued for the writer)
    tier write            DiskSteps.upload of every DRAM slot, then until the write-behind queue is empty:
                          rows copied and encoded, files written by the writer thread (several in flight
                          on the host thread pool)
    tier write (files)    DiskStore.put of encoded values (the writer thread's call alone: no copies from
                          DRAM, no encoding), READ_BATCH_BYTES of files a call
    tier read (raw)       DiskStore.get, READ_BATCH_BYTES of files a call (files into the read buffer)
    tier read (into DRAM) DiskSteps.fetch of every block: read, header and checksum verified (the next batch
                          read meanwhile), copied into its DRAM slot, tagged
Each round runs every measure once on an emptied directory (the previous round's files removed, synced and
settled); the table, last, shows each measure's median over the rounds in GB/s, and each tier figure as a
share of the disk's own.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import tempfile
import time

import torch

from tiercache.codecs import KVCodecSpec
from tiercache.config_disk import DiskConfig
from tiercache.connectors.worker.disk_steps import READ_BATCH_BYTES, DiskSteps
from tiercache.disk.direct import aligned
from tiercache.disk.files import file_bytes
from tiercache.disk.store import DiskStore
from tiercache.layout import BlockLayout
from tiercache.remote.format import RemoteNamespace, encode_value
from tiercache.units import Size
from tiercache.wire import RemoteItem
from tiercache.worker.integrity import block_checksum, checksums_of
from tiercache.worker.pools import block_views
from tiercache.worker.tier_worker import TierWorker

CHUNK = 8 << 20


def sequential(directory: str, nbytes: int, direct: bool) -> tuple[float, float]:
    """(write seconds, read seconds) of one file of nbytes (rounded up to CHUNK), in CHUNK requests; the
    write ends with an fsync (with direct I/O: the file's metadata). The file stays (the round removes it)."""
    path = os.path.join(directory, "sequential.bin")
    buf = aligned(CHUNK)
    buf.write(os.urandom(CHUNK))
    chunks = -(-nbytes // CHUNK)
    flags = os.O_DIRECT if direct else 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | flags, 0o600)
    start = time.perf_counter()
    for i in range(chunks):
        os.pwrite(fd, buf, i * CHUNK)
    os.fsync(fd)
    write_s = time.perf_counter() - start
    os.close(fd)
    fd = os.open(path, os.O_RDONLY | flags)
    view = memoryview(buf)
    start = time.perf_counter()
    for i in range(chunks):
        os.preadv(fd, [view], i * CHUNK)
    read_s = time.perf_counter() - start
    os.close(fd)
    scale = nbytes / (chunks * CHUNK)  # seconds for nbytes
    return write_s * scale, read_s * scale


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
    hashes = [i.to_bytes(8, "little") * 2 for i in range(n)]
    items = [RemoteItem(h, i) for i, h in enumerate(hashes)]  # block i in DRAM slot i
    rows = torch.randint(
        0, 256, (n, layout.dram_stride), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)
    )
    tiers.fill_dram(items, rows, checksums_of(block_views(rows, layout)))
    config = DiskConfig(root, Size(bytes=2 * n * file_bytes(layout)), queue_blocks=n)
    steps = DiskSteps(config, namespace, tiers)
    store = steps.store
    if args.buffered:
        store.direct, store.direct_refusal = False, "--buffered"
    how = "direct" if store.direct else f"buffered ({store.direct_refusal})"
    total = n * store.file_bytes
    print(f"directory {store.directory}: {how} I/O")
    print(f"{n} blocks of {layout.block_bytes:,} bytes (files of {store.file_bytes:,}): "
          f"{total / 1e9:.3f} GB; {args.repeat} rounds, each measure's median")  # fmt: skip
    per = max(1, READ_BATCH_BYTES // store.file_bytes)
    sums = block_checksum(checksums_of(block_views(rows, layout)), layout).tolist()
    values = [encode_value(namespace, h, (a, b), r) for h, r, (a, b) in zip(hashes, rows, sums, strict=True)]
    seconds: dict[str, list[float]] = {name: [] for name in MEASURES}
    for _ in range(args.repeat):  # interleaved, so that a slower moment of a shared disk hits every measure
        disk_w, disk_r = sequential(store.directory, total, store.direct)
        seconds["disk write (1 file)"].append(disk_w)
        seconds["disk read (1 file)"].append(disk_r)
        start = time.perf_counter()
        assert steps.upload(items) == n
        seconds["upload (step thread)"].append(time.perf_counter() - start)
        assert steps.writer.flush(600)
        seconds["tier write"].append(time.perf_counter() - start)
        start = time.perf_counter()
        for k in range(0, n, per):
            assert not any(store.get(hashes[k : k + per])[1])
        seconds["tier read (raw)"].append(time.perf_counter() - start)
        start = time.perf_counter()
        assert steps.fetch(items) == {}
        seconds["tier read (into DRAM)"].append(time.perf_counter() - start)
        settle(store, hashes)
        start = time.perf_counter()
        for k in range(0, n, per):
            assert store.put(hashes[k : k + per], values[k : k + per]) is None
        seconds["tier write (files)"].append(time.perf_counter() - start)
        settle(store, hashes)
    assert steps.writer.stats().get("write_failures", 0) == 0 and torch.equal(tiers.dram.buffer[:n], rows)
    steps.close()
    gbps = {name: total / statistics.median(s) / 1e9 for name, s in seconds.items()}
    cached = "" if store.direct else "  (buffered: reads may come from the page cache)"
    print(f"\n{'measure':<22}{'GB/s':>8}{'of disk':>10}{cached}")
    for name, against in MEASURES.items():
        print(f"{name:<22}{gbps[name]:>8.2f}{100 * gbps[name] / gbps[against]:>9.0f}%")


def settle(store: DiskStore, hashes: list[bytes]) -> None:
    """Remove the round's files and let the file system finish with them (a file system mounted with
    `discard` trims freed blocks after the journal commits, which slows the I/O that follows)."""
    store.remove(hashes)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(store.directory, "sequential.bin"))
    os.sync()
    time.sleep(SETTLE_S)


SETTLE_S = 2.0
MEASURES = {  # measure → the disk's own figure it is compared with
    "disk write (1 file)": "disk write (1 file)",
    "disk read (1 file)": "disk read (1 file)",
    "upload (step thread)": "disk write (1 file)",
    "tier write": "disk write (1 file)",
    "tier write (files)": "disk write (1 file)",
    "tier read (raw)": "disk read (1 file)",
    "tier read (into DRAM)": "disk read (1 file)",
}


if __name__ == "__main__":
    main()
