"""The ConnectorScheduler's report verbs (vLLM's update_connector_output): every rank's WorkerReport turned
into the manager's completions, copy timings and failure causes into inspection. A mixin of SchedulerCore
(core.py); ConnectorScheduler (connector_scheduler.py) combines it with the others.

Provides:
    ReportVerbs
        on_reports(reports)     completions → complete_store/load/fetch/disk_read/transfer; a step
                                completes once world_size ranks reported it (a rank whose loads waited
                                for reads reports that step later than the others), a store or load ok
                                only if it is ok on every rank; a job completes once world_size ranks
                                reported it

A request that computed over a block whose load failed (on any rank) computed wrong KV: its stores of that
step, and of the steps planned before the failure was reported, are aborted (vLLM recomputes those blocks and
they are stored then). A worker report that does not match its step counts that step's items as failed.
"""

from __future__ import annotations

from collections.abc import Sequence

from tiercache.scheduler.events import cause_of
from tiercache.wire import WorkerReport

from .core import SchedulerCore, StepRecord, logger


class ReportVerbs(SchedulerCore):
    def on_reports(self, reports: Sequence[WorkerReport]) -> None:
        """Every rank's report of one engine step: a step's stores and loads complete once world_size ranks
        reported it, each ok only if it is ok on every rank; a job completes once world_size ranks reported
        it. Copies count their bytes and seconds on every rank and their blocks once (rank 0's), so block
        counts do not grow with the rank count."""
        complete = []
        for report in reports:
            for reason in report.errors:
                logger.warning("tiercache: worker: %s", reason)
            counted = report.rank == 0
            if counted and report.remote:  # every rank writes its shard of the same blocks: count once
                self.inspection.record_remote(**{c.event: c.blocks for c in report.remote})
            if counted and report.disk:  # bytes: every rank's files, a block's file each
                counts = {c.event: c.blocks for c in report.disk}
                written = counts.get("written", 0) * self.disk_file_bytes * self.world_size
                self.inspection.record_disk(**counts, written_bytes=written)
            for sample in report.io:
                blocks = sample.blocks if counted else 0
                self.inspection.record_io(sample.direction, blocks, sample.bytes, sample.seconds)
            for result in report.steps:
                record = self._in_flight.get(result.step)
                if record is None:
                    logger.warning("tiercache: worker report for unknown step %s ignored", result.step)
                    continue
                stores = _aligned(result.stores_ok, len(record.stores), result.step, "store")
                loads = _aligned(result.loads_ok, len(record.loads), result.step, "load")
                why = {f.index: f.reason for f in result.load_failures}
                seen = self._step_reports.setdefault(result.step, [0, stores, loads, {}])
                seen[0] += 1
                seen[1] = [a and b for a, b in zip(seen[1], stores, strict=True)]
                seen[2] = [a and b for a, b in zip(seen[2], loads, strict=True)]
                seen[3] = {**why, **seen[3]}
                if seen[0] >= self.world_size:
                    complete.append(result.step)
        for step in sorted(complete):
            _, stores_ok, loads_ok, why = self._step_reports.pop(step)
            self._complete_step(step, self._in_flight.pop(step), stores_ok, loads_ok, why)
        for report in reports:
            for job in report.jobs:
                kind = self._job_kinds.get(job.job_id)
                if kind is not None and job.ok:
                    blocks = job.blocks if report.rank == 0 else 0
                    self.inspection.record_io(kind, blocks, job.bytes, job.seconds)
                seen = self._job_reports.setdefault(job.job_id, [0, True])
                seen[0] += 1
                seen[1] = seen[1] and job.ok
                if seen[0] >= self.world_size:
                    del self._job_reports[job.job_id]
                    self._job_kinds.pop(job.job_id, None)
                    self.manager.complete_transfer(job.job_id, seen[1])

    def _complete_step(
        self, step: int, record: StepRecord, stores_ok: list[bool], loads_ok: list[bool], why: dict[int, str]
    ) -> None:
        """why: load index → the reason a rank gave for refusing it (a failed load without one failed on
        the worker: load_failed)."""
        failed = {block_id for (_, _, block_id), ok in zip(record.loads, loads_ok, strict=True) if not ok}
        if failed:
            self._taint(step, record, failed)
            self.requests.loads_failed(failed)
        for (block_hash, req_id), ok in zip(record.stores, stores_ok, strict=True):
            if ok and req_id in record.tainted:
                reason = f"store aborted: request {req_id} computed it over a block whose load failed"
                self.manager.abort_store([block_hash], reason)
                ok = False
            else:
                self.manager.complete_store([block_hash], ok)
            self.counters["stored_blocks" if ok else "store_failures"] += 1
        for i, ((block_hash, pinned, _), ok) in enumerate(zip(record.loads, loads_ok, strict=True)):
            reason = "" if ok else why.get(i, "the load failed on a worker")
            if pinned and block_hash in record.fetched:
                self.manager.complete_fetch([block_hash], ok, reason)
                self.inspection.record_remote(**{"fetched" if ok else "fetch_failures": 1})
            elif pinned and block_hash in record.disk_read:  # a failed one's file is forgotten (deleted)
                self.manager.complete_disk_read([block_hash], ok, reason)
                if ok:
                    self.inspection.record_disk(read=1, read_bytes=self.disk_file_bytes * self.world_size)
                else:
                    self.inspection.record_disk(read_failures=1)
            elif pinned:  # refused loads were never pinned: nothing to complete
                self.manager.complete_load([block_hash], ok, reason)
            self.counters["loaded_blocks" if ok else "load_failures"] += 1
            if not ok:
                self.inspection.record_failure(cause_of(reason))

    def _taint(self, step: int, record: StepRecord, failed_block_ids: set[int]) -> None:
        """The requests whose vLLM blocks include a block that failed to load in `step` attended over it in
        that step, and in any step planned before now: their stores there are not to be kept."""
        later = [r for s, r in self._in_flight.items() if s > step]
        tainted = set()
        for req_id in {req_id for r in (record, *later) for _, req_id in r.stores}:
            state = self.requests.get(req_id)
            if state is not None and failed_block_ids.intersection(state.block_ids):
                tainted.add(req_id)
        for r in (record, *later):
            r.tainted |= tainted


def _aligned(oks: Sequence[bool], n: int, step: int, what: str) -> list[bool]:
    """A worker report that does not match its step's plan is not trusted: every item counts as failed
    (the manager still completes each one, so nothing stays in flight)."""
    if len(oks) == n:
        return [bool(ok) for ok in oks]
    logger.error(
        "tiercache: step %d: workers reported %d %s results for %d %ss; all count as failed",
        step, len(oks), what, n, what,
    )  # fmt: skip
    return [False] * n
