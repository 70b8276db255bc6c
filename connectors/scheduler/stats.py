"""The scheduler side's contribution to vLLM's connector stats: tiercache's cumulative counters and gauges.

Provides:
    StatsTap(state, manager)
        take() -> dict            {"totals": {name: count since start}, "gauges": {name: value}}, every step

Totals, not increments, and every step, also when nothing moved: vLLM 0.26's offline engine (LLMEngine.step)
drops the stats of a step that produced no request output (a chunked prefill's first steps, a step that
only loads a request's blocks under asynchronous scheduling; 0.32 records them), so the totals of the step
where a counter moved may never be recorded; the next step's, which carry them again, are.
connectors/metrics.py turns totals back into counter increments, per engine. Counters come from the
InspectionState (one counting core for inspection and metrics: hits_vram, misses, tokens_loaded,
io_store_bytes, evicted_spill_by_graph, failures_no_room, …); gauges are each tier's used and total slots
(the disk tier's: files, and the files tiers.disk.size holds). Called on the scheduler thread (vLLM's
Scheduler.update_from_output → connector.get_kv_connector_stats), the thread that feeds the state.
"""

from __future__ import annotations

from typing import Any

from tiercache.inspect import InspectionState


class StatsTap:
    def __init__(self, state: InspectionState, manager) -> None:
        self.state = state
        self.manager = manager
        self._last: dict[str, int] | None = None
        self._gauges: dict[str, int] = {}

    def take(self) -> dict[str, Any]:
        """The totals; the gauges are read again only when a counter moved (a slot is taken or freed only by
        a counted event)."""
        now = {k: v for k, v in self.state.counters.items() if v and k != "events"}
        if now != self._last:
            self._last, self._gauges = now, self._read_gauges()
        return {"totals": dict(now), "gauges": dict(self._gauges)}

    def _read_gauges(self) -> dict[str, int]:
        gauges = {}
        for tier in self.manager.view().tiers():
            gauges[f"used_blocks_{tier.name}"] = tier.used_slots
            gauges[f"capacity_blocks_{tier.name}"] = tier.capacity_blocks
        disk = self.manager.stats()
        if "disk_capacity" in disk:
            gauges["used_blocks_disk"] = disk["disk_blocks"]
            gauges["capacity_blocks_disk"] = disk["disk_capacity"]
        return gauges
