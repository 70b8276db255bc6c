"""The scheduler side's contribution to vLLM's connector stats: tiercache's cumulative counters and gauges.

Provides:
    StatsTap(state, manager)
        take() -> dict | None     {"totals": {name: count since start}, "gauges": {name: value}}, or None
                                  when no counter moved since the last take (vLLM then skips the step)

Totals, not increments: vLLM 0.26's offline engine (LLMEngine.step) drops the stats of a step that produced
no request output (a chunked prefill's first steps; 0.32 records them), and a lost increment would be lost
for good, while the next totals still carry it. connectors/metrics.py turns totals back into counter
increments, per engine. Counters come from the InspectionState (one counting core for inspection and
metrics: hits_vram, misses, tokens_loaded, io_store_bytes, evicted_spill_by_graph, failures_no_room, …);
gauges are each tier's used and total slots (the disk tier's: files, and the files tiers.disk.size
holds). Called on the scheduler thread (vLLM's
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
        now = {k: v for k, v in self.state.counters.items() if v and k != "events"}
        if now == self._last:
            return None
        self._last = now
        gauges = {}
        for tier in self.manager.view().tiers():
            gauges[f"used_blocks_{tier.name}"] = tier.used_slots
            gauges[f"capacity_blocks_{tier.name}"] = tier.capacity_blocks
        disk = self.manager.stats()
        if "disk_capacity" in disk:
            gauges["used_blocks_disk"] = disk["disk_blocks"]
            gauges["capacity_blocks_disk"] = disk["disk_capacity"]
        return {"totals": dict(now), "gauges": gauges}
