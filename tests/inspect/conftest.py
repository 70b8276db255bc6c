"""Fixtures of the inspection tests: a real TierManager driven into evictions, a service on a short path."""

from __future__ import annotations

import shutil
import socket
import tempfile
from pathlib import Path

import pytest

from tiercache.config import EvictionConfig
from tiercache.inspect import InspectionService, InspectionState
from tiercache.inspect.limits import ServiceLimits
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


@pytest.fixture
def short_dir():
    path = Path(tempfile.mkdtemp(prefix="tci", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def lru_run():
    w = Workload("lru").run()
    yield w
    w.close()


@pytest.fixture
def graph_run():
    w = Workload("graph").run()
    yield w
    w.close()


@pytest.fixture
def served(lru_run, short_dir):
    limits = ServiceLimits(request_timeout=0.5)
    service = InspectionService(lru_run.state, short_dir / "s.sock", limits=limits)
    yield lru_run, service
    service.close()


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
