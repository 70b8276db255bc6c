"""Payload checksums of this rank's stored blocks: computed on the device from the bytes a store writes, kept
per slot next to the pools, moved with a block when it is spilled or warmed, checked on every load.

Provides:
    checksums_of(blocks, ids=None) -> [n, 2] int64   the checksums (tiercache.kernels.block_checksums:
                                             definition and detection guarantee) of KVBlocks, on their device;
                                             ids [n]: of those blocks of [L, NB, …] sections (a pool's, read
                                             in place)
    SlotChecksums(capacities, device)        {tier: slots}; one [slots, 2] int64 table per tier on `device`
                                             (SLOT_CHECKSUM_BYTES a slot)
        record(tier, slots, sums)            these slots now hold bytes with these checksums
        get(tier, slots) -> [n, 2] int64     the sums recorded for these slots
        move(src_tier, src_slots, dst_tier, dst_slots)   a transfer copies its blocks' checksums
        expected(places) -> [n, 2] int64     the sums recorded for blocks read from places[i] = (tier,
                                             slot), on the device (no host synchronisation)

What is checksummed: a whole block (all layers, K and V, packed bytes and norms, in BlockLayout's section
order), one pair of sums per block. A block is the unit of a load and of a miss, so per-block sums find
everything per-layer sums would at an n-th of the bookkeeping. The tables live on the device (DRAM slots'
sums too: 16 bytes a slot), so a store and a move never wait for the device. A load compares on the device
too, and the decode skips the blocks that failed (TierWorker.check_read): the host synchronises once, after
the load's kernels are queued, to learn which blocks were refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from tiercache.kernels import block_checksums, block_checksums_host
from tiercache.worker.pools import SECTIONS, KVBlocks


def checksums_of(blocks: KVBlocks, ids: torch.Tensor | None = None) -> torch.Tensor:
    """[n, 2] int64: the Triton kernel on CUDA, block_checksums_host elsewhere (the reference's bits)."""
    sections = [getattr(blocks, name) for name in SECTIONS]
    if sections[0].device.type == "cuda":
        return block_checksums(sections, ids)
    return block_checksums_host(sections, ids)


SLOT_CHECKSUM_BYTES = 16  # (S1, S2) int64 per slot


class SlotChecksums:
    def __init__(self, capacities: Mapping[str, int], device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._sums = {
            tier: torch.zeros(n, 2, dtype=torch.int64, device=self.device) for tier, n in capacities.items()
        }  # [slots, 2] int64 per tier: (S1, S2) of the bytes last written to each slot

    def record(self, tier: str, slots: Sequence[int], sums: torch.Tensor) -> None:
        self._sums[tier].index_copy_(0, self._index(slots), sums.to(self.device))

    def get(self, tier: str, slots: Sequence[int]) -> torch.Tensor:
        """[n, 2] int64 on the device: the sums recorded for these slots."""
        return self._sums[tier].index_select(0, self._index(slots))

    def move(self, src_tier: str, src_slots: Sequence[int], dst_tier: str, dst_slots: Sequence[int]) -> None:
        """On the current stream, before the transfer's own stream copies the bytes: whoever reads the
        destination's sum reads it after the transfer finished, and so after this copy."""
        moved = self._sums[src_tier].index_select(0, self._index(src_slots))
        self._sums[dst_tier].index_copy_(0, self._index(dst_slots), moved)

    def expected(self, places: Sequence[tuple[str, int]]) -> torch.Tensor:
        tiers = {tier for tier, _ in places}
        if len(tiers) == 1:
            (tier,) = tiers
            return self._sums[tier].index_select(0, self._index([slot for _, slot in places]))
        expected = torch.empty(len(places), 2, dtype=torch.int64, device=self.device)
        for tier in tiers:
            at = [i for i, (t, _) in enumerate(places) if t == tier]
            slots = self._sums[tier].index_select(0, self._index([places[i][1] for i in at]))
            expected.index_copy_(0, self._index(at), slots)
        return expected

    def _index(self, slots: Sequence[int]) -> torch.Tensor:
        idx = torch.as_tensor(slots, dtype=torch.int64)
        if self.device.type == "cuda":
            idx = idx.pin_memory().to(self.device, non_blocking=True)
        return idx
