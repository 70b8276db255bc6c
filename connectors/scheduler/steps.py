"""The ConnectorScheduler's step verbs (vLLM's build_connector_meta): one StepPlan per engine step, and the
fallback when building it fails. A mixin of SchedulerCore (core.py); ConnectorScheduler
(connector_scheduler.py) combines it with the others.

Provides:
    StepVerbs
        build_plan(scheduler_output) -> StepPlan      loads + stores of newly full blocks + jobs, fetches and
                                                      uploads, disk writes, reads and drops; the step is kept
                                                      in flight until reported
        observe_step(plan)                            policy hint: the plan's loads go together
        refuse_step(reason) -> StepPlan               fallback when build_plan raised: loads refused
        release_refused_step()                        then frees what the refused step had reserved

Stores happen in the step where a block becomes full, so nothing is held at request end. A step whose plan
fails aborts the stores it prepared and refuses its queued loads (released: they stay good for later hits).
"""

from __future__ import annotations

from tiercache.wire import LoadItem, StepPlan, StoreItem, move_kind

from .core import RefusedStep, SchedulerCore, StepRecord, logger


class StepVerbs(SchedulerCore):
    def build_plan(self, scheduler_output) -> StepPlan:
        """This step's plan: the queued loads, stores of the blocks that become full, planned jobs."""
        step, self._step = self._step, self._step + 1
        self._building = (step, ())
        wanted = self.requests.newly_full(scheduler_output)
        stores: tuple[StoreItem, ...] = ()
        if wanted:
            out = self.manager.prepare_store(list(wanted))
            if out is not None:
                self._building = (step, out.block_hashes)
                placed = zip(out.block_hashes, out.tiers, out.slots, strict=True)
                stores = tuple(StoreItem(h, t, s, wanted[h][0]) for h, t, s in placed)
        jobs = tuple(self.manager.take_jobs())  # the last call that can fail
        for job in jobs:
            self._job_kinds[job.job_id] = move_kind(job.src_tier, job.dst_tier)
        loads, self._loads = tuple(self._loads), []
        fetches, self._fetches = tuple(self._fetches), []
        load_requests, self._load_requests = tuple(self._load_requests), []
        uploads = tuple(self.manager.take_uploads())
        self.inspection.record_remote(uploads=len(uploads))
        disk_writes, disk_drops = self.manager.take_disk_plan()
        disk_reads, self._disk_reads = tuple(self._disk_reads), []
        self.inspection.record_disk(writes=len(disk_writes), drops=len(disk_drops))
        self._building = None
        self._in_flight[step] = StepRecord(
            tuple((s.block_hash, wanted[s.block_hash][1]) for s in stores),
            tuple((x.block_hash, x.tier is not None, x.block_id) for x in loads),
            fetched=frozenset(f.block_hash for f in fetches),
            disk_read=frozenset(f.block_hash for f in disk_reads),
        )
        return StepPlan(
            step, loads, stores, jobs, uploads, fetches, tuple(disk_writes), disk_reads, tuple(disk_drops),
            load_requests,
        )  # fmt: skip

    def observe_step(self, plan: StepPlan) -> None:
        """Blocks loaded together in a step (the graph's co_attend edges); a hint, given after the plan."""
        if len(plan.loads) >= 2:
            self.manager.observe_step([x.block_hash for x in plan.loads])

    def refuse_step(self, reason: str) -> StepPlan:
        """The plan of a step whose build_plan raised: no stores or jobs (planned jobs go out with the next
        step), the queued loads refused (the workers report them as load errors, vLLM recomputes them). Only
        bookkeeping, no manager call; then release_refused_step() frees what the step had reserved."""
        step, reserved = self._building or (self._step, ())
        self._step = max(self._step, step + 1)
        self._building = None
        loads, self._loads = self._loads, []
        fetched, self._fetches = {f.block_hash for f in self._fetches}, []
        disk_read, self._disk_reads = {f.block_hash for f in self._disk_reads}, []
        load_requests, self._load_requests = tuple(self._load_requests), []
        self._in_flight[step] = StepRecord((), tuple((x.block_hash, False, x.block_id) for x in loads))
        filled = fetched | disk_read
        pinned = [x.block_hash for x in loads if x.tier is not None and x.block_hash not in filled]
        self._refused = RefusedStep(
            step, reserved, pinned, list(fetched), list(disk_read),
            f"store aborted: step {step}'s plan failed: {reason}",
        )  # fmt: skip
        logger.warning(
            "tiercache: step %d stores nothing (%d prepared stores aborted) and refuses its %d loads "
            "(recomputed)", step, len(reserved), len(loads),
        )  # fmt: skip
        refused = tuple(LoadItem(x.block_hash, None, -1, x.block_id) for x in loads)
        return StepPlan(step, refused, load_requests=load_requests)

    def release_refused_step(self) -> None:
        """Abort the refused step's reserved stores and unpin its loads: nothing will read those blocks, and
        they stay good for later hits."""
        refused, self._refused = self._refused, None
        if refused is None:
            return
        if refused.stores:
            self.manager.abort_store(refused.stores, refused.reason[:200])
        if refused.pinned:
            self.manager.complete_load(refused.pinned)
        if refused.fetched:
            self.manager.complete_fetch(refused.fetched, False, refused.reason)
        if refused.disk_read:  # the files were never read: they stay indexed
            self.manager.complete_disk_read(refused.disk_read, False, refused.reason, keep_file=True)
