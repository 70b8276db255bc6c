"""Scheduler side of the connector: owns the TierManager (and its eviction policy) and turns its decisions
into plain-data metadata for the workers (DESIGN.md decision 1: the scheduler decides, workers execute).

Provides:
    ConnectorScheduler(config, geometry, world_size=1)
        num_matched_tokens(request, num_computed_tokens) -> int   longest ready prefix (no events)
        after_alloc(request, block_ids, num_external_tokens)      pins the hit blocks, queues their loads
        build_meta(scheduler_output) -> TierCacheMetadata         loads + stores of newly full blocks + jobs
                                                                  (all or nothing: see failed steps below)
        failed_meta() -> TierCacheMetadata                        a step after build_meta raised: refused
        on_worker_meta(meta)                                      completions → complete_store/load/transfer
        request_finished(request_id)
        close()                                                   stops the inspection service and the policy
        events                                                    recent TierEvents (bounded deque)
        inspection                                                InspectionState (tiercache.inspect) fed
                                                                  with every event; served on a Unix socket
                                                                  unless inspect.socket is "off"

Loads are synchronous (vLLM's sync-load path): a block counted as loaded but refused or failed on a worker is
reported by the worker as a load error and vLLM recomputes it. Stores happen in the step where a block
becomes full (during that step's forward), so nothing is held at request end. Nothing stays in flight on a
failure: a step whose metadata fails aborts the stores it prepared and unpins its refused loads, and a
worker report that does not match its step counts that step's items as failed.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

from tiercache.config import TierCacheConfig
from tiercache.inspect import InspectError, InspectionService, InspectionState
from tiercache.manager import TierManager
from tiercache.policy import make_policy

from .common import Geometry
from .metadata import TierCacheMetadata, TierCacheWorkerMeta

logger = logging.getLogger(__name__)
MAX_RECENT_EVENTS = 100_000


@dataclass
class _Request:
    request: object  # vllm Request (its block_hashes grow as tokens are appended)
    block_ids: list[int] = field(default_factory=list)
    local_computed: int = 0  # tokens vLLM had computed itself when we were asked


class ConnectorScheduler:
    def __init__(self, config: TierCacheConfig, geometry: Geometry, world_size: int = 1) -> None:
        self.config = config
        self.geometry = geometry
        self.block_size = geometry.block_size
        self.world_size = world_size
        self.codec_id = geometry.codec_id(config.codec)
        layout = geometry.layout(config.codec)
        self.manager = TierManager.from_config(config, layout, self.codec_id, make_policy(config.eviction))
        self.events: deque = deque(maxlen=MAX_RECENT_EVENTS)
        self.counters = {"loaded_blocks": 0, "load_failures": 0, "stored_blocks": 0, "store_failures": 0}
        self._requests: dict[str, _Request] = {}
        self._loads: list[list] = []  # queued for the next metadata
        self._in_flight: dict[int, tuple[list, list]] = {}  # step → (store hashes, [(load hash, pinned)])
        self._job_reports: dict[int, list] = {}  # job id → [ranks reported, all ok]
        self._step = 0
        self.inspection = InspectionState()
        try:
            self.inspection_service = InspectionService.start(config.inspect, self.inspection)
        except InspectError as exc:  # the cache works without it; say why it is not reachable
            logger.warning("tiercache: inspection socket not started: %s", exc)
            self.inspection_service = None
        logger.info(
            "tiercache: scheduler side: codec %s, %d VRAM + %d DRAM blocks of %d tokens (%d layers, %d KV "
            "heads/rank, head_dim %d)", config.codec.name, self.manager.alloc["vram"].capacity,
            self.manager.alloc["dram"].capacity, self.block_size, len(geometry.layer_names),
            geometry.num_kv_heads, geometry.head_dim,
        )  # fmt: skip

    # ------------------------------------------------------------------ admission
    def num_matched_tokens(self, request, num_computed_tokens: int) -> int:
        max_blocks = (request.num_tokens - 1) // self.block_size  # one token is always recomputed
        hashes = request.block_hashes[:max_blocks]
        hit = self.manager.lookup(hashes, record=False)
        state = self._requests.setdefault(request.request_id, _Request(request))
        state.local_computed = num_computed_tokens
        return max(0, hit * self.block_size - num_computed_tokens)

    def after_alloc(self, request, block_ids: list[int], num_external_tokens: int) -> None:
        state = self._requests.setdefault(request.request_id, _Request(request))
        state.request = request
        try:
            self._observe_admission(state, request, num_external_tokens)
        except Exception:  # policy hints and statistics must never cost a load
            logger.exception("tiercache: eviction policy / inspection hook failed; continuing")
        try:  # once per admitted request: hits up to the first miss, and that miss, for policy and inspection
            first, last = state.local_computed // self.block_size, (request.num_tokens - 1) // self.block_size
            self.manager.lookup(request.block_hashes[first:last])
        except Exception:
            logger.exception("tiercache: recording the lookup of request %s failed", request.request_id)
        if num_external_tokens <= 0:
            self._drain_events()
            return
        hashes, ids = self._external_blocks(state, request, block_ids, num_external_tokens)
        try:
            out = self.manager.prepare_load(hashes)
        except Exception:
            logger.exception("tiercache: prepare_load failed; %d blocks will be recomputed", len(hashes))
            out = None
        if out is None:  # changed since the lookup: the workers report these as load errors → recompute
            self._loads += [[h, "", -1, b] for h, b in zip(hashes, ids, strict=True)]
        else:
            self._loads += [list(x) for x in zip(out.block_hashes, out.tiers, out.slots, ids, strict=True)]
        self._drain_events()

    def refuse_loads(self, request, block_ids: list[int], num_external_tokens: int) -> None:
        """After a failure in after_alloc: vLLM counts these tokens as loaded, so the workers must report
        their blocks as load errors (vLLM recomputes them) — never leave them unwritten."""
        state = self._requests.setdefault(request.request_id, _Request(request))
        queued = {x[3] for x in self._loads}
        hashes, ids = self._external_blocks(state, request, block_ids, num_external_tokens)
        self._loads += [[h, "", -1, b] for h, b in zip(hashes, ids, strict=True) if b not in queued]

    def _external_blocks(self, state, request, block_ids, num_external_tokens) -> tuple[list, list]:
        first = state.local_computed // self.block_size
        count = num_external_tokens // self.block_size
        return list(request.block_hashes[first : first + count]), block_ids[first : first + count]

    def _observe_admission(self, state, request, num_external_tokens: int) -> None:
        observe = getattr(self.manager.policy, "observe_request", None)
        if observe is not None:  # graph advisor hook, when the policy has one
            observe(request.request_id, list(request.block_hashes))
        loaded = max(num_external_tokens, 0)
        recomputed = max(request.num_prompt_tokens - state.local_computed - loaded, 0)
        self.inspection.record_tokens(loaded=loaded, recomputed=recomputed)

    # ------------------------------------------------------------------ per step
    def build_meta(self, scheduler_output) -> TierCacheMetadata:
        """This step's metadata: the queued loads, stores of the blocks that become full, planned jobs. All or
        nothing: if any part fails, the stores this call prepared are aborted (slots freed, a StoreEvent says
        why) and the step goes out with no stores or jobs and its loads refused (vLLM recomputes them)."""
        step, self._step = self._step, self._step + 1
        reserved: tuple[bytes, ...] = ()  # what this call's prepare_store reserved: aborted on failure
        stores: list[list] = []
        try:
            wanted = self._wanted(scheduler_output)
            if wanted:
                out = self.manager.prepare_store(list(wanted))
                if out is not None:
                    reserved = out.block_hashes
                    placed = zip(out.block_hashes, out.tiers, out.slots, strict=True)
                    stores = [[h, t, s, wanted[h]] for h, t, s in placed]
            self._observe_step(self._loads)
            jobs = [job.to_dict() for job in self.manager.take_jobs()]  # the last call that can fail
        except Exception as exc:
            logger.exception("tiercache: building the metadata of step %d failed", step)
            reason = f"store aborted: step {step}'s metadata failed: {exc!r}"[:200]
            return self._failed(step, reserved, reason)
        loads, self._loads = self._loads, []
        self._in_flight[step] = ([s[0] for s in stores], [(x[0], bool(x[1])) for x in loads])
        self._drain_events()
        return TierCacheMetadata(step, loads, stores, jobs)

    def failed_meta(self) -> TierCacheMetadata:
        """A step's metadata after build_meta raised (the connector's last resort): as a failed build_meta."""
        step, self._step = self._step, self._step + 1
        return self._failed(step, (), "")

    def _failed(self, step: int, reserved: tuple[bytes, ...], reason: str) -> TierCacheMetadata:
        """No stores or jobs (planned jobs go out with the next step). The reserved stores are aborted; the
        queued loads go out refused, so the workers report them as load errors and vLLM recomputes them, and
        their pins are released now: nothing will read those blocks, and they stay good for later hits."""
        loads, self._loads = self._loads, []
        self._in_flight[step] = ([], [(x[0], False) for x in loads])
        pinned = [x[0] for x in loads if x[1]]
        try:
            if reserved:
                self.manager.abort_store(reserved, reason)
            if pinned:
                self.manager.complete_load(pinned)
        except Exception:
            logger.exception("tiercache: releasing step %d's stores and loads failed", step)
        logger.warning(
            "tiercache: step %d stores nothing (%d prepared stores aborted) and refuses its %d loads "
            "(recomputed)", step, len(reserved), len(loads),
        )  # fmt: skip
        self._drain_events()
        return TierCacheMetadata(step, [[x[0], "", -1, x[3]] for x in loads], [], [])

    def _wanted(self, scheduler_output) -> dict[bytes, int]:
        """Block hash → vLLM block id of each block that becomes full this step (tracks the block ids)."""
        wanted: dict[bytes, int] = {}
        for req_id, num_computed, new_ids, resumed in _scheduled(scheduler_output):
            state = self._requests.get(req_id)
            if state is None:
                continue
            if resumed:
                state.block_ids = list(new_ids or [])
            elif new_ids:
                state.block_ids.extend(new_ids)
            done = num_computed + scheduler_output.num_scheduled_tokens.get(req_id, 0)
            hashes = state.request.block_hashes
            last = min(done // self.block_size, len(hashes), len(state.block_ids))
            for i in range(num_computed // self.block_size, last):
                wanted.setdefault(hashes[i], state.block_ids[i])
        return wanted

    def _observe_step(self, loads: list[list]) -> None:
        observe_step = getattr(self.manager.policy, "observe_step", None)
        if observe_step is None or len(loads) < 2:
            return
        try:  # blocks used together this step (co_attend); a policy hint must never cost the step
            observe_step([x[0] for x in loads])
        except Exception:
            logger.exception("tiercache: eviction policy observe_step failed; continuing")

    def on_worker_meta(self, meta: TierCacheWorkerMeta | None) -> None:
        if meta is None:
            return
        for reason in meta.errors:
            logger.warning("tiercache: worker: %s", reason)
        for step, stores_ok, loads_ok in meta.steps:
            if step not in self._in_flight:
                logger.warning("tiercache: worker report for unknown step %s ignored", step)
                continue
            store_hashes, load_hashes = self._in_flight.pop(step)
            stores_ok = _aligned(stores_ok, len(store_hashes), step, "store")
            loads_ok = _aligned(loads_ok, len(load_hashes), step, "load")
            for block_hash, ok in zip(store_hashes, stores_ok, strict=True):
                self.manager.complete_store([block_hash], ok)
                self.counters["stored_blocks" if ok else "store_failures"] += 1
            for (block_hash, pinned), ok in zip(load_hashes, loads_ok, strict=True):
                if pinned:  # refused loads were never pinned: nothing to complete
                    self.manager.complete_load([block_hash], ok)
                self.counters["loaded_blocks" if ok else "load_failures"] += 1
        for job_id, ok in meta.jobs:
            seen = self._job_reports.setdefault(job_id, [0, True])
            seen[0] += 1
            seen[1] = seen[1] and ok
            if seen[0] >= self.world_size:
                del self._job_reports[job_id]
                self.manager.complete_transfer(job_id, seen[1])
        self._drain_events()

    def request_finished(self, request_id: str) -> None:
        self._requests.pop(request_id, None)

    def close(self) -> None:
        self._drain_events()
        self.inspection.publish(self.manager, force=True)
        if self.inspection_service is not None:
            self.inspection_service.close()
            self.inspection_service = None
        self.manager.close()

    def _drain_events(self) -> None:
        events = self.manager.take_events()
        self.events.extend(events)
        try:  # inspection must never cost a step its loads or stores
            self.inspection.record(events)
            self.inspection.publish(self.manager)  # rate-limited to one snapshot per 100 ms
        except Exception:
            logger.exception("tiercache: inspection failed to record %d events", len(events))


def _aligned(oks: list, n: int, step: int, what: str) -> list[bool]:
    """A worker report that does not match its step's metadata is not trusted: every item counts as failed
    (the manager still completes each one, so nothing stays in flight)."""
    if len(oks) == n:
        return [bool(ok) for ok in oks]
    logger.error(
        "tiercache: step %d: workers reported %d %s results for %d %ss; all count as failed",
        step, len(oks), what, n, what,
    )  # fmt: skip
    return [False] * n


def _scheduled(scheduler_output):
    """(req_id, num_computed_tokens before this step, new block ids of group 0, resumed) per request."""
    for new in scheduler_output.scheduled_new_reqs:
        yield new.req_id, new.num_computed_tokens, list(new.block_ids[0]) if new.block_ids else [], True
    cached = scheduler_output.scheduled_cached_reqs
    resumed = getattr(cached, "resumed_req_ids", set()) or set()
    for i, req_id in enumerate(cached.req_ids):
        new_ids = cached.new_block_ids[i]
        yield req_id, cached.num_computed_tokens[i], list(new_ids[0]) if new_ids else None, req_id in resumed
