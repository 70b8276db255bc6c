"""ConnectorScheduler without an engine: vLLM's Request and SchedulerOutput stood in by plain objects."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from tiercache.config import TierCacheConfig
from tiercache.connectors.common import Geometry
from tiercache.connectors.metadata import TierCacheWorkerMeta
from tiercache.connectors.scheduler import ConnectorScheduler

BS = 32


def make(world_size: int = 1, vram_blocks: int = 64) -> ConnectorScheduler:
    tiers = {"vram": f"{vram_blocks * BS} tokens", "dram": f"{4 * vram_blocks * BS} tokens"}
    config = TierCacheConfig.from_dict({"codec": "none", "tiers": tiers, "eviction": {"policy": "lru"}})
    return ConnectorScheduler(config, Geometry(("l0", "l1"), 2, 64, BS, torch.float32), world_size)


def request(rid: str, blocks: int, extra_tokens: int = 5, tag: int = 0):
    num_tokens = blocks * BS + extra_tokens
    hashes = [bytes([tag, i]) * 16 for i in range(num_tokens // BS)]  # vLLM hashes every full block
    return SimpleNamespace(request_id=rid, num_tokens=num_tokens, block_hashes=hashes)


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


def all_ok(meta) -> TierCacheWorkerMeta:
    return TierCacheWorkerMeta([[meta.step, [True] * len(meta.stores), [True] * len(meta.loads)]])


def test_prefill_stores_full_blocks_then_a_second_request_loads_them():
    sched = make()
    first = request("a", 5)
    assert sched.num_matched_tokens(first, 0) == 0
    sched.after_alloc(first, list(range(10, 16)), 0)
    meta = sched.build_meta(
        step_output(new=[("a", list(range(10, 16)), 0)], scheduled={"a": first.num_tokens})
    )
    assert [s[3] for s in meta.stores] == [10, 11, 12, 13, 14]  # 5 full blocks; the partial 6th is not stored
    assert sched.num_matched_tokens(first, 0) == 0  # stores in flight are not hits yet
    sched.on_worker_meta(all_ok(meta))
    second = request("b", 5, extra_tokens=40)  # same 5 blocks, then its own tokens
    assert sched.num_matched_tokens(second, 0) == 5 * BS
    assert sched.num_matched_tokens(second, 2 * BS) == 3 * BS  # minus what vLLM computed itself
    sched.num_matched_tokens(second, 0)
    sched.after_alloc(second, list(range(20, 27)), 5 * BS)
    meta = sched.build_meta(step_output(new=[("b", list(range(20, 27)), 5 * BS)], scheduled={"b": 40}))
    assert [(x[0], x[3]) for x in meta.loads] == [(h, 20 + i) for i, h in enumerate(second.block_hashes[:5])]
    assert [s[3] for s in meta.stores] == [25]  # block 5 became full this step
    sched.on_worker_meta(all_ok(meta))
    assert sched.counters == {"loaded_blocks": 5, "load_failures": 0, "stored_blocks": 6, "store_failures": 0}
    sched.manager.check()


def test_a_hit_never_covers_the_last_prompt_token():
    sched = make()
    req = request("a", 4, extra_tokens=0)  # exactly 4 full blocks
    sched.after_alloc(req, [0, 1, 2, 3], 0)
    sched.on_worker_meta(
        all_ok(sched.build_meta(step_output(new=[("a", [0, 1, 2, 3], 0)], scheduled={"a": 128})))
    )
    assert sched.num_matched_tokens(request("b", 4, extra_tokens=0), 0) == 3 * BS


def test_failed_loads_are_dropped_and_jobs_complete_once_every_rank_reported():
    sched = make(world_size=2, vram_blocks=4)
    jobs = []
    for i, rid in enumerate("abc"):  # 3 × 3 blocks through a 4-block VRAM tier: spills
        req = request(rid, 3, tag=i)
        ids = [3 * i, 3 * i + 1, 3 * i + 2]
        sched.after_alloc(req, ids, 0)
        meta = sched.build_meta(step_output(new=[(rid, ids, 0)], scheduled={rid: 101}))
        sched.on_worker_meta(all_ok(meta).aggregate(all_ok(meta)))
        jobs += meta.jobs
    jobs += sched.build_meta(step_output()).jobs
    assert jobs and sched.manager.stats()["jobs_in_flight"] == len(jobs)
    for job in jobs:
        sched.on_worker_meta(TierCacheWorkerMeta(jobs=[[job["job_id"], True]]))  # rank 0 only
    assert sched.manager.stats()["jobs_in_flight"] == len(jobs)
    for job in jobs:
        sched.on_worker_meta(TierCacheWorkerMeta(jobs=[[job["job_id"], True]]))  # rank 1
    assert sched.manager.stats()["jobs_in_flight"] == 0
    again = request("a2", 3, tag=0)
    assert sched.num_matched_tokens(again, 0) == 3 * BS
    sched.after_alloc(again, [30, 31, 32], 3 * BS)
    meta = sched.build_meta(step_output(new=[("a2", [30, 31, 32], 3 * BS)], scheduled={"a2": 5}))
    report = all_ok(meta).aggregate(TierCacheWorkerMeta([[meta.step, [], [True, False, True]]]))
    sched.on_worker_meta(report)  # rank 1 failed the second block: it is dropped, the others stay
    assert sched.counters["load_failures"] == 1
    assert sched.num_matched_tokens(request("a3", 3, tag=0), 0) == BS
    assert any(e.kind == "drop" and "load failed" in e.reason for e in sched.events)
    sched.manager.check()
