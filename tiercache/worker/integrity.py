"""Payload checksums of this rank's stored blocks: computed on the device from the bytes a store writes, kept
per slot next to the pools, moved with a block when it is spilled or warmed, checked on every load.

Provides:
    checksums_of(blocks, ids=None) -> [n, 2, L, 2] int64   the piece checksums (tiercache.kernels.
                                             piece_checksums: definition and detection guarantee) of KVBlocks,
                                             on their device; ids [n]: of those blocks of [L, NB, …] sections
                                             (a pool's, read in place)
    groups_of(blocks) -> ((k_packed, k_norms), (v_packed, v_norms))   the pieces' sections: one piece per
                                             side (K, V) and layer
    block_checksum(sums, layout) -> [n, 2] int64 (host)   a whole block's checksum from its pieces' sums (the
                                             remote tier's header: kernels.fold_pieces)
    slot_checksum_bytes(num_layers)          device bytes of one slot's sums (32 a layer)
    SlotChecksums(capacities, device, num_layers)   {tier: slots}; one [slots, 2, L, 2] int64 table per tier
                                             on `device`
        record(tier, slots, sums)            these slots now hold bytes with these checksums
        get(tier, slots) -> [n, 2, L, 2]     the sums recorded for these slots (a list, or an index on the
                                             device)
        move(src_tier, src_slots, dst_tier, dst_slots)   a transfer copies its blocks' checksums
        expected(places) -> [n, 2, L, 2]     the sums recorded for blocks read from places[i] = (tier,
                                             slot), on the device (no host synchronisation)

What is checksummed: each (side, layer) piece of a block — its packed bytes, then its norms — one pair of sums
per piece. A load's decode reads exactly one piece per program, so it verifies the piece in the same pass,
before it writes a byte of it (kernels.tq_dequantize_layers with verify): no separate pass over the loaded
bytes. A block is still the unit of a load and of a miss: one changed piece refuses its whole block. The
tables live on the device (DRAM slots' sums too: 32 bytes a layer and slot, 0.125 % of a K8V4 block at 8
KV heads × d128), so a store and a move never wait for the device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from tiercache.kernels import fold_pieces, piece_checksums, piece_checksums_host
from tiercache.layout import BlockLayout
from tiercache.worker.pools import KVBlocks


def groups_of(blocks: KVBlocks) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
    return (blocks.k_packed, blocks.k_norms), (blocks.v_packed, blocks.v_norms)


def checksums_of(blocks: KVBlocks, ids: torch.Tensor | None = None) -> torch.Tensor:
    """[n, 2, L, 2] int64: the Triton kernel on CUDA, piece_checksums_host elsewhere (the same bits)."""
    if blocks.k_packed.device.type == "cuda":
        return piece_checksums(groups_of(blocks), ids)
    return piece_checksums_host(groups_of(blocks), ids)


def block_checksum(sums: torch.Tensor, layout: BlockLayout) -> torch.Tensor:
    """[n, 2, L, 2] piece sums of blocks in this layout → [n, 2] int64 on the host."""
    return fold_pieces(sums, layout.piece_words)


def slot_checksum_bytes(num_layers: int) -> int:
    return 2 * num_layers * 2 * 8  # (S1, S2) int64 per side and layer


class SlotChecksums:
    def __init__(self, capacities: Mapping[str, int], device: torch.device | str, num_layers: int) -> None:
        self.device = torch.device(device)
        self._sums = {
            tier: torch.zeros(n, 2, num_layers, 2, dtype=torch.int64, device=self.device)
            for tier, n in capacities.items()
        }  # [slots, 2, L, 2] int64 per tier: (S1, S2) of each piece of the bytes last written to each slot

    def record(self, tier: str, slots: Sequence[int], sums: torch.Tensor) -> None:
        self._sums[tier].index_copy_(0, self._index(slots), sums.to(self.device))

    def get(self, tier: str, slots: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """[n, 2, L, 2] int64 on the device: the sums recorded for these slots (a list, or an int64 index
        already on the device, as a pool's slot_index gives)."""
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
        shape = next(iter(self._sums.values())).shape[1:]
        expected = torch.empty(len(places), *shape, dtype=torch.int64, device=self.device)
        for tier in tiers:
            at = [i for i, (t, _) in enumerate(places) if t == tier]
            slots = self._sums[tier].index_select(0, self._index([places[i][1] for i in at]))
            expected.index_copy_(0, self._index(at), slots)
        return expected

    def _index(self, slots: Sequence[int] | torch.Tensor) -> torch.Tensor:
        if isinstance(slots, torch.Tensor):  # a pool's slot index: on the device already (then no copy)
            return slots.to(self.device, torch.int64, non_blocking=True)
        idx = torch.as_tensor(slots, dtype=torch.int64)
        if self.device.type == "cuda":
            idx = idx.pin_memory().to(self.device, non_blocking=True)
        return idx
