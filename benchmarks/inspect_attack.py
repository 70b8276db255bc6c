"""Scheduler steps/s with and without hostile clients on the inspection socket (issue 26, item 2).

    python benchmarks/inspect_attack.py                       # every attack, 3 s alone + 3 s attacked each
    python benchmarks/inspect_attack.py --seconds 2 --clients 2 --attacks filters,drip
    python benchmarks/inspect_attack.py --no-pin              # hostile processes may share the engine's core
    python benchmarks/inspect_attack.py --load                # issue 42's legitimate load while it steps
    python benchmarks/inspect_attack.py --load --limits '{"nice": 10}'   # ServiceLimits fields, as JSON

The engine: a real TierManager (graph policy, its advisor thread running) and InspectionState, served by an
InspectionService, driven by a scheduler loop in the main thread as the connector does once per step
(lookup + prepare_load/complete_load, prepare_store/complete_store, take_jobs/complete_transfer,
take_events, record, record_request, publish). Tiers of 64 + 256 blocks overflow at once, so the decision
ring is full. Once built, the engine freezes its start-up heap as vLLM's EngineCore does (gc.freeze), so
that a full collection scans what serving made only.

Hostile clients are other processes (they never take this process's GIL themselves), `--clients` of each:
    filters   decisions() with a 200,000-kind filter (1 MB, the issue's request), reconnecting when closed
    frames    max-size frames the server accepts (MAX_REQUEST_BYTES of msgpack), back to back
    deep      requests nested 1,000 deep
    idle      as many idle connections as the service takes, reopened when closed
    drip      16 connections each sending a request one byte every 10 ms
    flood     legal, heavy requests (decisions/blocks at their largest limit, stats), 16 pipelined
    churn     connect and close, as fast as the service accepts
    all       one client of each kind at once
A probe process (tiercache's InspectClient, timeout 5 s) asks stats() every 100 ms during each phase and
reports its latency: active clients must keep being served. By default the engine runs on CPU 0 and every
client on the other CPUs (a hostile client's own CPU use is the machine's problem, not the service's), and
so does the service's own process (it is not the scheduler's: it runs wherever the machine has room; its
engine thread, which answers explain's point reads, stays with the scheduler on CPU 0); --no-pin lets them
all mix. Phases alternate (alone, attacked) `--repeat` times; the table gives medians and,
in parentheses, the range of attacked/alone. The last lines printed are the table.

--load: issue 42's legitimate load instead of attacks: `--processes` (10) client processes of `--threads` (5)
InspectClients each, every client keeping its connection and asking `--requests` (200) requests one after
the other (explain_request by id and by prompt, stats, decisions(20), explain, blocks(20), ping), all
starting at once while the scheduler loop steps (or, with --idle, while it does not); `--repeat` runs. Per
run: the seconds until the last answer, latency p50 / p99 / max, resets (a client whose connection was
closed under it and reconnected), errors, the scheduler's steps/s during the load against alone, and the
CPU time the service used (its process, and its thread in the engine); then p99 by kind of request.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgpack

HEADER = struct.Struct(">I")
KINDS = ("filters", "frames", "deep", "idle", "drip", "flood", "churn")


# ------------------------------------------------------------------ hostile clients (no tiercache import)
def _frame(obj) -> bytes:
    body = msgpack.packb(obj, use_bin_type=True)
    return HEADER.pack(len(body)) + body


def _connect(path: str, timeout: float = 5.0) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(path)
    return s


def _reply(s: socket.socket) -> bool:
    """Read one reply frame; False when the server closed the connection."""
    head = b""
    while len(head) < 4:
        chunk = s.recv(4 - len(head))
        if not chunk:
            return False
        head += chunk
    left = HEADER.unpack(head)[0]
    while left:
        chunk = s.recv(min(left, 1 << 16))
        if not chunk:
            return False
        left -= len(chunk)
    return True


def _ask_forever(path: str, frames: list[bytes]) -> None:
    """Send each frame and read its reply, forever, reconnecting whenever the server closes."""
    s = None
    while True:
        try:
            s = s or _connect(path)
            for f in frames:
                s.sendall(f)
            for _ in frames:
                if not _reply(s):
                    raise ConnectionResetError
        except OSError:
            if s is not None:
                s.close()
            s = None
            time.sleep(0.001)


def hostile(kind: str, path: str, max_request: int) -> None:
    if kind == "filters":
        _ask_forever(path, [_frame({"method": "decisions", "params": {"kinds": ["warm"] * 200_000}})])
    elif kind == "frames":
        body = msgpack.packb({"method": "stats", "params": {"pad": b"x" * (max_request - 40)}})
        _ask_forever(path, [HEADER.pack(len(body)) + body])
    elif kind == "deep":
        nested: object = 1
        for _ in range(1000):
            nested = [nested]
        _ask_forever(path, [_frame({"method": "decisions", "params": {"kinds": nested}})])
    elif kind == "flood":
        heavy = [
            {"method": "decisions", "params": {"limit": 1000}},
            {"method": "blocks", "params": {"limit": 1000}},
            {"method": "stats"},
            {"method": "explain", "params": {"block_hash": "00"}},
        ]
        _ask_forever(path, [_frame(heavy[i % 4]) for i in range(16)])
    elif kind == "churn":
        while True:
            try:
                _connect(path).close()
            except OSError:
                time.sleep(0.001)
    elif kind in ("idle", "drip"):
        _hold(kind, path)


def _hold(kind: str, path: str) -> None:
    request = _frame({"method": "stats"})
    conns: dict[socket.socket, int] = {}  # socket → bytes of the request sent so far
    want = 64 if kind == "idle" else 16
    while True:
        while len(conns) < want:
            try:
                conns[_connect(path, 0.5)] = 0
            except OSError:
                break
        for s in list(conns):
            try:
                if kind == "drip":
                    s.send(request[conns[s] : conns[s] + 1])
                    conns[s] = (conns[s] + 1) % len(request)
                else:
                    s.setblocking(False)
                    if s.recv(1 << 16) == b"":
                        raise ConnectionResetError
            except BlockingIOError:
                pass
            except OSError:
                s.close()
                del conns[s]
        time.sleep(0.01)


def probe(path: str, seconds: float) -> None:
    """A legitimate client (tiercache's own, timeout 5 s): stats() every 100 ms; prints its latencies."""
    from tiercache.inspect import InspectError, connect

    client = connect(path, timeout=5.0)
    print("ready", flush=True)
    lat, failed = [], 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        start = time.monotonic()
        try:
            client.stats()
            lat.append(1000 * (time.monotonic() - start))
        except InspectError:
            failed += 1
        time.sleep(max(0.0, 0.1 - (time.monotonic() - start)))
    lat.sort()
    p50 = lat[len(lat) // 2] if lat else None
    print(
        json.dumps({"n": len(lat), "failed": failed, "p50": p50, "max": max(lat, default=None)}), flush=True
    )


# ------------------------------------------------------------------ the legitimate load (issue 42)
CALLS = {  # what a user asks (the CLI's report, a notebook's `why`): one of each in turn
    "explain_request(id)": lambda c, i: c.explain_request(f"load-{i % KNOWN}"),
    "stats": lambda c, i: c.stats(),
    "explain_request(prompt)": lambda c, i: c.explain_request(prompt_tokens=[7, i % KNOWN]),
    "decisions(20)": lambda c, i: c.decisions(limit=20),
    "explain": lambda c, i: c.explain(_h(i % 4).hex()),
    "blocks(20)": lambda c, i: c.blocks(limit=20),
    "ping": lambda c, i: c.ping(),
}
_CALLS = list(CALLS.values())


def load_client(path: str, threads: int, requests: int) -> None:
    """One client process: `threads` InspectClients, each connected and served once; "ready", then on "go"
    (stdin) each asks `requests` requests one by one. Prints its latencies (s), errors and resets (a client
    whose connection was closed under it: it reconnects once, quietly, on a new socket) as JSON."""
    import threading

    from tiercache.inspect import InspectError, connect

    clients = [connect(path, timeout=10) for _ in range(threads)]
    for c in clients:
        c.ping()
    print("ready", flush=True)
    sys.stdin.readline()
    latencies: list[float] = []
    errors: list[str] = []
    resets = [0]

    def run(client) -> None:
        sock = client._transport._sock
        for i in range(requests):
            start = time.perf_counter()
            try:
                _CALLS[i % len(_CALLS)](client, i)
            except InspectError as exc:
                errors.append(str(exc)[:200])
            latencies.append((i % len(_CALLS), time.perf_counter() - start))
            resets[0] += client._transport._sock is not sock
            sock = client._transport._sock

    workers = [threading.Thread(target=run, args=(c,)) for c in clients]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    for c in clients:
        c.close()
    print(json.dumps({"latencies": latencies, "errors": errors, "resets": resets[0]}), flush=True)


def load_run(engine: Engine, args, cpus: set[int] | None) -> dict:
    """One run of the load against the engine's service while the engine steps (or idles: --idle)."""
    path = str(engine.service.path)
    spec = [str(args.threads), str(args.requests)]
    procs = [
        _spawn(["--load-client", path, *spec], cpus, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(args.processes)
    ]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready", "a load client failed to connect"
        alone = engine.run_for(1.0) if not args.idle else None
        service = _ServiceCpu(engine)
        start = time.perf_counter()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        steps, stepped = 0, 0.0
        while any(p.poll() is None for p in procs):
            if args.idle:
                time.sleep(0.01)
                continue
            t = time.perf_counter()
            for _ in range(50):
                engine.step()
            steps, stepped = steps + 50, stepped + time.perf_counter() - t
        elapsed = time.perf_counter() - start  # to the last answer, within one loop of steps
        service_cpu = service.seconds()
        outs = [json.loads(p.stdout.read().strip().splitlines()[-1]) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    lat = sorted(t for o in outs for _, t in o["latencies"])
    q = lambda xs, f: 1000 * xs[min(len(xs) - 1, int(f * len(xs)))]
    by_call = {
        name: q(sorted(t for o in outs for k, t in o["latencies"] if k == i), 0.99)
        for i, name in enumerate(CALLS)
    }
    return {
        "seconds": elapsed,
        "answered": len(lat),
        "p50": q(lat, 0.5),
        "p99": q(lat, 0.99),
        "max": 1000 * lat[-1],
        "resets": sum(o["resets"] for o in outs),
        "errors": [e for o in outs for e in o["errors"]],
        "steps": steps / stepped if stepped else None,
        "alone": alone,
        "p99_by_call": by_call,
        "service_cpu": service_cpu,
    }


def load_main(engine: Engine, args, client_cpus: set[int] | None) -> None:
    runs = [load_run(engine, args, client_cpus) for _ in range(args.repeat)]
    total = args.processes * args.threads * args.requests
    busy = "idle engine" if args.idle else f"scheduler stepping ({args.policy} policy)"
    shape = f"{args.processes} processes × {args.threads} clients × {args.requests} requests ({total:,})"
    print(f"\n{shape}; {busy}")
    print(
        "| run | answered in | p50 ms | p99 ms | max ms | resets | errors | steps/s during / alone | "
        "service CPU s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for i, r in enumerate(runs, 1):
        steps = f"{r['steps']:,.0f} / {r['alone']:,.0f}" if r["steps"] else "—"
        answered = f"{r['answered']:,} in {r['seconds']:.1f} s"
        print(
            f"| {i} | {answered} | {r['p50']:.0f} | {r['p99']:.0f} | {r['max']:.0f} | {r['resets']} | "
            f"{len(r['errors'])} | {steps} | {r['service_cpu']:.2f} |"
        )
    for i, r in enumerate(runs, 1):
        slowest = sorted(r["p99_by_call"].items(), key=lambda kv: -kv[1])
        print(f"run {i}, p99 ms by call: " + ", ".join(f"{name} {ms:.0f}" for name, ms in slowest))
        for e in r["errors"][:3]:
            print(f"    error: {e}")


# ------------------------------------------------------------------ the engine
class Engine:
    def __init__(self, path: Path, policy: str, limits: dict | None = None) -> None:
        from tiercache.config import EvictionConfig
        from tiercache.inspect import InspectionService, InspectionState, ServiceLimits
        from tiercache.inspect.protocol import MAX_REQUEST_BYTES
        from tiercache.scheduler.manager import TierManager
        from tiercache.scheduler.policies import make_policy

        self.policy = make_policy(EvictionConfig(policy=policy, advisor_interval=0.5, max_stale=2.0))
        self.manager = TierManager(64, 256, "codec-A", policy=self.policy)
        self.state = InspectionState(max_decisions=1000)
        self.service = InspectionService(self.state, path, limits=ServiceLimits(**(limits or {})))
        self.max_request = MAX_REQUEST_BYTES
        self.n = 0
        # as vLLM's EngineCore does once started (vllm/v1/engine/core.py, freeze_gc_heap): the start-up heap
        # (torch, …) is left out of every later collection, so that a full one scans what serving made
        gc.collect()
        gc.freeze()
        self.run_for(0.5)  # fill the tiers and the decision ring

    def step(self) -> None:
        m, n = self.manager, self.n
        self.n += 1
        prefix = [_h(i) for i in range(4)] + [_h(1000 + n // 3 * 2 + k) for k in range(2)]
        hits = m.lookup(prefix)
        if hits:
            out = m.prepare_load(prefix[:hits])
            if out is not None:
                m.complete_load(out.block_hashes)
        out = m.prepare_store([h for h in prefix[hits:]] + [_h(10**6 + 2 * n), _h(10**6 + 2 * n + 1)])
        if out is not None:
            m.complete_store(out.block_hashes)
        for job in m.take_jobs():
            m.complete_transfer(job.job_id)
        self.state.record(m.take_events())
        self.state.record_request(_record(n, prefix, hits))
        self.state.publish(m.view())

    def run_for(self, seconds: float) -> float:
        """Steps per second over `seconds` of wall time."""
        start, done = time.perf_counter(), 0
        while time.perf_counter() - start < seconds:
            for _ in range(50):
                self.step()
            done += 50
        return done / (time.perf_counter() - start)

    def close(self) -> None:
        self.service.close()
        self.manager.close()
        self.state.close()
        gc.unfreeze()


def _h(i: int) -> bytes:
    return i.to_bytes(8, "big") + b"\x5a" * 24


KNOWN = 8  # request ids the load asks about: load-0 … load-7, each the newest step of that name


def _record(n: int, blocks: list[bytes], hits: int):
    """The admission of step n's request, as the connector records it (explain_request reads these)."""
    from tiercache.inspect import prompt_digest
    from tiercache.inspect.request_log import RequestRecord

    where = "v" * hits + "-" * (len(blocks) - hits)
    return RequestRecord(
        request_id=f"req-{n}", external_id=f"load-{n % KNOWN}", digest=prompt_digest((7, n % KNOWN)),
        clock=time.monotonic(), wall=time.time(), block_size=16, block_hashes=tuple(blocks), vllm_blocks=0,
        hit_blocks=hits, where=where, unreadable={}, departed={}, prompt_tokens=16 * len(blocks) + 1,
        tokens_loaded=16 * hits, tokens_recomputed=16 * (len(blocks) - hits) + 1,
    )  # fmt: skip


def _spawn(args: list[str], cpus: set[int] | None, **kwargs) -> subprocess.Popen:
    def pin() -> None:
        if cpus:
            os.sched_setaffinity(0, cpus)

    cmd = [sys.executable, __file__, *args]
    return subprocess.Popen(cmd, preexec_fn=pin, start_new_session=True, **kwargs)


def phase(engine: Engine, kind: str | None, clients: int, seconds: float, cpus: set[int] | None) -> dict:
    path = str(engine.service.path)
    kinds = [] if kind is None else list(KINDS) if kind == "all" else [kind] * clients
    probe_proc = _spawn(["--probe", path, str(seconds + 0.5)], cpus, stdout=subprocess.PIPE, text=True)
    assert probe_proc.stdout.readline().strip() == "ready"  # imported and connected
    procs = [_spawn(["--hostile", k, path, str(engine.max_request)], cpus) for k in kinds]
    try:
        time.sleep(0.5)  # the clients connect and start
        cpu0 = _children_cpu(procs)
        steps = engine.run_for(seconds)
        cpu = _children_cpu(procs) - cpu0
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    out, _ = probe_proc.communicate(timeout=30)
    return {"steps": steps, "probe": json.loads(out.strip().splitlines()[-1]), "client_cpu": cpu / seconds}


class _ServiceCpu:
    """The CPU time the service has used since: its own process's (its thread's, in the engine, when it has
    none), plus the engine's point-read thread."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._start = self._now()

    def _now(self) -> float:
        service = self._engine.service
        pid = getattr(service, "pid", None)
        total = _children_cpu([pid]) if pid else 0.0
        thread = getattr(service, "_thread", None)
        if thread is not None and thread.native_id is not None:
            total += _thread_cpu(thread.native_id)
        return total

    def seconds(self) -> float:
        return self._now() - self._start


def _thread_cpu(tid: int) -> float:
    try:
        fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _children_cpu(procs: list) -> float:
    total = 0.0
    for p in procs:
        try:
            pid = p if isinstance(p, int) else p.pid
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            pass
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per phase (alone and attacked)")
    parser.add_argument("--repeat", type=int, default=2, help="alone/attacked pairs per attack (medians)")
    parser.add_argument("--clients", type=int, default=4, help="hostile processes per attack (4)")
    parser.add_argument("--attacks", default=",".join((*KINDS, "all")), help="comma-separated")
    parser.add_argument("--policy", default="graph", choices=("graph", "lru"))
    parser.add_argument("--no-pin", action="store_true", help="do not pin the engine to CPU 0")
    parser.add_argument("--load", action="store_true", help="issue 42's legitimate load instead of attacks")
    parser.add_argument("--processes", type=int, default=10, help="--load: client processes (10)")
    parser.add_argument("--threads", type=int, default=5, help="--load: clients per process (5)")
    parser.add_argument("--requests", type=int, default=200, help="--load: requests per client (200)")
    parser.add_argument("--idle", action="store_true", help="--load: the engine does not step meanwhile")
    parser.add_argument("--limits", type=json.loads, default={}, help="ServiceLimits fields as JSON (a map)")
    args = parser.parse_args()
    cpus = set(os.sched_getaffinity(0))
    engine_cpus = {min(cpus)} if not args.no_pin and len(cpus) > 1 else None
    client_cpus = cpus - engine_cpus if engine_cpus else None
    if engine_cpus:
        os.sched_setaffinity(0, engine_cpus)
    directory = Path(tempfile.mkdtemp(prefix="tcb", dir="/tmp"))
    engine = Engine(directory / "s.sock", args.policy, args.limits)
    if client_cpus and getattr(engine.service, "pid", None) is not None:
        os.sched_setaffinity(engine.service.pid, client_cpus)  # its own process: off the scheduler's core
    if args.load:
        try:
            load_main(engine, args, client_cpus)
        finally:
            engine.close()
        return
    kinds = args.attacks.split(",")
    runs: dict[str, list[tuple[dict, dict]]] = {k: [] for k in kinds}
    try:
        for _ in range(args.repeat):  # interleaved: a slow drift of the machine hits every attack alike
            for kind in kinds:
                alone = phase(engine, None, 0, args.seconds, client_cpus)
                attacked = phase(engine, kind, args.clients, args.seconds, client_cpus)
                runs[kind].append((alone, attacked))
                print(f"{kind}: {attacked['steps']:.0f} vs {alone['steps']:.0f} steps/s", file=sys.stderr)
    finally:
        engine.close()
    pinning = f"engine on CPU {min(engine_cpus)}, clients on the others" if engine_cpus else "not pinned"
    each = f"{args.repeat} × ({args.seconds:g} s alone, {args.seconds:g} s attacked)"
    print(f"\n{args.clients} hostile processes per attack ({pinning}); {each}, medians; {args.policy} policy")
    print(
        "| attack | steps/s alone | steps/s attacked | attacked / alone | probe p50 / max ms | probe failed |"
    )
    print("|---|---|---|---|---|---|")
    for kind, pairs in runs.items():
        alone, attacked = (statistics.median(p[i]["steps"] for p in pairs) for i in (0, 1))
        ratios = sorted(100 * b["steps"] / a["steps"] for a, b in pairs)
        probes = [b["probe"] for _, b in pairs]
        p50 = [p["p50"] for p in probes if p["p50"] is not None]
        lat = (
            f"{statistics.median(p50):.0f} / {max(p['max'] for p in probes if p['max']):.0f}" if p50 else "—"
        )
        failed = f"{sum(p['failed'] for p in probes)} of {sum(p['n'] + p['failed'] for p in probes)}"
        spread = f" ({ratios[0]:.0f}–{ratios[-1]:.0f})" if len(ratios) > 1 else ""
        ratio = f"{statistics.median(ratios):.1f} %{spread}"
        print(f"| {kind} | {alone:,.0f} | {attacked:,.0f} | {ratio} | {lat} | {failed} |")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--hostile":
        hostile(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif len(sys.argv) > 1 and sys.argv[1] == "--probe":
        probe(sys.argv[2], float(sys.argv[3]))
    elif len(sys.argv) > 1 and sys.argv[1] == "--load-client":
        load_client(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        main()
