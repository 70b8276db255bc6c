"""Randomized stress: 100k mixed manager operations against a fake worker with shadow pools.

After every operation: the O(1) slot-count invariant (slots in use = blocks + moves + retired) and, for each
load, that the pool slot holds the block asked for, both when the load starts and when it completes (so no
slot was reused under a reader). Every 5,000 operations: the full check (no slot owned twice, free + used =
capacity, allocator runs coalesced) and every ready block's slot holds that block (index and pools agree).
"""

import logging
import random

import pytest

from tiercache.scheduler.manager import TierManager
from tiercache.wire import DRAM, TIERS, VRAM


class FakeWorker:
    """Executes stores, loads and jobs on shadow pools (slot → block hash), with delays and failures."""

    def __init__(self, manager: TierManager, rng: random.Random):
        self.m = manager
        self.rng = rng
        self.pool = {VRAM: {}, DRAM: {}}
        self.stores = []  # hashes written, awaiting complete_store
        self.loads = []  # (hashes, tiers, slots) awaiting complete_load
        self.jobs = []  # (job, source contents at planning)
        self.jobs_seen = 0

    def store(self, hashes):
        out = self.m.prepare_store(hashes)
        if out is None:
            return
        for block_hash, tier, slot in zip(out.block_hashes, out.tiers, out.slots, strict=True):
            self.pool[tier][slot] = block_hash
        if out.block_hashes:
            self.stores.append(out.block_hashes)

    def load(self, hashes):
        n = self.m.lookup(hashes)
        out = self.m.prepare_load(hashes[:n]) if n else None
        if out is None:
            return
        self._verify(out)
        self.loads.append(out)

    def _verify(self, out):
        for block_hash, tier, slot in zip(out.block_hashes, out.tiers, out.slots, strict=True):
            assert self.pool[tier].get(slot) == block_hash, f"{tier} slot {slot} does not hold the block"

    def take_jobs(self):
        for job in self.m.take_jobs():
            src = self.pool[job.src_tier]
            contents = [src[s] for s in job.src_slots]
            assert contents == list(job.block_hashes), "a job names blocks its source slots do not hold"
            self.jobs.append((job, contents))
            self.jobs_seen += 1

    def finish_some(self):
        rng = self.rng
        for _ in range(min(len(self.stores), rng.randint(0, 3))):
            self.m.complete_store(self.stores.pop(rng.randrange(len(self.stores))), ok=rng.random() > 0.03)
        for _ in range(min(len(self.loads), rng.randint(0, 3))):
            out = self.loads.pop(rng.randrange(len(self.loads)))
            self._verify(out)  # nobody wrote the slots while the load was reading them
            self.m.complete_load(out.block_hashes, ok=rng.random() > 0.01)
        for _ in range(min(len(self.jobs), rng.randint(0, 2))):
            job, contents = self.jobs.pop(rng.randrange(len(self.jobs)))
            src, dst = self.pool[job.src_tier], self.pool[job.dst_tier]
            assert [src[s] for s in job.src_slots] == contents, "a source slot changed before its move ran"
            ok = rng.random() > 0.03
            for s, d in zip(job.src_slots, job.dst_slots, strict=True):
                dst[d] = src[s] if ok else b"garbage"
            self.m.complete_transfer(job.job_id, ok=ok)

    def agree(self):
        view = self.m.view()
        for block in (b for tier in TIERS for b in view.blocks(tier)):  # every ready block
            assert self.pool[block.tier][block.slot] == block.block_hash


@pytest.fixture(autouse=True)
def quiet_manager():
    """Out-of-room lines are expected here by the thousand."""
    logger = logging.getLogger("tiercache.scheduler.manager")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


def run_stress(ops: int, seed: int, vram: int, dram: int, universe: int) -> tuple[TierManager, FakeWorker]:
    rng = random.Random(seed)
    m = TierManager(vram, dram, "codec", spill_watermark=0.1)
    worker = FakeWorker(m, rng)
    for step in range(ops):
        start = rng.randrange(universe)  # runs of consecutive ids, so prefixes repeat and hit
        hashes = [(start + i) % universe for i in range(rng.randint(1, 6))]
        hashes = [i.to_bytes(4, "little") for i in hashes]
        if rng.random() < 0.05:
            hashes.append(hashes[0])  # a block asked twice in one call
        r = rng.random()
        if r < 0.30:
            worker.store(hashes)
        elif r < 0.55:
            worker.load(hashes)
        elif r < 0.60:
            m.touch(hashes)
        elif r < 0.65:
            m.prefetch(hashes)
        elif r < 0.75:
            worker.take_jobs()
        else:
            worker.finish_some()
        if rng.random() < 0.01:
            m.take_events()
        m.quick_check()
        if step % 5000 == 0:
            m.check()
            worker.agree()
    m.check()
    worker.agree()
    return m, worker


def test_stress_100k_ops():
    m, worker = run_stress(100_000, seed=0, vram=48, dram=96, universe=200)
    stats = m.stats()
    assert stats["blocks"] > 0 and worker.jobs_seen > 100


@pytest.mark.parametrize(("vram", "dram"), [(8, 0), (4, 4), (64, 16), (16, 200)])
def test_stress_shapes(vram, dram):
    run_stress(10_000, seed=vram + dram, vram=vram, dram=dram, universe=150)


@pytest.mark.slow
def test_stress_1m_ops():
    run_stress(1_000_000, seed=7, vram=256, dram=1024, universe=3000)
