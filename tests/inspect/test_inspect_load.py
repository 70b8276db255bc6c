"""Issue 42, item 4 and its target: the issue's load, 50 clients in 10 processes asking 200 requests each,
each client keeping its connection, against a real service (default limits) while a scheduler loop steps in
this process, the one the service serves: every request is answered, no connection is reset or refused,
and the latency stays low. Before: ~2 % of sessions were reset mid-request (a request waiting its turn
counted as idle, and a newcomer evicted its connection); with the service a thread of this process, the
same load took 36-44 s with p99 ≈ 0.6-0.7 s while the scheduler stepped (it held the GIL; the service kept a
3 % share of it), and p99 17 ms only while it did not.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import queue
import threading
import time

import pytest
from inspect_helpers import h

from tiercache.inspect import InspectError, InspectionService, connect, prompt_digest
from tiercache.inspect.request_log import RequestRecord

PROCESSES, CLIENTS, REQUESTS = 10, 5, 200  # the issue's load (10,000 requests: 3-5 s here)
# The target is p99 ≤ 100 ms while the engine serves (benchmarks/inspect_attack.py --load measures it).
# Measured by this test here (2 cores; this scheduler loop on one, the clients and the service on the other):
# 31-35 ms, 33-49 ms (once 99) while other jobs shared the machine. 150 ms leaves room for a CI box busy
# with other jobs, and still fails the thread service this replaced (600-1,100 ms).
P99_BOUND = 0.15
# The engine keeps a core (as inspect_attack.py runs it): the scheduler's thread on the first CPU, the
# clients and the service process on the others. Unpinned, on two cores, the engine's thread that answers
# explain's point reads waits its turn behind a dozen busy processes as well as for the GIL.
CPUS = sorted(os.sched_getaffinity(0))
ENGINE_CPUS, CLIENT_CPUS = ({CPUS[0]}, set(CPUS[1:])) if len(CPUS) > 1 else (None, None)
KNOWN = 8  # recent requests recorded, so that explain_request finds what it is asked


def _record(i: int) -> RequestRecord:
    hashes = (h(0), h(1), h(100 + i))
    return RequestRecord(
        request_id=f"cmpl-{i}-0-0123abcd", external_id=f"cmpl-{i}-0", digest=prompt_digest((7, i)), clock=0.0,
        wall=0.0, block_size=16, block_hashes=hashes, vllm_blocks=0, hit_blocks=0, where="--v", unreadable={},
        departed={}, prompt_tokens=49, tokens_loaded=0, tokens_recomputed=49,
    )  # fmt: skip


# what a user asks (the CLI's report, a notebook's `why`): one of each in turn
CALLS = [
    lambda c, i: c.explain_request(f"cmpl-{i % KNOWN}"),
    lambda c, i: c.stats(),
    lambda c, i: c.explain_request(prompt_tokens=[7, i % KNOWN]),
    lambda c, i: c.decisions(limit=20),
    lambda c, i: c.explain(h(i % 4).hex()),
    lambda c, i: c.blocks(limit=20),
    lambda c, i: c.ping(),
]


def _client(path, ready, go, out: list) -> None:
    """One client: connected and served once, then REQUESTS requests timed one by one. A reset shows as a
    new socket (the client reconnects once, quietly, when the server closes its connection)."""
    latencies, errors, resets = [], [], 0
    try:
        with connect(path, timeout=10) as client:
            client.ping()
            sock = client._transport._sock
            ready.put(1)
            go.wait(60)
            for i in range(REQUESTS):
                start = time.perf_counter()
                try:
                    CALLS[i % len(CALLS)](client, i)
                except InspectError as exc:
                    errors.append(str(exc))
                latencies.append(time.perf_counter() - start)
                resets += client._transport._sock is not sock
                sock = client._transport._sock
    except BaseException as exc:  # reported by the test
        errors.append(f"{type(exc).__name__}: {exc}")
        ready.put(0)
    out.append((latencies, errors, resets))


def _process(path, ready, go, results) -> None:
    if CLIENT_CPUS:
        os.sched_setaffinity(0, CLIENT_CPUS)
    out: list = []
    threads = [threading.Thread(target=_client, args=(path, ready, go, out)) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results.put(out)


def _step_until(run, done, seconds: float) -> int:
    """The scheduler's loop (record, publish: as the connector steps) until done() or `seconds`; steps."""
    deadline, turn = time.monotonic() + seconds, 0
    while not done() and time.monotonic() < deadline:
        for _ in range(10):
            turn += 1
            run.step([10_000 + 2 * turn, 10_001 + 2 * turn], lookups=[10_000 + 2 * (turn // 2)])
    return turn


def test_the_issues_load_while_the_scheduler_steps(lru_run, short_dir):
    for i in range(KNOWN):
        lru_run.state.record_request(_record(i))
    lru_run.state.publish(lru_run.manager.view(), force=True)
    ctx = multiprocessing.get_context("fork")  # the children have tiercache imported already
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    runs: list = []
    # The objects earlier tests left in this process would make every full collection here (the engine: the
    # service's point reads wait for it) and in the forked clients scan them; a vLLM engine freezes its
    # start-up heap the same way (gc.freeze), and forks after a freeze share it.
    gc.freeze()
    pinned = os.sched_getaffinity(0)
    if ENGINE_CPUS:
        os.sched_setaffinity(0, ENGINE_CPUS)  # this thread, the scheduler's (and the service's engine thread)
    with InspectionService(lru_run.state, short_dir / "load.sock") as service:
        if CLIENT_CPUS:
            os.sched_setaffinity(service.pid, CLIENT_CPUS)
        args = (service.path, ready, go, results)
        procs = [ctx.Process(target=_process, args=args) for _ in range(PROCESSES)]
        try:
            for p in procs:
                p.start()
            connected = sum(ready.get(timeout=30) for _ in range(PROCESSES * CLIENTS))
            go.set()  # every client connected: the clock starts with all of them asking at once

            def done() -> bool:
                while True:
                    try:
                        runs.extend(results.get_nowait())
                    except queue.Empty:
                        return len(runs) == PROCESSES * CLIENTS

            steps = _step_until(lru_run, done, 30)
            assert done(), f"the clients did not finish within 30 s ({len(runs)} of {PROCESSES * CLIENTS})"
        finally:
            go.set()
            for p in procs:
                p.join(10)
                if p.is_alive():
                    p.kill()
            gc.unfreeze()
            os.sched_setaffinity(0, pinned)
        with connect(service.path, timeout=5) as client:  # the clients closed: their places are free
            deadline = time.monotonic() + 2
            while (left := client.ping()["connections"]) > 1 and time.monotonic() < deadline:
                time.sleep(0.01)
    errors = [e for _, errs, _ in runs for e in errs]
    latencies = sorted(t for lat, _, _ in runs for t in lat)
    assert connected == PROCESSES * CLIENTS and not errors, errors[:3]
    assert len(latencies) == PROCESSES * CLIENTS * REQUESTS
    assert sum(r for _, _, r in runs) == 0  # no connection reset: each client kept its first one
    assert steps > 1000  # the scheduler stepped all along
    p99 = latencies[int(0.99 * len(latencies))]
    assert p99 <= P99_BOUND, f"p99 {p99 * 1e3:.0f} ms, p50 {latencies[len(latencies) // 2] * 1e3:.0f} ms"
    assert left == 1  # this one


@pytest.mark.parametrize("stepping", [False, True], ids=["idle", "stepping"])
def test_a_client_sees_what_was_published_before_it_asked(lru_run, short_dir, stepping):
    """The mirror is never behind a publish that returned before the request was sent (force=True)."""
    with InspectionService(lru_run.state, short_dir / "f.sock") as service, connect(service.path) as client:
        for turn in range(20):
            if stepping:
                lru_run.step([20_000 + turn])
            lru_run.state.record_tokens(loaded=1)
            lru_run.state.publish(lru_run.manager.view(), force=True)
            stats = client.stats()
            assert stats.tokens_loaded == lru_run.state.counters["tokens_loaded"]
            assert stats.stores == lru_run.state.counters["stores"]
