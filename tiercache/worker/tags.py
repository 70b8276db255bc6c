"""What each slot of this rank's pools holds: the block last written there and the codec that encoded it,
checked before a load or a move reads the slot. A tag is written from the plan that wrote the bytes (a
StoreItem, or a finished TransferJob), never derived from anything else, and cleared before new bytes arrive.
The checksums of the slots' bytes live next to the pools, on the device (integrity.SlotChecksums).

Provides:
    SlotTags(capacities)                            {tier: slots}
        clear(tier, slots)                          bytes are about to change (a store or a move destination)
        set(tier, slots, hashes, codec_id)          these slots now hold these blocks, encoded with codec_id
                                                    (both: IndexError, and no tag changed, when a slot is
                                                    outside [0, slots): a negative one would wrap around
                                                    to another slot's tag)
        out_of_range(tier, slots) -> str | None     why not every slot is one of the tier's; None: all are
        check(tier, slots) -> list[int]             the slots, or that IndexError
        tag(tier, slot) -> (hash, codec id) | None
        refusal(tier, slot, block_hash, codec_id) -> str | None   why the slot cannot be read as that block
        holds(tier, slots, hashes, codec_id) -> list[bool]   per slot, whether refusal would be None (one
                                                    pass over a batch: a load's check)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from tiercache.errors import shown


class SlotTags:
    def __init__(self, capacities: Mapping[str, int]) -> None:
        self._tags: dict[str, list[tuple[bytes, str] | None]] = {t: [None] * n for t, n in capacities.items()}

    def clear(self, tier: str, slots: Iterable[int]) -> None:
        tags = self._tags[tier]
        for slot in self.check(tier, slots):
            tags[slot] = None

    def set(self, tier: str, slots: Iterable[int], hashes: Iterable[bytes], codec_id: str) -> None:
        tags = self._tags[tier]
        for slot, block_hash in zip(self.check(tier, slots), hashes, strict=True):
            tags[slot] = (block_hash, codec_id)

    def out_of_range(self, tier: str, slots: Iterable[int]) -> str | None:
        size = len(self._tags[tier])
        bad = [slot for slot in slots if not 0 <= slot < size]
        if not bad:
            return None
        return (
            f"{tier} slots {shown(bad, 60)} are out of range [0, {size}) (a negative slot would wrap "
            f"around to another slot); a plan's slots are this rank's {tier} pool indices"
        )

    def check(self, tier: str, slots: Iterable[int]) -> list[int]:
        slots = list(slots)
        wrong = self.out_of_range(tier, slots)
        if wrong is not None:
            raise IndexError(f"{wrong}: refused before any tag, checksum or byte changed")
        return slots

    def tag(self, tier: str, slot: int) -> tuple[bytes, str] | None:
        return self._tags[tier][slot]

    def holds(self, tier: str, slots: Sequence[int], hashes: Sequence[bytes], codec_id: str) -> list[bool]:
        tags, size = self._tags[tier], len(self._tags[tier])
        return [0 <= s < size and tags[s] == (h, codec_id) for s, h in zip(slots, hashes, strict=True)]

    def refusal(self, tier: str, slot: int, block_hash: bytes, codec_id: str) -> str | None:
        tags = self._tags[tier]
        if not 0 <= slot < len(tags):
            return f"{tier} slot {slot} is out of range [0, {len(tags)})"
        held = tags[slot]
        if held is None:
            return f"hash mismatch: {tier} slot {slot} holds no block"
        if held[0] != block_hash:
            return f"hash mismatch: {tier} slot {slot} holds block {held[0].hex()[:16]}"
        if held[1] != codec_id:
            return f"codec mismatch: {tier} slot {slot} holds {held[1]}, this worker uses {codec_id}"
        return None
