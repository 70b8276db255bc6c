"""Connector metadata: plain data both ways (lists of ints, bytes, strings and bools; msgpack-able).

Provides:
    TierCacheMetadata(step, loads, stores, jobs)     scheduler → workers, one per engine step
        loads:  [[block_hash, tier, slot, vllm_block_id], …]   tier "" = refused by the manager: the
                worker reports the block as a load error (vLLM recomputes it)
        stores: [[block_hash, tier, slot, vllm_block_id], …]   encode vLLM's block into (tier, slot)
        jobs:   [TransferJob.to_dict(), …]                      spills and warms
    TierCacheWorkerMeta(steps, jobs, errors)         workers → scheduler, aggregated over ranks
        steps:  [[step, stores_ok [bool…], loads_ok [bool…]], …]   aligned with that step's metadata
        jobs:   [[job_id, ok], …]   one entry per rank that finished the job (the scheduler counts them)
        errors: [reason, …]         what went wrong, for the scheduler's log
    .to_dict() / .from_dict() on both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (
        KVConnectorMetadata,
        KVConnectorWorkerMetadata,
    )
except (
    ImportError
):  # the worker code path also runs without vLLM (benchmarks/connector_io.py on a bare GPU box)

    class KVConnectorMetadata:  # type: ignore[no-redef]
        pass

    class KVConnectorWorkerMetadata:  # type: ignore[no-redef]
        pass


@dataclass
class TierCacheMetadata(KVConnectorMetadata):
    step: int = 0
    loads: list[list] = field(default_factory=list)
    stores: list[list] = field(default_factory=list)
    jobs: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "loads": self.loads, "stores": self.stores, "jobs": self.jobs}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TierCacheMetadata:
        return cls(int(data["step"]), [list(x) for x in data["loads"]], [list(x) for x in data["stores"]],
                   [dict(j) for j in data["jobs"]])  # fmt: skip


@dataclass
class TierCacheWorkerMeta(KVConnectorWorkerMetadata):
    steps: list[list] = field(default_factory=list)
    jobs: list[list] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def aggregate(self, other: KVConnectorWorkerMetadata) -> TierCacheWorkerMeta:
        """Combine two ranks' reports: a store or load is ok only if it is ok on every rank."""
        assert isinstance(other, TierCacheWorkerMeta), type(other)
        steps = {s[0]: [s[0], list(s[1]), list(s[2])] for s in self.steps}
        for step, stores_ok, loads_ok in other.steps:
            if step not in steps:
                steps[step] = [step, list(stores_ok), list(loads_ok)]
                continue
            mine = steps[step]
            mine[1] = [a and b for a, b in zip(mine[1], stores_ok, strict=True)]
            mine[2] = [a and b for a, b in zip(mine[2], loads_ok, strict=True)]
        return TierCacheWorkerMeta(list(steps.values()), self.jobs + other.jobs, self.errors + other.errors)

    def to_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "jobs": self.jobs, "errors": self.errors}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TierCacheWorkerMeta:
        return cls([list(s) for s in data["steps"]], [list(j) for j in data["jobs"]], list(data["errors"]))
