"""Scheduler-side manager + worker-side pools and transfers, end to end on real bytes (CPU).

The manager's decisions reach the worker as wire items encoded and decoded once, as between the connector's
processes. Every load compares the bytes read with the bytes stored for that block hash, and the worker's
checksum check passes on them (the checksums followed every spill and warm).
"""

import logging
import random

import pytest
import torch

from tiercache.layout import BlockLayout
from tiercache.scheduler.manager import TierManager
from tiercache.wire import DRAM, VRAM, LoadItem, StepPlan, StoreItem, decode, encode
from tiercache.worker.pools import SECTIONS, KVBlocks
from tiercache.worker.tier_worker import TierWorker

LAYOUT = BlockLayout(num_layers=2, block_size=4, num_kv_heads=2, k_packed_dim=16, v_packed_dim=8)
UNIVERSE = 96


def wire(plan: StepPlan) -> StepPlan:
    return decode(encode(plan), StepPlan)


def content(ids) -> KVBlocks:
    """Deterministic bytes for block ids (the 'KV' of block i)."""
    g = torch.Generator().manual_seed(1234)
    L, BS, H = LAYOUT.num_layers, LAYOUT.block_size, LAYOUT.num_kv_heads
    table = KVBlocks(
        torch.randint(0, 256, (L, UNIVERSE, BS, H, LAYOUT.k_packed_dim), generator=g, dtype=torch.uint8),
        torch.randint(0, 256, (L, UNIVERSE, BS, H, LAYOUT.v_packed_dim), generator=g, dtype=torch.uint8),
        torch.randn(L, UNIVERSE, BS, H, generator=g),
        torch.randn(L, UNIVERSE, BS, H, generator=g),
    )
    idx = torch.as_tensor(list(ids))
    return KVBlocks(*(getattr(table, n).index_select(1, idx) for n in SECTIONS))


def ident(block_hash: bytes) -> int:
    return int.from_bytes(block_hash, "little")


def test_manager_and_worker_agree_on_bytes(caplog):
    caplog.set_level(
        logging.ERROR, logger="tiercache.scheduler.manager"
    )  # out-of-room lines are expected here
    rng = random.Random(5)
    manager = TierManager(12, 24, "codec", spill_watermark=0.25)
    worker = TierWorker.create(LAYOUT, 12, 24, "codec", device="cpu", pin=False)
    seen = {VRAM: 0, DRAM: 0}
    warmed = spilled = 0
    for _ in range(3000):
        start = rng.randrange(UNIVERSE)
        ids = [(start + i) % UNIVERSE for i in range(rng.randint(1, 5))]
        hashes = [i.to_bytes(2, "little") for i in ids]
        if rng.random() < 0.5:
            out = manager.prepare_store(hashes)
            if out is not None and out.block_hashes:
                placed = zip(out.block_hashes, out.tiers, out.slots, strict=True)
                stores = wire(StepPlan(0, stores=tuple(StoreItem(h, t, s, 0) for h, t, s in placed))).stores
                worker.store(stores, content(ident(x.block_hash) for x in stores))
                manager.complete_store(out.block_hashes)
        else:
            n = manager.lookup(hashes)
            out = manager.prepare_load(hashes[:n]) if n else None
            if out is not None:
                placed = zip(out.block_hashes, out.tiers, out.slots, strict=True)
                loads = wire(StepPlan(0, loads=tuple(LoadItem(h, t, s, 0) for h, t, s in placed))).loads
                assert not any(worker.refusal(x) for x in loads)  # every slot holds the block asked
                got = worker.load(loads)
                assert got.equal(content(ident(x.block_hash) for x in loads))
                assert worker.verify(loads, got) == [None] * len(loads)  # checksums moved with the bytes
                for x in loads:
                    seen[x.tier] += 1
                manager.complete_load(out.block_hashes)
        jobs = wire(StepPlan(0, jobs=tuple(manager.take_jobs()))).jobs
        warmed += sum(len(j) for j in jobs if j.kind == "warm")
        spilled += sum(len(j) for j in jobs if j.kind == "spill")
        for job in jobs:
            worker.submit(job)
        for result in worker.poll():
            manager.complete_transfer(result.job_id, result.ok)
        manager.quick_check()
    manager.check()
    view = manager.view()
    for block_hash in view.hashes():  # index and pools agree, block by block
        block = view.block(block_hash)
        pool = worker.vram if block.tier == VRAM else worker.dram
        assert pool.read([block.slot]).equal(content([ident(block_hash)]))
    assert seen[VRAM] > 100 and seen[DRAM] > 100 and warmed > 50 and spilled > 50


def test_from_config_both_sides_agree(tmp_path):
    from tiercache.config import TierCacheConfig
    from tiercache.errors import ConfigError

    config = TierCacheConfig.from_dict({"codec": "tq4", "tiers": {"vram": "64 tokens", "dram": "1MiB"}})
    manager = TierManager.from_config(config, LAYOUT, "codec")
    worker = TierWorker.from_config(config, LAYOUT, "codec", device="cpu", pin=False)
    tiers = {t.name: t.capacity_blocks for t in manager.view().tiers()}
    assert tiers[VRAM] == worker.vram.num_blocks == 64 // LAYOUT.block_size
    assert tiers[DRAM] == worker.dram.num_blocks == 2**20 // LAYOUT.dram_stride
    assert manager.policy.name == "graph"  # the default eviction policy
    manager.close()
    too_big = TierCacheConfig.from_dict({"tiers": {"dram": "1000 TiB"}})
    with pytest.raises(ConfigError, match=r"tiers.dram: .* but this machine has"):
        TierWorker.from_config(too_big, LAYOUT, "codec", device="cpu", pin=False)
