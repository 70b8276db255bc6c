"""The scheduler side's contribution to vLLM's connector stats: what changed since vLLM last asked.

Provides:
    StatsTap(state, manager)
        take() -> dict | None     {"counters": {name: increase}, "gauges": {name: value}} since the last
                                  take, or None when no counter moved (vLLM then skips the interval)

Counters are read from the InspectionState's cumulative counters (one counting core for inspection and
metrics: hits_vram, misses, tokens_loaded, io_store_bytes, evicted_spill_by_graph, failures_no_room, …);
gauges are each tier's used and total slots. Called on the scheduler thread (vLLM's
Scheduler.update_from_output → connector.get_kv_connector_stats), the thread that feeds the state.
"""

from __future__ import annotations

from typing import Any

from tiercache.inspect import InspectionState


class StatsTap:
    def __init__(self, state: InspectionState, manager) -> None:
        self.state = state
        self.manager = manager
        self._last: dict[str, int] = {}

    def take(self) -> dict[str, Any] | None:
        now = self.state.counters
        last = self._last
        delta = {k: v - last.get(k, 0) for k, v in now.items() if v != last.get(k, 0)}
        delta.pop("events", None)
        if not delta:
            return None
        self._last = dict(now)
        gauges = {}
        for tier in self.manager.view().tiers():
            gauges[f"used_blocks_{tier.name}"] = tier.used_slots
            gauges[f"capacity_blocks_{tier.name}"] = tier.capacity_blocks
        return {"counters": delta, "gauges": gauges}
