"""Worker-side executor: runs the manager's plain-data decisions on one rank's pools.

Provides:
    TierWorker(vram, dram, max_batch_blocks=None)   (None: 64 MiB of device staging per direction)
    TierWorker.create(layout, vram_blocks, dram_blocks, device, pin=None)
    TierWorker.from_config(config, layout, device, pin=None)   capacities as TierManager.from_config
        store(tiers, slots, blocks)      write encoded blocks ([L, n, …], device) where prepare_store said
        load(tiers, slots) -> KVBlocks   read blocks from where prepare_load said (VRAM gather, DRAM DMA)
        run_jobs(jobs)                   submit spills and warms (TransferJob or their dicts)
        poll() / wait() -> list[TransferResult]   finished jobs: report each with
                                         manager.complete_transfer(result.job_id, result.ok)

The connector's worker side owns one TierWorker per rank; every rank receives the same jobs and slots and
holds its own KV-head shard in them (tensor parallel). Nothing here decides anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from tiercache.events import DRAM, VRAM
from tiercache.jobs import TransferJob
from tiercache.layout import BlockLayout
from tiercache.pools import SECTIONS, DramPool, KVBlocks, VramPool
from tiercache.transfer import TransferEngine, TransferResult


class TierWorker:
    def __init__(self, vram: VramPool, dram: DramPool, max_batch_blocks: int | None = None) -> None:
        self.vram = vram
        self.dram = dram
        self.engine = TransferEngine(vram, dram, max_batch_blocks)

    @classmethod
    def from_config(
        cls, config, layout: BlockLayout, device: torch.device | str = "cuda", pin: bool | None = None
    ) -> TierWorker:
        """Worker side: allocate this rank's pools for a config (fails at start, with both numbers, when a
        tier asks for more memory than the machine has)."""
        from tiercache.manager import tier_capacities

        device = torch.device(device)
        config.check_memory(layout.bytes_per_token, check_device=device.type == "cuda")
        vram_blocks, dram_blocks = tier_capacities(config, layout)
        return cls.create(layout, vram_blocks, dram_blocks, device, pin)

    @classmethod
    def create(
        cls,
        layout: BlockLayout,
        vram_blocks: int,
        dram_blocks: int,
        device: torch.device | str = "cuda",
        pin: bool | None = None,
    ) -> TierWorker:
        return cls(VramPool(layout, vram_blocks, device), DramPool(layout, dram_blocks, pin=pin))

    def store(self, tiers: Sequence[str], slots: Sequence[int], blocks: KVBlocks) -> None:
        for tier, positions in _split(tiers).items():
            part = blocks if len(positions) == len(tiers) else _take(blocks, positions)
            tier_slots = [slots[i] for i in positions]
            if tier == VRAM:
                self.vram.write(tier_slots, part)
            else:
                self.engine.write_dram(tier_slots, part)

    def load(self, tiers: Sequence[str], slots: Sequence[int]) -> KVBlocks:
        groups = _split(tiers)
        parts = {
            tier: self.vram.read([slots[i] for i in pos])
            if tier == VRAM
            else self.engine.read_dram([slots[i] for i in pos])
            for tier, pos in groups.items()
        }
        if len(parts) == 1:
            return next(iter(parts.values()))
        order = torch.as_tensor(groups[VRAM] + groups[DRAM])
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(len(order))
        inverse = inverse.to(self.vram.device)
        return KVBlocks(
            *(
                torch.cat([getattr(parts[VRAM], n), getattr(parts[DRAM], n)], dim=1).index_select(1, inverse)
                for n in SECTIONS
            )
        )

    def run_jobs(self, jobs: Iterable[TransferJob | dict]) -> None:
        for job in jobs:
            self.engine.submit(job if isinstance(job, TransferJob) else TransferJob.from_dict(job))

    def poll(self) -> list[TransferResult]:
        return self.engine.poll()

    def wait(self) -> list[TransferResult]:
        return self.engine.wait()


def _split(tiers: Sequence[str]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {}
    for i, tier in enumerate(tiers):
        if tier not in (VRAM, DRAM):
            raise ValueError(f"tier must be 'vram' or 'dram', got {tier!r}")
        groups.setdefault(tier, []).append(i)
    return groups


def _take(blocks: KVBlocks, positions: list[int]) -> KVBlocks:
    idx = torch.as_tensor(positions, device=blocks.k_packed.device)
    return KVBlocks(*(getattr(blocks, n).index_select(1, idx) for n in SECTIONS))
