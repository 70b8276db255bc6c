"""Reads below DRAM never hold up a step (ConnectorWorker): a plan with disk reads starts them on the disk
tier's reader thread and returns; its loads wait while later steps start and end; the request is reported
received (take_finished, vLLM's get_finished) in the step in which the read came in, with its block then
decoded into vLLM's cache, and the plan's StepResult follows. The disk store is real (files in a temporary
directory); the reader threads are held busy by tasks of the test until it lets them go, which is what a slow
disk or a silent store looks like from the worker."""

from __future__ import annotations

import threading
import time

import torch

from tiercache.config import TierCacheConfig
from tiercache.connectors.common import Geometry
from tiercache.connectors.worker import ConnectorWorker
from tiercache.connectors.worker.disk_steps import READERS
from tiercache.wire import DRAM, LoadItem, RemoteItem, StepPlan, StoreItem

LAYERS, HEADS, HEAD_DIM, BS, NB = 2, 2, 64, 16, 8
BLOCK = b"\x07" * 32
SOURCE, TARGET = 3, 6  # vLLM blocks: stored from, read back into


def disk_worker(tmp_path) -> tuple[ConnectorWorker, dict[str, torch.Tensor]]:
    names = tuple(f"model.layers.{i}.self_attn.attn" for i in range(LAYERS))
    geometry = Geometry(names, HEADS, HEAD_DIM, BS, torch.float32)
    config = TierCacheConfig.from_dict({
        "codec": "none",
        "tiers": {"vram": f"{4 * BS} tokens", "dram": f"{4 * BS} tokens",
                  "disk": {"path": str(tmp_path / "disk"), "size": "16MiB"}},
    })  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    caches = {n: torch.randn(NB, BS, HEADS, 2 * HEAD_DIM, generator=gen).transpose(1, 2) for n in names}
    worker = ConnectorWorker(config, geometry, model="tiny")
    worker.register(caches, dict.fromkeys(caches, "FLASH_ATTN"))
    return worker, caches


def run_step(worker: ConnectorWorker, plan: StepPlan) -> set[str]:
    """One engine step as vLLM drives the worker: start_load_kv, get_finished."""
    worker.start_step(plan)
    worker.end_step(plan)
    return worker.take_finished(plan)


def hold_readers(worker: ConnectorWorker, gate: threading.Event) -> None:
    """Every disk reader thread busy until the gate opens."""
    started = threading.Barrier(READERS + 1)
    for _ in range(READERS):
        worker.disk._reader.submit(lambda: (started.wait(10.0), gate.wait(30.0)))
    started.wait(10.0)


def step_results(worker: ConnectorWorker) -> dict[int, tuple[bool, ...]]:
    report = worker.take_report()
    return {} if report is None else {r.step: r.loads_ok for r in report.steps}


def test_a_plan_reading_from_disk_lets_later_steps_run_and_loads_when_the_read_is_in(tmp_path):
    worker, caches = disk_worker(tmp_path)
    try:
        worker.finish_step(StepPlan(0, stores=(StoreItem(BLOCK, DRAM, 1, SOURCE),)))
        run_step(worker, StepPlan(1, disk_writes=(RemoteItem(BLOCK, 1),)))
        assert worker.disk.writer.flush(10.0)
        before = {n: c[TARGET].clone() for n, c in caches.items()}
        step_results(worker)

        gate = threading.Event()
        hold_readers(worker, gate)
        read = StepPlan(2, loads=(LoadItem(BLOCK, DRAM, 2, TARGET),), disk_reads=(RemoteItem(BLOCK, 2),),
                        load_requests=("r",))  # fmt: skip
        started = time.perf_counter()
        assert run_step(worker, read) == set()
        assert run_step(worker, StepPlan(3)) == set()
        assert time.perf_counter() - started < 5.0  # neither step waited for the read
        assert all(torch.equal(caches[n][TARGET], before[n]) for n in caches)  # nothing loaded yet
        assert step_results(worker) == {3: ()}  # step 2's result waits for its load
        assert worker.take_load_errors() == set()

        gate.set()
        finished, step = set(), 4
        deadline = time.monotonic() + 30.0
        while not finished and time.monotonic() < deadline:
            finished = run_step(worker, StepPlan(step))
            step += 1
            time.sleep(0.01)
        assert finished == {"r"}
        assert worker.take_load_errors() == set()
        assert all(torch.equal(caches[n][TARGET], caches[n][SOURCE]) for n in caches)  # lossless codec
        assert step_results(worker)[2] == (True,)
        assert run_step(worker, StepPlan(step)) == set()  # reported once
    finally:
        worker.shutdown()


def test_a_read_of_a_missing_file_is_a_load_error_reported_with_its_request(tmp_path):
    worker, caches = disk_worker(tmp_path)
    try:
        before = {n: c[TARGET].clone() for n, c in caches.items()}
        read = StepPlan(0, loads=(LoadItem(BLOCK, DRAM, 2, TARGET),), disk_reads=(RemoteItem(BLOCK, 2),),
                        load_requests=("r",))  # fmt: skip
        finished, step, plan = run_step(worker, read), 1, read
        deadline = time.monotonic() + 30.0
        while not finished and time.monotonic() < deadline:
            plan = StepPlan(step)
            finished = run_step(worker, plan)
            step += 1
        assert finished == {"r"} and worker.take_load_errors() == {TARGET}
        assert all(torch.equal(caches[n][TARGET], before[n]) for n in caches)
        assert step_results(worker)[0] == (False,)
    finally:
        worker.shutdown()


def test_shutdown_with_a_read_in_flight_reports_its_loads_failed(tmp_path):
    worker, _ = disk_worker(tmp_path)
    gate = threading.Event()
    hold_readers(worker, gate)
    read = StepPlan(0, loads=(LoadItem(BLOCK, DRAM, 2, TARGET),), disk_reads=(RemoteItem(BLOCK, 2),),
                    load_requests=("r",))  # fmt: skip
    assert run_step(worker, read) == set()
    gate.set()
    worker.shutdown()
    assert worker.take_load_errors() == {TARGET}
