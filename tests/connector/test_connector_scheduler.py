"""ConnectorScheduler (and the connector glue around it) without an engine: vLLM's Request and SchedulerOutput
stood in by plain objects."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import torch

from tiercache.config import TierCacheConfig
from tiercache.connectors.common import Geometry
from tiercache.connectors.metadata import TierCacheWorkerMeta
from tiercache.connectors.scheduler import ConnectorScheduler
from tiercache.scheduler.moves import Mover
from tiercache.wire import IoSample, JobResult, LoadFailure, StepResult, WorkerReport

BS = 32


def make(world_size: int = 1, vram_blocks: int = 64) -> ConnectorScheduler:
    tiers = {"vram": f"{vram_blocks * BS} tokens", "dram": f"{4 * vram_blocks * BS} tokens"}
    config = TierCacheConfig.from_dict({"codec": "none", "tiers": tiers, "eviction": {"policy": "lru"}})
    return ConnectorScheduler(config, Geometry(("l0", "l1"), 2, 64, BS, torch.float32), world_size)


def request(rid: str, blocks: int, extra_tokens: int = 5, tag: int = 0):
    num_tokens = blocks * BS + extra_tokens
    hashes = [bytes([tag, i]) * 16 for i in range(num_tokens // BS)]  # vLLM hashes every full block
    return SimpleNamespace(
        request_id=rid, num_tokens=num_tokens, num_prompt_tokens=num_tokens, block_hashes=hashes
    )


def step_output(new=(), cached=(), scheduled=None):
    """new: [(req_id, block_ids, num_computed)]; cached: [(req_id, new_block_ids, num_computed)]."""
    new_reqs = [SimpleNamespace(req_id=r, block_ids=(ids,), num_computed_tokens=c) for r, ids, c in new]
    cached_reqs = SimpleNamespace(
        req_ids=[r for r, _, _ in cached],
        resumed_req_ids=set(),
        new_block_ids=[(ids,) if ids else None for _, ids, _ in cached],
        num_computed_tokens=[c for _, _, c in cached],
    )
    return SimpleNamespace(
        scheduled_new_reqs=new_reqs, scheduled_cached_reqs=cached_reqs, num_scheduled_tokens=scheduled or {}
    )


def all_ok(plan) -> WorkerReport:
    """One rank's report of a plan: every load and store done."""
    return WorkerReport((StepResult(plan.step, (True,) * len(plan.loads), (True,) * len(plan.stores)),))


def job_done(job_id: int) -> WorkerReport:
    return WorkerReport(jobs=(JobResult(job_id, True, 1, 0, 0.0),))


def test_prefill_stores_full_blocks_then_a_second_request_loads_them():
    sched = make()
    first = request("a", 5)
    assert sched.num_matched_tokens(first, 0) == 0
    sched.after_alloc(first, list(range(10, 16)), 0)
    meta = sched.build_plan(
        step_output(new=[("a", list(range(10, 16)), 0)], scheduled={"a": first.num_tokens})
    )
    assert [s.block_id for s in meta.stores] == [10, 11, 12, 13, 14]  # 5 full; the partial 6th is not stored
    assert sched.num_matched_tokens(first, 0) == 0  # stores in flight are not hits yet
    sched.on_reports([all_ok(meta)])
    second = request("b", 5, extra_tokens=40)  # same 5 blocks, then its own tokens
    assert sched.num_matched_tokens(second, 0) == 5 * BS
    assert sched.num_matched_tokens(second, 2 * BS) == 3 * BS  # minus what vLLM computed itself
    sched.num_matched_tokens(second, 0)
    sched.after_alloc(second, list(range(20, 27)), 5 * BS)
    meta = sched.build_plan(step_output(new=[("b", list(range(20, 27)), 5 * BS)], scheduled={"b": 40}))
    loads = [(x.block_hash, x.block_id) for x in meta.loads]
    assert loads == [(h, 20 + i) for i, h in enumerate(second.block_hashes[:5])]
    assert [s.block_id for s in meta.stores] == [25]  # block 5 became full this step
    sched.on_reports([all_ok(meta)])
    assert sched.counters == {"loaded_blocks": 5, "load_failures": 0, "stored_blocks": 6, "store_failures": 0}
    sched.manager.check()


def test_a_hit_never_covers_the_last_prompt_token():
    sched = make()
    req = request("a", 4, extra_tokens=0)  # exactly 4 full blocks
    sched.after_alloc(req, [0, 1, 2, 3], 0)
    sched.on_reports(
        [all_ok(sched.build_plan(step_output(new=[("a", [0, 1, 2, 3], 0)], scheduled={"a": 128})))]
    )
    assert sched.num_matched_tokens(request("b", 4, extra_tokens=0), 0) == 3 * BS


def test_failed_loads_are_dropped_and_jobs_complete_once_every_rank_reported():
    sched = make(world_size=2, vram_blocks=4)
    jobs = []
    for i, rid in enumerate("abc"):  # 3 × 3 blocks through a 4-block VRAM tier: spills
        req = request(rid, 3, tag=i)
        ids = [3 * i, 3 * i + 1, 3 * i + 2]
        sched.after_alloc(req, ids, 0)
        meta = sched.build_plan(step_output(new=[(rid, ids, 0)], scheduled={rid: 101}))
        sched.on_reports(ranks(all_ok(meta), all_ok(meta)))
        jobs += meta.jobs
    jobs += sched.build_plan(step_output()).jobs
    assert jobs and sched.manager.stats()["jobs_in_flight"] == len(jobs)
    for job in jobs:
        sched.on_reports([job_done(job.job_id)])  # rank 0 only
    assert sched.manager.stats()["jobs_in_flight"] == len(jobs)
    for job in jobs:
        sched.on_reports([job_done(job.job_id)])  # rank 1
    assert sched.manager.stats()["jobs_in_flight"] == 0
    again = request("a2", 3, tag=0)
    assert sched.num_matched_tokens(again, 0) == 3 * BS
    sched.after_alloc(again, [30, 31, 32], 3 * BS)
    meta = sched.build_plan(step_output(new=[("a2", [30, 31, 32], 3 * BS)], scheduled={"a2": 5}))
    rank1 = WorkerReport((StepResult(meta.step, (True, False, True), ()),))
    sched.on_reports(
        ranks(all_ok(meta), rank1)
    )  # rank 1 failed the second block: it is dropped, the others stay
    assert sched.counters["load_failures"] == 1
    assert sched.num_matched_tokens(request("a3", 3, tag=0), 0) == BS
    sched.drain_events()  # what the connector does after every hook
    assert any(e.kind == "drop" and "load failed" in e.reason for e in sched.events)
    sched.manager.check()


# ---------------------------------------------------------------------- failures while building a step
def aggregated(*reports: WorkerReport) -> TierCacheWorkerMeta:
    """The ranks' reports of one step as vLLM hands them to the scheduler: encoded per rank, aggregated."""
    meta = TierCacheWorkerMeta.of(reports[0])
    for report in reports[1:]:
        meta = meta.aggregate(TierCacheWorkerMeta.of(report))
    return meta


def ranks(*reports: WorkerReport) -> list[WorkerReport]:
    return aggregated(*reports).reports()


def connector(sched: ConnectorScheduler):
    """The real TierCacheConnector (its scheduler-side hooks use only .scheduler) around `sched`; build
    returns the StepPlan the workers would decode, report takes WorkerReports."""
    from tiercache.connectors.vllm import TierCacheConnector

    glue = TierCacheConnector.__new__(TierCacheConnector)  # the hooks, without vLLM's start-up
    glue.scheduler = sched

    return SimpleNamespace(
        build=lambda output: glue.build_connector_meta(output).plan(),
        report=lambda *reports: glue.update_connector_output(
            SimpleNamespace(kv_connector_worker_meta=aggregated(*reports))
        ),
    )


def injected(*_args, **_kwargs):
    raise RuntimeError("injected")


def in_flight(sched: ConnectorScheduler) -> tuple[int, int]:
    """(stores in flight, loads in flight) the manager holds."""
    view = sched.manager.view()
    blocks = [view.block(h) for h in view.hashes()]
    return sum(not b.ready for b in blocks), sum(b.loads_in_flight for b in blocks)


def admit(sched, rid: str, blocks: int, ids: list[int], tag: int = 0, external: int = 0):
    """Admit a new request (its first `external` tokens loaded from the tiers); returns it and its first
    step's (req_id, block_ids, num_computed) and number of scheduled tokens."""
    req = request(rid, blocks, tag=tag)
    sched.num_matched_tokens(req, 0)
    sched.after_alloc(req, ids, external)
    return req, (rid, ids, external), req.num_tokens - external


def prefill(sched, rid: str, blocks: int, ids: list[int], tag: int = 0, external: int = 0):
    req, new, scheduled = admit(sched, rid, blocks, ids, tag, external)
    return req, step_output(new=[new], scheduled={rid: scheduled})


def test_failure_after_prepare_store_aborts_exactly_its_stores(monkeypatch):
    sched = make()
    glue = connector(sched)
    _, output = prefill(sched, "a", 2, [0, 1, 2], tag=1)  # stores of an earlier step, still in flight
    earlier_meta = glue.build(output)
    assert len(earlier_meta.stores) == 2
    free = sched.manager.stats()["vram_free"]
    req, output = prefill(sched, "b", 5, list(range(10, 16)))
    monkeypatch.setattr(sched.manager, "take_jobs", injected)  # fails after prepare_store reserved 5 slots
    meta = glue.build(output)
    monkeypatch.undo()
    assert meta.stores == () and meta.jobs == ()
    assert sched.manager.stats()["vram_free"] == free and in_flight(sched) == (2, 0)  # the earlier 2 remain
    sched.manager.check()
    aborted = [e for e in sched.events if e.kind == "store" and not e.stored]
    assert [e.block_hash for e in aborted] == req.block_hashes[:5]
    assert all(f"step {meta.step}" in e.reason and "injected" in e.reason for e in aborted), aborted[0].reason
    glue.report(all_ok(meta))
    glue.report(all_ok(earlier_meta))
    assert in_flight(sched) == (0, 0) and sched.counters["stored_blocks"] == 2
    _, output = prefill(sched, "c", 5, list(range(20, 26)))  # the next step stores the same blocks normally
    meta = glue.build(output)
    assert [s.block_hash for s in meta.stores] == req.block_hashes[:5]
    glue.report(all_ok(meta))
    assert sched.num_matched_tokens(request("d", 5), 0) == 5 * BS and in_flight(sched) == (0, 0)
    sched.manager.check()


def test_failure_inside_prepare_store_reserves_nothing(monkeypatch):
    sched = make(vram_blocks=8)
    glue = connector(sched)
    _, output = prefill(sched, "a", 7, list(range(8)))
    monkeypatch.setattr(Mover, "vram_room", injected)  # after the slots are allocated
    meta = glue.build(output)
    monkeypatch.undo()
    assert meta.stores == () and in_flight(sched) == (0, 0) and sched.manager.stats()["blocks"] == 0
    assert sched.manager.stats()["vram_free"] == 8
    sched.manager.check()


def test_a_failed_step_refuses_its_loads_without_dropping_the_blocks(monkeypatch):
    sched = make()
    glue = connector(sched)
    _, output = prefill(sched, "a", 5, list(range(6)))
    glue.report(all_ok(glue.build(output)))
    _, output = prefill(sched, "b", 5, list(range(10, 16)), external=5 * BS)  # 5 blocks pinned for loading
    assert in_flight(sched) == (0, 5)
    monkeypatch.setattr(sched.manager, "take_jobs", injected)
    meta = glue.build(output)
    monkeypatch.undo()
    assert [(x.tier, x.block_id) for x in meta.loads] == [
        (None, 10 + i) for i in range(5)
    ]  # refused: recompute
    assert in_flight(sched) == (0, 0)  # nothing will read them: unpinned at once
    glue.report(WorkerReport((StepResult(meta.step, (False,) * 5, ()),)))  # refused loads: reported as errors
    assert sched.counters["load_failures"] == 5
    assert sched.num_matched_tokens(request("c", 5), 0) == 5 * BS  # the blocks were fine: not dropped
    assert not [e for e in sched.events if e.kind == "drop"]
    sched.manager.check()


def test_an_inspection_failure_after_the_metadata_is_complete_loses_nothing(monkeypatch):
    sched = make()
    glue = connector(sched)
    _, output = prefill(sched, "a", 5, list(range(6)))
    glue.report(all_ok(glue.build(output)))
    req, loading, n_loading = admit(sched, "b", 5, list(range(10, 16)), external=5 * BS)
    _, storing, n_storing = admit(sched, "e", 1, [30, 31], tag=7)
    output = step_output(new=[loading, storing], scheduled={"b": n_loading, "e": n_storing})
    monkeypatch.setattr(sched.inspection, "record", injected)
    meta = glue.build(output)
    monkeypatch.undo()
    loads = [(x.block_hash, x.block_id) for x in meta.loads]
    assert loads == list(zip(req.block_hashes[:5], range(10, 15), strict=True))
    assert all(x.tier for x in meta.loads) and [s.block_id for s in meta.stores] == [30]  # served and stored
    glue.report(all_ok(meta))
    assert in_flight(sched) == (0, 0) and sched.counters["loaded_blocks"] == 5
    sched.manager.check()


def test_a_malformed_worker_report_fails_its_step_and_keeps_the_rest():
    sched = make(vram_blocks=4)  # watermark: 1 free VRAM slot
    glue = connector(sched)
    _, output = prefill(sched, "a", 3, [0, 1, 2, 3])
    glue.report(all_ok(glue.build(output)))
    _, output = prefill(sched, "b", 2, [10, 11, 12], tag=5)
    meta = glue.build(output)  # one store to VRAM, one to DRAM, and a spill to restore the watermark
    assert len(meta.stores) == 2 and len(meta.jobs) == 1
    jobs = (JobResult(meta.jobs[0].job_id, True, 1, 0, 0.0),)
    glue.report(WorkerReport((StepResult(meta.step, (), (True,)),), jobs))  # one store result missing
    assert in_flight(sched) == (0, 0) and sched.manager.stats()["jobs_in_flight"] == 0
    assert sched.counters["store_failures"] == 2 and sched.counters["stored_blocks"] == 3
    sched.manager.check()


def test_load_failure_reasons_reach_the_drop_the_counters_and_the_stats():
    sched = make()
    _, output = prefill(sched, "a", 3, [0, 1, 2])
    sched.on_reports([all_ok(sched.build_plan(output))])
    sched.drain_events()
    first = sched.stats_update()
    assert first["totals"]["stores"] == 3
    assert sched.stats_update() == first  # nothing moved: the same totals again (vLLM may drop a step's)
    admit(sched, "b", 3, [10, 11, 12], external=3 * BS)
    plan = sched.build_plan(step_output(new=[("b", [10, 11, 12], 3 * BS)], scheduled={"b": 5}))
    reason = "hash mismatch: vram slot 1 holds block 0102"
    result = StepResult(plan.step, (True, False, True), (), (LoadFailure(1, reason),))
    sched.on_reports([WorkerReport((result,), io=(IoSample("load", 2, 4096, 0.001),))])
    sched.drain_events()
    drops = [e for e in sched.events if e.kind == "drop"]
    assert len(drops) == 1 and f"load failed ({reason})" in drops[0].reason
    update = sched.stats_update()
    assert update["totals"]["failures_hash_mismatch"] == 1 and update["totals"]["stores"] == 3
    assert update["totals"]["io_load_bytes"] == 4096 and update["totals"]["io_load_us"] == 1000
    assert update["gauges"]["capacity_blocks_vram"] == 64 and update["gauges"]["used_blocks_vram"] == 2


# ---------------------------------------------------------------------- tensor parallel: several ranks
def test_stores_computed_over_a_load_that_failed_on_one_rank_are_aborted():
    """A load that failed on rank 1 only: the request's KV computed in that step (and in a step planned
    before the report came) attended over a block rank 1 never wrote, so none of it is kept; another
    request's stores in the same step are; vLLM's recompute stores the blocks again."""
    sched = make(world_size=2)
    _, output = prefill(sched, "a", 3, [0, 1, 2])
    sched.on_reports(ranks(*[all_ok(sched.build_plan(output))] * 2))
    b, new_b, _ = admit(sched, "b", 6, list(range(10, 17)), external=3 * BS)  # hits a's 3 blocks
    _, new_c, _ = admit(sched, "c", 2, [20, 21, 22], tag=1)
    first = sched.build_plan(step_output(new=[new_b, new_c], scheduled={"b": 69, "c": 69}))
    assert [s.block_id for s in first.stores] == [13, 14, 20, 21]  # b's blocks 3-4, c's 0-1
    second = sched.build_plan(step_output(cached=[("b", None, 165)], scheduled={"b": 32}))
    assert [s.block_id for s in second.stores] == [15]  # b's block 5, planned before the report
    rank1 = WorkerReport((StepResult(first.step, (True, False, True), (True,) * 4),), rank=1)
    sched.on_reports(ranks(all_ok(first), rank1))
    sched.on_reports(ranks(all_ok(second), dataclasses.replace(all_ok(second), rank=1)))
    assert sched.counters["store_failures"] == 3 and sched.counters["load_failures"] == 1
    view = sched.manager.view()
    assert [h in view.hashes() for h in b.block_hashes] == [True, False, True, False, False, False]
    sched.drain_events()
    aborted = [e for e in sched.events if e.kind == "store" and not e.stored]
    assert len(aborted) == 3 and all("over a block whose load failed" in e.reason for e in aborted)
    # vLLM recomputes b from block 1 (the failed one): those blocks are stored now
    again = sched.build_plan(step_output(cached=[("b", None, 32)], scheduled={"b": 165}))
    assert [s.block_hash for s in again.stores] == [b.block_hashes[i] for i in (1, 3, 4, 5)]
    sched.on_reports(ranks(all_ok(again), dataclasses.replace(all_ok(again), rank=1)))
    assert sched.num_matched_tokens(request("d", 6, tag=0), 0) == 6 * BS
    sched.manager.check()


def test_a_step_completes_once_every_rank_reported_it_in_whatever_engine_steps():
    """A rank whose loads waited for reads reports its step later than the others: the step's loads and
    stores complete only then, with both ranks' outcomes (rank 1's refusal is not lost)."""
    sched = make(world_size=2)
    _, output = prefill(sched, "a", 3, [0, 1, 2])
    plan = sched.build_plan(output)
    sched.on_reports([all_ok(plan)])  # rank 0 only
    assert sched.counters["stored_blocks"] == 0 and sched.manager.stats()["jobs_in_flight"] == 0
    sched.on_reports([dataclasses.replace(all_ok(plan), rank=1)])
    assert sched.counters["stored_blocks"] == 3
    _, new_b, _ = admit(sched, "b", 4, [10, 11, 12, 13], external=3 * BS)
    loads = sched.build_plan(step_output(new=[new_b], scheduled={"b": 1}))
    later = sched.build_plan(step_output())
    sched.on_reports([all_ok(loads), all_ok(later)])  # rank 0: both steps
    rank1 = WorkerReport((StepResult(loads.step, (True, False, True), ()),), rank=1)
    sched.on_reports([dataclasses.replace(all_ok(later), rank=1)])  # rank 1: the later step first
    assert sched.counters["loaded_blocks"] == 0
    sched.on_reports([rank1])
    assert sched.counters["loaded_blocks"] == 2 and sched.counters["load_failures"] == 1
    sched.manager.check()


def test_copies_count_blocks_once_and_bytes_of_every_rank():
    sched = make(world_size=2)
    samples = (IoSample("store", 3, 3000, 0.002),)
    sched.on_reports([WorkerReport(io=samples), WorkerReport(io=samples, rank=1)])
    totals = sched.stats_update()["totals"]
    assert (totals["io_store_blocks"], totals["io_store_bytes"], totals["io_store_us"]) == (3, 6000, 4000)


def test_loads_end_with_their_step_and_a_request_whose_load_failed_is_retried_without_hits():
    """vLLM's asynchronous-load path: the request waits through the step whose plan carries its loads, and
    the plan names it (every rank reports it received after that step). vLLM's call of after_alloc when it
    then schedules the request changes nothing. When every load of a request failed (here its step's plan
    failed: the blocks stay good), vLLM frees the request and admits it again: that retry is offered no hits
    (it recomputes, as a failure found at admission would; offering them again could fail for ever), and
    explain_request keeps the first admission, whose failed loads it tells."""
    sched = make()
    first = request("a", 5)
    sched.num_matched_tokens(first, 0)
    sched.after_alloc(first, list(range(10, 16)), 0)
    meta = sched.build_plan(
        step_output(new=[("a", list(range(10, 16)), 0)], scheduled={"a": first.num_tokens})
    )
    assert meta.load_requests == ()
    sched.on_reports([all_ok(meta)])

    waiting = request("b", 5, extra_tokens=40)
    assert sched.num_matched_tokens(waiting, 0) == 5 * BS
    sched.after_alloc(waiting, list(range(20, 27)), 5 * BS)
    meta = sched.build_plan(step_output())  # b waits for its loads: nothing scheduled
    assert meta.load_requests == ("b",) and [x.block_id for x in meta.loads] == list(range(20, 25))
    sched.on_reports([all_ok(meta)])
    sched.after_alloc(waiting, list(range(20, 27)), 0)  # vLLM schedules it, its loads done
    meta = sched.build_plan(step_output(new=[("b", list(range(20, 27)), 5 * BS)], scheduled={"b": 40}))
    assert meta.loads == () and meta.load_requests == () and [s.block_id for s in meta.stores] == [25]
    sched.on_reports([all_ok(meta)])
    assert sched.inspection.requests.find("b").hit_blocks == 5

    failing = request("c", 5, extra_tokens=20)
    assert sched.num_matched_tokens(failing, 0) == 5 * BS
    sched.after_alloc(failing, list(range(30, 36)), 5 * BS)
    meta = sched.refuse_step("injected")  # the step's plan failed: its loads go out refused
    sched.release_refused_step()
    assert meta.load_requests == ("c",) and len(meta.loads) == 5
    sched.on_reports([WorkerReport((StepResult(meta.step, (False,) * 5, ()),))])
    assert sched.num_matched_tokens(failing, 0) == 0  # vLLM's retry: recomputed, though the blocks are good
    sched.after_alloc(failing, list(range(40, 46)), 0)
    assert sched.build_plan(step_output()).load_requests == ()
    record = sched.inspection.requests.find("c")
    assert record.hit_blocks == 5 and record.tokens_loaded == 5 * BS  # the first admission's
    assert sched.num_matched_tokens(request("d", 5, extra_tokens=20), 0) == 5 * BS  # still good for others
    sched.manager.check()
