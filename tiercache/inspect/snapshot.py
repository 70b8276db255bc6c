"""The plain data the inspection service answers from, shared by the engine's state and the service's mirror.

Provides:
    Snapshot        frozen; what InspectionState.publish builds and the mirror rebuilds: never mutated after
                    publication; age_of(clock_time) turns a time on the manager's clock into seconds ago
    BlockRow        a BlockView as the service process holds it (views.py, which defines BlockView, imports
                    the allocators and torch: the service process does not)
    BLOCK_FIELDS    BlockRow's field names, in order
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tiercache.scheduler.events import TierEvent
    from tiercache.scheduler.views import BlockView


@dataclass(frozen=True)
class Snapshot:
    version: int
    wall_time: float  # time.time() at publication
    clock_time: float  # the manager's clock at publication (events carry times on this clock)
    pid: int
    started_wall: float
    policy: str
    codec_id: str
    manager_stats: Mapping[str, int]
    counters: Mapping[str, int]
    tiers: tuple[Mapping[str, Any], ...]
    decisions: tuple[TierEvent, ...]  # oldest first
    blocks: Mapping[str, tuple[BlockView | BlockRow, ...]]  # per tier, most recently used first (BlockRow:
    # in the service process's mirror)
    ttft: Mapping[str, Mapping[str, float] | None]  # "hit" / "miss" → count, mean_s, p50_s, p90_s

    def age_of(self, clock_time: float) -> float:
        """Seconds between a time on the manager's clock and now (wall)."""
        return (self.clock_time - clock_time) + (time.time() - self.wall_time)


@dataclass(frozen=True, slots=True)
class BlockRow:
    """BlockView's fields, in its order (a test keeps them equal)."""

    block_hash: bytes
    tier: str
    slot: int
    hits: int
    stored_at: float  # on the manager's clock
    last_access: float
    ready: bool
    loads_in_flight: int
    moving: bool
    evictable: bool


BLOCK_FIELDS = tuple(f.name for f in dataclasses.fields(BlockRow))
