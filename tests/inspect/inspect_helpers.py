"""Helpers of the inspection tests (imported by name: a `conftest` module of another test folder can shadow
this folder's): block hashes, a manager driven into evictions, raw socket requests, and the service's loop
on a thread of the test process."""

from __future__ import annotations

import socket
import threading
from contextlib import contextmanager
from pathlib import Path

from tiercache.config import EvictionConfig
from tiercache.inspect import InspectionState, listener
from tiercache.inspect.limits import CpuBudget, ServiceLimits
from tiercache.inspect.loop import ServiceLoop
from tiercache.inspect.protocol import HEADER, MAX_RESPONSE_BYTES, pack_frame, recv_frame
from tiercache.scheduler.manager import TierManager
from tiercache.scheduler.policies import make_policy


def h(i: int) -> bytes:
    return i.to_bytes(8, "big") + b"\x5a" * 24  # 32 bytes, like vLLM's sha256 block hashes


class Workload:
    """A manager with small tiers, its InspectionState, and a multi-turn workload that overflows both."""

    def __init__(self, policy: str = "lru", vram: int = 8, dram: int = 8) -> None:
        self.policy = make_policy(EvictionConfig(policy=policy, advisor_interval=0.05, max_stale=60.0))
        self.manager = TierManager(vram, dram, "codec-A", policy=self.policy, spill_watermark=0.25)
        self.state = InspectionState(max_decisions=200)
        self.events = []

    def step(self, ids, lookups=()) -> None:
        m = self.manager
        if lookups:
            m.lookup([h(i) for i in lookups])
            out = m.prepare_load([h(i) for i in lookups if h(i) in m.view()])
            if out is not None:
                m.complete_load(out.block_hashes)
        out = m.prepare_store([h(i) for i in ids])
        if out is not None:
            m.complete_store(out.block_hashes)
        for job in m.take_jobs():
            m.complete_transfer(job.job_id)
        events = m.take_events()
        self.events += events
        self.state.record(events)
        self.state.publish(m.view())

    def run(self, turns: int = 12) -> Workload:
        advisor = getattr(self.policy, "advisor", None)
        for turn in range(turns):
            if advisor is not None and turn >= 2:
                advisor.refresh()  # a fresh snapshot: graph decisions from here on
            prefix = [0, 1, 2, 3]  # a shared "system prompt"
            new = [100 + 3 * turn, 101 + 3 * turn, 102 + 3 * turn]
            self.step([*prefix, *new], lookups=[*prefix, 97 + 3 * turn])
        self.state.publish(self.manager.view(), force=True)
        return self

    def close(self) -> None:
        self.manager.close()
        self.state.close()


def raw(path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5)
    sock.connect(str(path))
    return sock


def ask(sock: socket.socket, request) -> dict:
    sock.sendall(pack_frame(request, 1 << 20))
    return recv_frame(sock, MAX_RESPONSE_BYTES)


def ask_raw(sock: socket.socket, body: bytes) -> dict:
    sock.sendall(HEADER.pack(len(body)) + body)
    return recv_frame(sock, MAX_RESPONSE_BYTES)


@contextmanager
def loop_in_thread(state: InspectionState, path: Path, limits: ServiceLimits | None = None):
    """The service's loop (the one its process runs, loop.py) on a thread of this process, serving a live
    state: for tests that change what the loop calls (monkeypatched handlers, peer credentials) or read its
    connections. Yields the ServiceLoop; its socket is `path`."""
    limits = limits or ServiceLimits()
    sock = listener.listen(Path(path))
    budget = CpuBudget(limits.cpu_share, limits.cpu_burst, limits.idle_cpu_share)
    loop = ServiceLoop(state, sock, limits, budget)
    stop = threading.Event()
    thread = threading.Thread(target=loop.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield loop
    finally:
        stop.set()
        loop.wake()
        thread.join(5)
        sock.close()
        Path(path).unlink(missing_ok=True)
