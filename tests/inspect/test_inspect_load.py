"""Issue 42, item 4: many clients in many processes, each keeping its connection, against a real service in
this process (as the other tests start one, default limits): every request is answered, no connection is
reset or refused, and the latency stays low. Before: ~2 % of sessions were reset mid-request (a request
waiting its turn counted as idle, and a newcomer evicted its connection), and under the service's fixed 3 %
CPU share the same load took ~45 s with p99 ≈ 1.8 s.
"""

from __future__ import annotations

import multiprocessing
import queue
import threading
import time

import pytest
from inspect_helpers import h

from tiercache.inspect import InspectError, InspectionService, connect, prompt_digest
from tiercache.inspect.limits import WINDOW
from tiercache.inspect.request_log import RequestRecord

# The load: 50 clients in 10 processes, 200 requests each. The same shape, CI-sized: 1,500 requests,
# about a second here (the whole test, forks included, 2-3 s).
PROCESSES, CLIENTS, REQUESTS = 10, 5, 30
# The target is p99 ≤ 100 ms; measured on this 2-core box: 20-35 ms for the full 10,000 requests, 20-90 ms
# for this shorter run (its first requests share the cores with the ten forks starting). 250 ms leaves room
# for a CI box running other jobs on its two cores, and still fails a service that waits for its CPU budget
# between requests (the fixed 3 % share gave p99 ≈ 1.8 s) or that makes clients reconnect.
P99_BOUND = 0.25
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
    out: list = []
    threads = [threading.Thread(target=_client, args=(path, ready, go, out)) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results.put(out)


def test_many_clients_in_many_processes(lru_run, short_dir):
    for i in range(KNOWN):
        lru_run.state.record_request(_record(i))
    lru_run.state.publish(lru_run.manager.view(), force=True)
    ctx = multiprocessing.get_context("fork")  # the children have tiercache imported already
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    with InspectionService(lru_run.state, short_dir / "load.sock") as service:
        args = (service.path, ready, go, results)
        procs = [ctx.Process(target=_process, args=args) for _ in range(PROCESSES)]
        try:
            for p in procs:
                p.start()
            connected = sum(ready.get(timeout=30) for _ in range(PROCESSES * CLIENTS))
            time.sleep(2 * WINDOW)  # this thread (the engine) idle, as in the run: the idle CPU share
            go.set()  # every client connected: the clock starts with all of them asking at once
            runs = [run for _ in procs for run in results.get(timeout=60)]
        except queue.Empty:
            pytest.fail("the clients did not finish within a minute")
        finally:
            go.set()
            for p in procs:
                p.join(10)
                if p.is_alive():
                    p.kill()
        deadline = time.monotonic() + 2
        while service._conns and time.monotonic() < deadline:  # the clients closed: their places free
            time.sleep(0.01)
        left = len(service._conns)
    errors = [e for _, errs, _ in runs for e in errs]
    latencies = sorted(t for lat, _, _ in runs for t in lat)
    assert connected == PROCESSES * CLIENTS and not errors, errors[:3]
    assert len(latencies) == PROCESSES * CLIENTS * REQUESTS
    assert sum(r for _, _, r in runs) == 0  # no connection reset: each client kept its first one
    p99 = latencies[int(0.99 * len(latencies))]
    assert p99 <= P99_BOUND, f"p99 {p99 * 1e3:.0f} ms, p50 {latencies[len(latencies) // 2] * 1e3:.0f} ms"
    assert left == 0
