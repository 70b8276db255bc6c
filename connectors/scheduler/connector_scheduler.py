"""Scheduler side of the connector: owns the TierManager (and its eviction policy) and turns its decisions
into one StepPlan per engine step (DESIGN.md decision 1: the scheduler decides, workers execute).

Provides:
    ConnectorScheduler(config, geometry, world_size=1, model="")   model: the remote tier's namespace
        num_matched_tokens(request, num_computed_tokens) -> int | None   longest ready prefix (no events),
                                                                  extended by the blocks the remote store
                                                                  holds next (None: still asking it)
        after_alloc(request, block_ids, num_external_tokens)      pins the hit blocks, queues their loads
                                                                  (remote hits: a DRAM slot each, fetched
                                                                  by the workers before the load)
        refuse_loads(request, block_ids, num_external_tokens)     fallback: queue them refused instead
        build_plan(scheduler_output) -> StepPlan                  loads + stores of newly full blocks + jobs
        observe_step(plan)                                        policy hint: the plan's loads go together
        refuse_step(reason) -> StepPlan / release_refused_step()  fallback when build_plan raised
        on_reports(reports)                                       completions → complete_store/load/transfer;
                                                                  copy timings and failure causes → inspection
        stats_update() -> dict                                    counters since start, occupancy, every
                                                                  step (vLLM's connector stats)
        request_finished(request_id), drain_events(), close()
        events                                                    recent TierEvents (bounded deque)
        inspection                                                InspectionState (tiercache.inspect), served
                                                                  on a Unix socket unless inspect.socket is
                                                                  "off"; every admission is recorded there
                                                                  (a RequestRecord) for explain_request
    caller_id(request_id) -> str | None                           (admission.py) the id the caller gave

One object, its verbs grouped by module: the state and its construction in core.py (SchedulerCore, whose
constructor this is), admission in admission.py, step plans and their fallback in steps.py, worker reports in
reports.py; stats, request end, events and close here.

Errors are not caught here: the connector (connectors/vllm.py) catches them where vLLM calls, and calls the
fallbacks above, which never leave a block in flight (steps.py and reports.py say how a failed plan, load or
report is undone).

The remote tier (tiers.remote): on a local miss, one batched existence call (bounded by tiers.remote.timeout;
the store down or slow answers "none"), made on a lookup thread while vLLM asks again each step
(remote_lookups.py), finds how many of the prompt's next blocks the store holds (rank 0's keys: a block
missing on another rank fails its fetch there, and so its load); those count as matched. The
manager reserves DRAM slots for them; the plan carries the fetches before the loads, and a fetch that fails
on any rank is a refused load (vLLM recomputes) whose reason the report carries. Blocks the manager drops
from DRAM go out as the plan's uploads (tiers.remote.write says which).
"""

from __future__ import annotations

from .admission import AdmissionVerbs, caller_id
from .reports import ReportVerbs
from .steps import StepVerbs

__all__ = ["ConnectorScheduler", "caller_id"]


class ConnectorScheduler(AdmissionVerbs, StepVerbs, ReportVerbs):
    def stats_update(self) -> dict:
        return self.stats.take()

    def request_finished(self, request_id: str) -> None:
        self.requests.finish(request_id)
        if self.remote_lookups is not None:
            self.remote_lookups.forget(request_id)

    def drain_events(self) -> None:
        """Take the manager's events into `events` and the inspection state, and publish (rate-limited)."""
        events = self.manager.take_events()
        self.events.extend(events)
        self.inspection.record(events)
        self.inspection.publish(self.manager.view())

    def close(self) -> None:
        self.drain_events()
        self.inspection.publish(self.manager.view(), force=True)
        if self.inspection_service is not None:
            self.inspection_service.close()
            self.inspection_service = None
        self.manager.close()
        if self.remote is not None:
            self.remote_lookups.close()
            self.remote.close()
