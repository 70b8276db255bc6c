"""Plain-data outputs of the scheduler-side manager, consumed by the worker side (all msgpack-able).

Provides:
    TransferJob          a spill (VRAM → DRAM) or warm (DRAM → VRAM): job id, source and destination slots
    PrepareStoreOutput   blocks to write and where: (tier, slot) per block
    PrepareLoadOutput    blocks to read and where each one lives now (tier, slot)
Each has to_dict() / from_dict(); dicts hold only ints, strings, bytes and lists.

Jobs of one step are independent of each other: every destination slot is freshly allocated and every
source stays owned until the worker reports completion, so the worker may run them in any order or overlap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tiercache.events import DRAM, VRAM

SPILL = "spill"
WARM = "warm"
_TIERS = {SPILL: (VRAM, DRAM), WARM: (DRAM, VRAM)}


@dataclass(frozen=True)
class TransferJob:
    job_id: int
    kind: str  # "spill" | "warm"
    src_slots: tuple[int, ...]
    dst_slots: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.kind not in _TIERS:
            raise ValueError(f"TransferJob kind must be 'spill' or 'warm', got {self.kind!r}")
        if len(self.src_slots) != len(self.dst_slots):
            raise ValueError(
                f"job {self.job_id}: {len(self.src_slots)} sources, {len(self.dst_slots)} destinations"
            )

    @property
    def src_tier(self) -> str:
        return _TIERS[self.kind][0]

    @property
    def dst_tier(self) -> str:
        return _TIERS[self.kind][1]

    def __len__(self) -> int:
        return len(self.src_slots)

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "kind": self.kind,
            "src": list(self.src_slots),
            "dst": list(self.dst_slots),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TransferJob:
        return cls(int(data["job_id"]), str(data["kind"]), tuple(data["src"]), tuple(data["dst"]))


@dataclass(frozen=True)
class PrepareStoreOutput:
    block_hashes: tuple[bytes, ...]  # new blocks to write, in the order asked
    tiers: tuple[str, ...]  # "vram" while VRAM has room, else "dram" (written straight to the cold tier)
    slots: tuple[int, ...]  # slot of each in its tier
    skipped: tuple[bytes, ...] = ()  # already stored (or asked twice): nothing to write
    not_stored: tuple[bytes, ...] = ()  # no room for these (the tail of the request's new blocks)

    def to_dict(self) -> dict[str, Any]:
        return {"block_hashes": list(self.block_hashes), "tiers": list(self.tiers), "slots": list(self.slots)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PrepareStoreOutput:
        return cls(tuple(data["block_hashes"]), tuple(data["tiers"]), tuple(data["slots"]))


@dataclass(frozen=True)
class PrepareLoadOutput:
    block_hashes: tuple[bytes, ...]
    tiers: tuple[str, ...]  # "vram" | "dram", per block: where to read it (a warm may be moving it)
    slots: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"block_hashes": list(self.block_hashes), "tiers": list(self.tiers), "slots": list(self.slots)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PrepareLoadOutput:
        return cls(tuple(data["block_hashes"]), tuple(data["tiers"]), tuple(data["slots"]))
