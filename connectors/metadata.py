"""vLLM's connector metadata, carrying our wire values as bytes: the one encode and the one decode of each
StepPlan and WorkerReport happen here, at the process boundary (vLLM moves these objects between processes).

Provides:
    TierCacheMetadata.of(plan)          scheduler → workers, one per engine step; .plan() decodes (cached:
                                        both worker hooks of a step read the same decoded plan)
    TierCacheWorkerMeta.of(report)      one rank → scheduler; aggregate() (vLLM calls it over the ranks of a
                                        step) concatenates the encoded reports; .reports() decodes them
"""

from __future__ import annotations

from tiercache.wire import StepPlan, WorkerReport, decode, encode

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


class TierCacheMetadata(KVConnectorMetadata):
    def __init__(self, data: bytes) -> None:
        self.data = data  # an encoded StepPlan
        self._plan: StepPlan | None = None

    @classmethod
    def of(cls, plan: StepPlan) -> TierCacheMetadata:
        return cls(encode(plan))

    def plan(self) -> StepPlan:
        if self._plan is None:
            self._plan = decode(self.data, StepPlan)
        return self._plan

    def __getstate__(self) -> dict:
        return {"data": self.data}  # the bytes travel, never a decoded copy

    def __setstate__(self, state: dict) -> None:
        self.data, self._plan = state["data"], None


class TierCacheWorkerMeta(KVConnectorWorkerMetadata):
    def __init__(self, data: tuple[bytes, ...]) -> None:
        self.data = data  # encoded WorkerReports, one per rank (and step) aggregated so far

    @classmethod
    def of(cls, report: WorkerReport) -> TierCacheWorkerMeta:
        return cls((encode(report),))

    def aggregate(self, other: KVConnectorWorkerMetadata) -> TierCacheWorkerMeta:
        if not isinstance(other, TierCacheWorkerMeta):
            raise TypeError(f"cannot aggregate TierCacheWorkerMeta with {type(other).__name__}")
        return TierCacheWorkerMeta(self.data + other.data)

    def reports(self) -> list[WorkerReport]:
        return [decode(data, WorkerReport) for data in self.data]
