"""Scheduler side of the connector: owns the TierManager (and its eviction policy) and turns its decisions
into one StepPlan per engine step (DESIGN.md decision 1: the scheduler decides, workers execute).

Provides:
    ConnectorScheduler(config, geometry, world_size=1, model="")   model: the remote tier's namespace
        num_matched_tokens(request, num_computed_tokens) -> int   longest ready prefix (no events), extended
                                                                  by the blocks the remote store holds next
        after_alloc(request, block_ids, num_external_tokens)      pins the hit blocks, queues their loads
                                                                  (remote hits: a DRAM slot each, fetched
                                                                  by the workers before the load)
        refuse_loads(request, block_ids, num_external_tokens)     fallback: queue them refused instead
        build_plan(scheduler_output) -> StepPlan                  loads + stores of newly full blocks + jobs
        observe_step(plan)                                        policy hint: the plan's loads go together
        refuse_step(reason) -> StepPlan / release_refused_step()  fallback when build_plan raised
        on_reports(reports)                                       completions → complete_store/load/transfer;
                                                                  copy timings and failure causes → inspection
        stats_update() -> dict | None                             counters since start, occupancy; None if
                                                                  unchanged (vLLM's connector stats)
        request_finished(request_id), drain_events(), close()
        events                                                    recent TierEvents (bounded deque)
        inspection                                                InspectionState (tiercache.inspect), served
                                                                  on a Unix socket unless inspect.socket is
                                                                  "off"; every admission is recorded there
                                                                  (a RequestRecord) for explain_request

Errors are not caught here: the connector (connectors/vllm.py) catches them where vLLM calls, and calls the
fallbacks above, which never leave a block in flight. Loads are synchronous (vLLM's sync-load path): a block
counted as loaded but refused or failed on a worker is reported as a load error and vLLM recomputes it.
Stores happen in the step where a block becomes full, so nothing is held at request end. A request that
computed over a block whose load failed (on any rank) computed wrong KV: its stores of that step, and of
the steps planned before the failure was reported, are aborted (vLLM recomputes those blocks and they are
stored then). A step whose plan
fails aborts the stores it prepared and refuses its queued loads (released: they stay good for later hits);
a worker report that does not match its step counts that step's items as failed.

The remote tier (tiers.remote): on a local miss, one batched existence call (bounded by tiers.remote.timeout;
the store down or slow answers "none") finds how many of the prompt's next blocks the store holds (rank 0's
keys: a block missing on another rank fails its fetch there, and so its load); those count as matched. The
manager reserves DRAM slots for them; the plan carries the fetches before the loads, and a fetch that fails
on any rank is a refused load (vLLM recomputes) whose reason the report carries. Blocks the manager drops
from DRAM go out as the plan's uploads (tiers.remote.write says which).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from tiercache.config import TierCacheConfig
from tiercache.errors import ConfigError
from tiercache.inspect import InspectError, InspectionService, InspectionState
from tiercache.inspect.request_log import RequestRecord, prompt_digest
from tiercache.layout import describe_tiers
from tiercache.remote.format import RemoteNamespace
from tiercache.remote.store import RemoteStore, open_store
from tiercache.scheduler.events import cause_of
from tiercache.scheduler.manager import TierManager
from tiercache.scheduler.policies import make_policy
from tiercache.wire import DRAM, REMOTE, LoadItem, RemoteItem, StepPlan, StoreItem, WorkerReport, move_kind

from ..common import Geometry
from .requests import RequestTracker
from .stats import StatsTap

logger = logging.getLogger(__name__)
MAX_RECENT_EVENTS = 100_000


@dataclass
class _StepRecord:
    """A step sent to the workers and not yet reported: what to complete when the reports come."""

    stores: tuple[tuple[bytes, str], ...] = ()  # (block hash, the request that computed it)
    loads: tuple[tuple[bytes, bool, int], ...] = ()  # (block hash, pinned by prepare_load, vLLM block id)
    tainted: set[str] = field(default_factory=set)  # requests that computed over a failed load
    fetched: frozenset[bytes] = frozenset()  # loads whose block the workers fetch from the remote store


@dataclass
class _Refused:
    """A step whose plan failed: what it had reserved, released by release_refused_step()."""

    step: int
    stores: tuple[bytes, ...]
    pinned: list[bytes] = field(default_factory=list)
    fetched: list[bytes] = field(default_factory=list)  # reserved by prepare_fetch
    reason: str = ""


class ConnectorScheduler:
    def __init__(
        self, config: TierCacheConfig, geometry: Geometry, world_size: int = 1, model: str = ""
    ) -> None:
        self.config = config
        self.geometry = geometry
        self.block_size = geometry.block_size
        self.world_size = world_size
        self.codec_id = geometry.codec_id(config.codec)
        layout = geometry.layout(config.codec)
        self.manager = TierManager.from_config(config, layout, self.codec_id, make_policy(config.eviction))
        self.requests = RequestTracker(self.block_size)
        self.events: deque = deque(maxlen=MAX_RECENT_EVENTS)
        self.counters = {"loaded_blocks": 0, "load_failures": 0, "stored_blocks": 0, "store_failures": 0}
        self.remote = self._open_remote(config, layout, model)
        self._loads: list[LoadItem] = []  # queued for the next plan
        self._fetches: list[RemoteItem] = []  # queued for the next plan, before its loads
        self._in_flight: dict[int, _StepRecord] = {}
        self._job_reports: dict[int, list] = {}  # job id → [ranks reported, all ok]
        self._step = 0
        self._building: tuple[int, tuple[bytes, ...]] | None = None  # step being built, its reserved stores
        self._refused: _Refused | None = None
        self.inspection = InspectionState(
            recent_requests=config.inspect.recent_requests,
            remembered_departures=config.inspect.remembered_departures,
        )
        self.stats = StatsTap(self.inspection, self.manager)
        self._job_kinds: dict[int, str] = {}  # job id → "spill" | "warm", until its last rank reports
        try:
            self.inspection_service = InspectionService.start(config.inspect, self.inspection)
        except InspectError as exc:  # the cache works without it; say why it is not reachable
            logger.warning("tiercache: inspection socket not started: %s", exc)
            self.inspection_service = None
        tiers = {t.name: t.capacity_blocks for t in self.manager.view().tiers()}
        logger.info(
            "tiercache: scheduler side: codec %s, %d rank(s), tiers (sizes are per rank): %s (blocks of %d "
            "tokens, %d layers, %d KV heads/rank, head_dim %d)", config.codec.name, world_size,
            describe_tiers(tiers, layout, world_size), self.block_size, len(geometry.layer_names),
            geometry.num_kv_heads, geometry.head_dim,
        )  # fmt: skip

    def _open_remote(self, config: TierCacheConfig, layout, model: str) -> RemoteStore | None:
        if config.tiers.remote is None:
            return None
        if not self.manager.view().tier("dram").capacity_blocks:
            raise ConfigError(
                "tiers.remote needs a DRAM tier (remote blocks are fetched into DRAM slots): set tiers.dram "
                "to a size above 0, or remove tiers.remote"
            )
        return open_store(config.tiers.remote, RemoteNamespace(model, self.codec_id, layout, rank=0))

    # ------------------------------------------------------------------ admission
    def num_matched_tokens(self, request, num_computed_tokens: int) -> int:
        max_blocks = (request.num_tokens - 1) // self.block_size  # one token is always recomputed
        hashes = request.block_hashes[:max_blocks]
        hit = self.manager.lookup(hashes, record=False)
        hit = max(hit, num_computed_tokens // self.block_size)
        hit += self._remote_prefix(hashes[hit:])
        self.requests.admit(request, num_computed_tokens)
        return max(0, hit * self.block_size - num_computed_tokens)

    def _remote_prefix(self, hashes: Sequence[bytes]) -> int:
        """How many of these blocks, from the first, the remote store holds: one batched existence call.
        Stops before a block the manager knows (in flight or bad here: a fetch of it would be refused)."""
        if self.remote is None:
            return 0
        todo = []
        for block_hash in hashes:
            if self.manager.info(block_hash) is not None:
                break
            todo.append(block_hash)
        if not todo:
            return 0
        answer = self.remote.exists(todo)
        n = next((i for i, found in enumerate(answer.found) if not found), len(todo))
        self.inspection.record_remote(lookups=len(todo), found=n)
        return n

    def after_alloc(self, request, block_ids: list[int], num_external_tokens: int) -> None:
        """Queue the loads first, then the policy hints and statistics: if a hint fails, the fallback
        (refuse_loads) finds the loads already queued and changes nothing."""
        state = self.requests.admit(request)
        fetched: set[bytes] = set()
        if num_external_tokens > 0:
            hashes, ids = self.requests.external_blocks(state, block_ids, num_external_tokens)
            local = len(hashes) if self.remote is None else self.manager.lookup(hashes, record=False)
            self._queue_loads(hashes[:local], ids[:local], self.manager.prepare_load)
            if local < len(hashes):  # the rest were found in the remote store
                self._queue_loads(hashes[local:], ids[local:], self.manager.prepare_fetch, fetch=True)
                fetched = {f.block_hash for f in self._fetches}.intersection(hashes[local:])
        self.manager.observe_request(request.request_id, list(request.block_hashes))
        first = state.local_computed // self.block_size
        last = (request.num_tokens - 1) // self.block_size
        self.manager.lookup(request.block_hashes[first:last])  # once per admission: hits and the first miss
        loaded = max(num_external_tokens, 0)
        recomputed = max(request.num_prompt_tokens - state.local_computed - loaded, 0)
        self.inspection.record_tokens(loaded=loaded, recomputed=recomputed)
        self._remember(request, state.local_computed, loaded, recomputed, last, fetched)

    def _queue_loads(self, hashes: list[bytes], ids: list[int], prepare, fetch: bool = False) -> None:
        """prepare: the manager's prepare_load or prepare_fetch (raises having pinned nothing). None: changed
        since the lookup, or no room: the workers report these as load errors → recompute."""
        if not hashes:
            return
        out = prepare(hashes)
        if out is None:
            self._loads += [LoadItem(h, None, -1, b) for h, b in zip(hashes, ids, strict=True)]
            return
        placed = list(zip(out.block_hashes, out.tiers, out.slots, ids, strict=True))
        self._loads += [LoadItem(h, t, s, b) for h, t, s, b in placed]
        if fetch:
            self._fetches += [RemoteItem(h, s) for h, t, s, _ in placed if t == DRAM]

    def _remember(
        self, request, vllm_tokens: int, loaded: int, recomputed: int, last: int, fetched: set[bytes]
    ) -> None:
        """The admission as inspection's explain_request will tell it: where each block of the prompt was
        (fetched: the blocks being fetched from the remote store for it)."""
        hashes = tuple(request.block_hashes[:last])
        local = self.manager.where(hashes)
        where = [(REMOTE, None) if h in fetched else w for h, w in zip(hashes, local, strict=True)]
        gone = self.inspection.departures.get
        self.inspection.record_request(
            RequestRecord(
                request_id=request.request_id,
                external_id=caller_id(request.request_id),
                digest=prompt_digest(getattr(request, "prompt_token_ids", None)),
                clock=self.manager.view().clock(),
                wall=time.time(),
                block_size=self.block_size,
                block_hashes=hashes,
                vllm_blocks=vllm_tokens // self.block_size,
                hit_blocks=loaded // self.block_size,
                where="".join(RequestRecord.where_code(tier, reason) for tier, reason in where),
                unreadable={i: reason for i, (tier, reason) in enumerate(where) if tier and reason},
                departed={
                    i: event
                    for i, (tier, _) in enumerate(where)
                    if tier is None and (event := gone(hashes[i]))
                },
                prompt_tokens=request.num_prompt_tokens,
                tokens_loaded=loaded,
                tokens_recomputed=recomputed,
            )
        )

    def refuse_loads(self, request, block_ids: list[int], num_external_tokens: int) -> None:
        """After a failure in after_alloc: vLLM counts these tokens as loaded, so the workers must report
        their blocks as load errors (vLLM recomputes them) — never leave them unwritten."""
        state = self.requests.admit(request)
        queued = {x.block_id for x in self._loads}
        hashes, ids = self.requests.external_blocks(state, block_ids, num_external_tokens)
        self._loads += [LoadItem(h, None, -1, b) for h, b in zip(hashes, ids, strict=True) if b not in queued]

    # ------------------------------------------------------------------ per step
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
        uploads = tuple(self.manager.take_uploads())
        self.inspection.record_remote(uploads=len(uploads))
        self._building = None
        self._in_flight[step] = _StepRecord(
            tuple((s.block_hash, wanted[s.block_hash][1]) for s in stores),
            tuple((x.block_hash, x.tier is not None, x.block_id) for x in loads),
            fetched=frozenset(f.block_hash for f in fetches),
        )
        return StepPlan(step, loads, stores, jobs, uploads, fetches)

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
        self._in_flight[step] = _StepRecord((), tuple((x.block_hash, False, x.block_id) for x in loads))
        pinned = [x.block_hash for x in loads if x.tier is not None and x.block_hash not in fetched]
        self._refused = _Refused(
            step, reserved, pinned, list(fetched), f"store aborted: step {step}'s plan failed: {reason}"
        )
        logger.warning(
            "tiercache: step %d stores nothing (%d prepared stores aborted) and refuses its %d loads "
            "(recomputed)", step, len(reserved), len(loads),
        )  # fmt: skip
        return StepPlan(step, tuple(LoadItem(x.block_hash, None, -1, x.block_id) for x in loads))

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

    def on_reports(self, reports: Sequence[WorkerReport]) -> None:
        """Every rank's report of one engine step: a store or load is ok only if it is ok on every rank; a
        job completes once world_size ranks reported it. Copies count their bytes and seconds on every rank
        and their blocks once (rank 0's), so block counts do not grow with the rank count."""
        steps: dict[int, tuple[list[bool], list[bool], dict[int, str]]] = {}
        for report in reports:
            for reason in report.errors:
                logger.warning("tiercache: worker: %s", reason)
            counted = report.rank == 0
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
                if result.step in steps:
                    seen_stores, seen_loads, seen_why = steps[result.step]
                    stores = [a and b for a, b in zip(seen_stores, stores, strict=True)]
                    loads = [a and b for a, b in zip(seen_loads, loads, strict=True)]
                    why = {**why, **seen_why}
                steps[result.step] = (stores, loads, why)
        for step, (stores_ok, loads_ok, why) in sorted(steps.items()):
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
        self, step: int, record: _StepRecord, stores_ok: list[bool], loads_ok: list[bool], why: dict[int, str]
    ) -> None:
        """why: load index → the reason a rank gave for refusing it (a failed load without one failed on
        the worker: load_failed)."""
        failed = {block_id for (_, _, block_id), ok in zip(record.loads, loads_ok, strict=True) if not ok}
        if failed:
            self._taint(step, record, failed)
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
            elif pinned:  # refused loads were never pinned: nothing to complete
                self.manager.complete_load([block_hash], ok, reason)
            self.counters["loaded_blocks" if ok else "load_failures"] += 1
            if not ok:
                self.inspection.record_failure(cause_of(reason))

    def _taint(self, step: int, record: _StepRecord, failed_block_ids: set[int]) -> None:
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

    def stats_update(self) -> dict | None:
        return self.stats.take()

    def request_finished(self, request_id: str) -> None:
        self.requests.finish(request_id)

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
            self.remote.close()


def caller_id(request_id: str) -> str | None:
    """The id the caller gave, when vLLM made this internal one from it by appending "-" and 8 random hex
    digits (its input processor does in 0.26, 0.32 and 0.33, unless VLLM_DISABLE_REQUEST_ID_RANDOMIZATION)."""
    head, dash, tail = request_id.rpartition("-")
    return head if dash and head and len(tail) == 8 and all(c in "0123456789abcdef" for c in tail) else None


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
