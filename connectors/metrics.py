"""tiercache's metrics in vLLM's own metrics path: the connector stats vLLM collects from the scheduler every
step, logs in its periodic "KV Transfer metrics" line and exports to Prometheus (vLLM 0.26, 0.32, 0.33:
KVConnectorBase_V1.get_kv_connector_stats / build_kv_connector_stats / build_prom_metrics).

Provides:
    TierCacheStats(data)          KVConnectorStats over {"totals": {name: count since start}, "gauges":
                                  {name: value}} (connectors/scheduler/stats.py makes it, and says why
                                  totals): aggregate() keeps the newest, reduce() is the log line (totals
                                  since start, GB/s since start)
    TierCachePromMetrics(...)     KVConnectorPromMetrics: the Prometheus metrics below, per engine; a
                                  counter grows by the increase of its total since the last observe
    METRICS                       name → help text of every metric exported

Prometheus names (counters end in _total when exported):
    vllm:tiercache_hit_blocks{tier}             blocks a lookup found ready, per tier (disk: blocks an
                                                admission found on the disk tier and read)
    vllm:tiercache_lookup_misses                lookups that stopped at a block tiercache could not serve
    vllm:tiercache_tokens_loaded / _recomputed  prompt tokens loaded from the tiers / computed by vLLM
    vllm:tiercache_stored_blocks                blocks stored
    vllm:tiercache_transfer_{blocks,bytes,seconds}{direction}   load, store (vLLM's cache ↔ tiers),
                                                spill, warm (VRAM ↔ DRAM); blocks counted once (rank
                                                0's copies), bytes in the tiers' format summed over ranks,
                                                seconds per rank, summed
    vllm:tiercache_transfer_gbps{direction}     bytes / seconds since start, per rank (a copy's seconds may
                                                reach the scheduler a step after its bytes)
    vllm:tiercache_evictions{policy,action}     victims by the policy that chose them; action spill | drop
    vllm:tiercache_declined_blocks{policy}      new blocks not stored: the policy's admission control
                                                predicted they would be evicted before their next use
    vllm:tiercache_failures{cause}              loads, stores and moves that did not happen, by cause
                                                (tiercache.scheduler.events.CAUSES)
    vllm:tiercache_remote_blocks{event}         the remote tier: lookups (blocks asked), found, fetched
                                                (served), fetch_failures (refused loads), uploads
                                                (planned writes of blocks dropped from DRAM), written,
                                                already_stored (not written again), dropped_full (write
                                                queue full), write_failures,
                                                bad_values / bad_macs / vanished (values refused: one
                                                block each)
    vllm:tiercache_disk_blocks{event}           the disk tier: read (served), read_failures (refused
                                                loads: missing, truncated, corrupted files), writes
                                                (planned), drops (files deleted), written, already_stored,
                                                dropped_full, write_failures (disk full, I/O errors),
                                                bad_values / vanished (files refused: one block each)
    vllm:tiercache_used_blocks{tier} / _capacity_blocks{tier} / _occupancy{tier}   gauges (tier disk:
                                                files, and the files tiers.disk.size holds)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)

from tiercache.wire import DISK, TIERS, TRANSFER_DIRECTIONS

METRICS = {
    "hit_blocks": "Blocks a tiercache lookup found ready, by tier.",
    "lookup_misses": "tiercache lookups that stopped at a block it could not serve.",
    "tokens_loaded": "Prompt tokens loaded from tiercache's tiers.",
    "tokens_recomputed": "Prompt tokens vLLM computed (in neither vLLM's prefix cache nor tiercache).",
    "stored_blocks": "Blocks stored into tiercache's tiers.",
    "transfer_blocks": "Blocks copied by tiercache, by direction (load, store, spill, warm), counted once.",
    "transfer_bytes": "Bytes (tiercache's format) copied, by direction, summed over ranks.",
    "transfer_seconds": "Seconds spent copying, by direction, summed over ranks.",
    "transfer_gbps": "GB/s per rank since start (transfer_bytes / transfer_seconds), by direction.",
    "evictions": "Blocks evicted, by the policy that chose them and the action (spill, drop).",
    "declined_blocks": "New blocks not stored by the policy's admission control, by policy.",
    "failures": "Loads, stores and moves that did not happen, by cause.",
    "remote_blocks": (
        "Remote tier blocks by event (lookups, found, fetched, fetch_failures, uploads, written, "
        "already_stored, dropped_full, write_failures, bad_values, bad_macs, vanished)."
    ),
    "disk_blocks": (
        "Disk tier blocks by event (read, read_failures, writes, drops, written, already_stored, "
        "dropped_full, write_failures, bad_values, vanished)."
    ),
    "used_blocks": "Slots in use (stored, or reserved by a store or move in flight), by tier.",
    "capacity_blocks": "Slots of each tier.",
    "occupancy": "used_blocks / capacity_blocks, by tier.",
}
_GAUGES = ("transfer_gbps", "used_blocks", "capacity_blocks", "occupancy")
_EXTRA_LABELS = {
    "hit_blocks": ["tier"],
    "transfer_blocks": ["direction"],
    "transfer_bytes": ["direction"],
    "transfer_seconds": ["direction"],
    "transfer_gbps": ["direction"],
    "evictions": ["policy", "action"],
    "declined_blocks": ["policy"],
    "failures": ["cause"],
    "remote_blocks": ["event"],
    "disk_blocks": ["event"],
    "used_blocks": ["tier"],
    "capacity_blocks": ["tier"],
    "occupancy": ["tier"],
}
_PLAIN = {"misses": "lookup_misses", "tokens_loaded": "tokens_loaded",
          "tokens_recomputed": "tokens_recomputed", "stores": "stored_blocks"}  # fmt: skip
_IO = {"blocks": "transfer_blocks", "bytes": "transfer_bytes", "us": "transfer_seconds"}


@dataclass
class TierCacheStats(KVConnectorStats):
    def __post_init__(self) -> None:
        self.data = {
            "totals": dict(self.data.get("totals", {})),
            "gauges": dict(self.data.get("gauges", {})),
        }

    def reset(self) -> None:
        self.data = {"totals": {}, "gauges": {}}

    def is_empty(self) -> bool:
        return not self.data["totals"]

    def aggregate(self, other: KVConnectorStats) -> TierCacheStats:
        """Totals only grow: the larger of each (a restarted engine's smaller totals wait for the next
        interval); the other's gauges (newer)."""
        if not isinstance(other, TierCacheStats):
            raise TypeError(f"cannot aggregate TierCacheStats with {type(other).__name__}")
        totals = self.data["totals"]
        for key, value in other.data["totals"].items():
            totals[key] = max(totals.get(key, 0), value)
        self.data["gauges"].update(other.data["gauges"])
        return self

    def reduce(self) -> dict[str, int | float]:
        """The log line, since start: hits per tier, tokens by source, GB and GB/s per direction, evictions,
        declines, failures; and each tier's use now."""
        c, g = self.data["totals"], self.data["gauges"]
        out: dict[str, int | float] = {f"tiercache_hits_{t}": c.get("hits_" + t, 0) for t in TIERS}
        out["tiercache_misses"] = c.get("misses", 0)
        out["tiercache_tokens_loaded"] = c.get("tokens_loaded", 0)
        out["tiercache_tokens_recomputed"] = c.get("tokens_recomputed", 0)
        for d in TRANSFER_DIRECTIONS:
            nbytes, us = c.get(f"io_{d}_bytes", 0), c.get(f"io_{d}_us", 0)
            if nbytes:
                out[f"tiercache_{d}_GB"] = round(nbytes / 1e9, 4)
                if us:
                    out[f"tiercache_{d}_GBps"] = round(nbytes / us / 1e3, 2)
        out["tiercache_evictions"] = sum(v for k, v in c.items() if k.startswith("evicted_"))
        out["tiercache_declined"] = sum(v for k, v in c.items() if k.startswith("declined_by_"))
        out["tiercache_failures"] = sum(v for k, v in c.items() if k.startswith("failures_"))
        for event in ("fetched", "fetch_failures", "uploads", "written", "already_stored", "dropped_full",
                      "write_failures", "bad_values", "bad_macs", "vanished"):  # fmt: skip
            if "remote_" + event in c:
                out["tiercache_remote_" + event] = c["remote_" + event]
        for event in ("hits", "read", "read_failures", "written", "dropped_full", "write_failures"):
            if "disk_" + event in c:
                out["tiercache_disk_" + event] = c["disk_" + event]
        for t in (*TIERS, DISK):
            capacity = g.get("capacity_blocks_" + t, 0)
            if capacity:
                out[f"tiercache_{t}_used_pct"] = round(100 * g.get("used_blocks_" + t, 0) / capacity, 1)
        return out


class TierCachePromMetrics(KVConnectorPromMetrics):
    def __init__(self, vllm_config, metric_types, labelnames: list[str], per_engine_labelvalues) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._metrics: dict[str, Any] = {}
        self._seen: dict[int, dict[str, int]] = {}  # engine → the totals last observed
        for name, doc in METRICS.items():
            labels = [*labelnames, *_EXTRA_LABELS.get(name, [])]
            full = "vllm:tiercache_" + name
            if name in _GAUGES:
                metric = self._gauge_cls(name=full, documentation=doc, labelnames=labels,
                                         multiprocess_mode="mostrecent")  # fmt: skip
            else:
                metric = self._counter_cls(name=full, documentation=doc, labelnames=labels)
            self._metrics[name] = metric

    def _child(self, name: str, engine_idx: int, *extra: str):
        return self._metrics[name].labels(*self.per_engine_labelvalues[engine_idx], *extra)

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        totals = transfer_stats_data.get("totals", {})
        gauges = transfer_stats_data.get("gauges", {})
        seen = self._seen.setdefault(engine_idx, {})
        for key, total in totals.items():
            labelled = _counter_of(key)
            before = seen.get(key, 0)
            seen[key] = total
            increase = total - before if total >= before else total  # smaller: the engine restarted
            if labelled is not None and increase > 0:
                name, extra, scale = labelled
                self._child(name, engine_idx, *extra).inc(increase * scale)
        for d in TRANSFER_DIRECTIONS:
            nbytes, us = totals.get(f"io_{d}_bytes", 0), totals.get(f"io_{d}_us", 0)
            if nbytes and us:
                self._child("transfer_gbps", engine_idx, d).set(nbytes / us / 1e3)
        for t in (*TIERS, DISK):
            if "capacity_blocks_" + t not in gauges:
                continue
            used, capacity = gauges.get("used_blocks_" + t, 0), gauges["capacity_blocks_" + t]
            self._child("used_blocks", engine_idx, t).set(used)
            self._child("capacity_blocks", engine_idx, t).set(capacity)
            self._child("occupancy", engine_idx, t).set(used / capacity if capacity else 0.0)


def _counter_of(key: str) -> tuple[str, tuple[str, ...], float] | None:
    """The Prometheus counter (name, extra label values, scale) an InspectionState counter feeds, or None."""
    if key in _PLAIN:
        return _PLAIN[key], (), 1
    if key.startswith("hits_"):
        return "hit_blocks", (key[5:],), 1
    if key.startswith("io_"):
        direction, unit = key[3:].rsplit("_", 1)
        return _IO[unit], (direction,), 1e-6 if unit == "us" else 1
    if key.startswith("evicted_"):
        action, policy = key[8:].split("_by_", 1)
        return "evictions", (policy, action), 1
    if key.startswith("declined_by_"):
        return "declined_blocks", (key[12:],), 1
    if key.startswith("failures_"):
        return "failures", (key[9:],), 1
    if key.startswith("remote_"):
        return "remote_blocks", (key[7:],), 1
    if key == "disk_hits":
        return "hit_blocks", (DISK,), 1
    if key.startswith("disk_") and not key.endswith("_bytes"):  # bytes: inspection's only
        return "disk_blocks", (key[5:],), 1
    return None
