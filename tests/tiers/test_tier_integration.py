"""Scheduler-side manager + worker-side pools and transfers, end to end on real bytes (CPU).

The manager's plain-data outputs go through msgpack, as they will between the connector's processes.
Every load compares the bytes read with the bytes stored for that block hash.
"""

import logging
import random

import msgpack
import pytest
import torch

from tiercache.events import DRAM, VRAM
from tiercache.jobs import PrepareLoadOutput, PrepareStoreOutput, TransferJob
from tiercache.layout import BlockLayout
from tiercache.manager import TierManager
from tiercache.pools import SECTIONS, KVBlocks
from tiercache.worker import TierWorker

LAYOUT = BlockLayout(num_layers=2, block_size=4, num_kv_heads=2, k_packed_dim=16, v_packed_dim=8)
UNIVERSE = 96


def wire(obj):
    return msgpack.unpackb(msgpack.packb(obj))


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
    caplog.set_level(logging.ERROR, logger="tiercache.manager")  # out-of-room lines are expected here
    rng = random.Random(5)
    manager = TierManager(12, 24, "codec", spill_watermark=0.25)
    worker = TierWorker.create(LAYOUT, 12, 24, device="cpu", pin=False)
    seen = {VRAM: 0, DRAM: 0}
    warmed = spilled = 0
    for _ in range(3000):
        start = rng.randrange(UNIVERSE)
        ids = [(start + i) % UNIVERSE for i in range(rng.randint(1, 5))]
        hashes = [i.to_bytes(2, "little") for i in ids]
        if rng.random() < 0.5:
            out = manager.prepare_store(hashes)
            if out is not None and out.block_hashes:
                out = PrepareStoreOutput.from_dict(wire(out.to_dict()))
                worker.store(out.tiers, out.slots, content(ident(h) for h in out.block_hashes))
                manager.complete_store(out.block_hashes)
        else:
            n = manager.lookup(hashes)
            out = manager.prepare_load(hashes[:n]) if n else None
            if out is not None:
                out = PrepareLoadOutput.from_dict(wire(out.to_dict()))
                got = worker.load(out.tiers, out.slots)
                assert got.equal(content(ident(h) for h in out.block_hashes))
                for tier in out.tiers:
                    seen[tier] += 1
                manager.complete_load(out.block_hashes)
        jobs = [TransferJob.from_dict(wire(job.to_dict())) for job in manager.take_jobs()]
        warmed += sum(len(j) for j in jobs if j.kind == "warm")
        spilled += sum(len(j) for j in jobs if j.kind == "spill")
        worker.run_jobs(jobs)
        for result in worker.poll():
            manager.complete_transfer(result.job_id, result.ok)
        manager.quick_check()
    manager.check()
    for block_hash, entry in manager.index.entries.items():  # index and pools agree, block by block
        pool = worker.vram if entry.tier == VRAM else worker.dram
        assert pool.read([entry.slot]).equal(content([ident(block_hash)]))
    assert seen[VRAM] > 100 and seen[DRAM] > 100 and warmed > 50 and spilled > 50


def test_from_config_both_sides_agree(tmp_path):
    from tiercache.config import TierCacheConfig
    from tiercache.errors import ConfigError

    config = TierCacheConfig.from_dict({"codec": "tq4", "tiers": {"vram": "64 tokens", "dram": "1MiB"}})
    manager = TierManager.from_config(config, LAYOUT, "codec")
    worker = TierWorker.from_config(config, LAYOUT, device="cpu", pin=False)
    assert manager.alloc[VRAM].capacity == worker.vram.num_blocks == 64 // LAYOUT.block_size
    assert manager.alloc[DRAM].capacity == worker.dram.num_blocks == 2**20 // LAYOUT.dram_stride
    assert manager.policy.name == "graph"  # the default eviction policy
    manager.close()
    too_big = TierCacheConfig.from_dict({"tiers": {"dram": "1000 TiB"}})
    with pytest.raises(ConfigError, match=r"tiers.dram: .* but this machine has"):
        TierWorker.from_config(too_big, LAYOUT, device="cpu", pin=False)
