"""TierCacheConnector: vLLM's KV connector interface, delegating to the scheduler or the worker side. It is
the boundary vLLM calls, and the one place where connector errors are caught.

Provides:
    TierCacheConnector(vllm_config, role, kv_cache_config)    KVConnectorBase_V1 subclass
        .scheduler (ConnectorScheduler) on the scheduler role, .worker (ConnectorWorker) on the worker role
        get_kv_connector_stats / build_kv_connector_stats / build_prom_metrics   metrics in vLLM's log line,
        its Prometheus registry and /metrics (connectors/metrics.py)

Glue only (STYLE.md rule 7): decisions live in connectors/scheduler/ and tiercache.scheduler, execution in
connectors/worker/ and tiercache.worker. Every hook vLLM calls after start-up runs inside `_guarded`: an
error is logged once, with what it costs, and turned into a miss — a lookup of 0 tokens, loads refused
(vLLM recomputes them; kv_load_failure_policy is set to "recompute"), a step that stores nothing, a failed
transfer — never raised into the engine. Start-up configuration errors are raised, and so is an unreadable
step plan on a worker (see _plan).

Loads take vLLM's asynchronous path: a request with hits waits (WAITING_FOR_REMOTE_KVS) through the step
whose plan carries its loads, every rank reports it received after that step (get_finished) — or, when the
plan reads from the disk tier or the remote store, after the step in which those reads came in (the engine
steps on meanwhile) — with the blocks that failed (get_block_ids_with_load_errors), and vLLM recomputes
those before the request first computes. Loaded in the step that also computes the request, a failed block
would be reported after the forward pass used it, and under vLLM's asynchronous scheduling the next step,
fed by that pass's token, is already scheduled (vLLM #34484, #45138): that token would be kept.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorRole

from .common import Geometry, config_from_extra, load_config, remote_model_name
from .metadata import TierCacheMetadata, TierCacheWorkerMeta
from .metrics import TierCachePromMetrics, TierCacheStats

logger = logging.getLogger(__name__)
T = TypeVar("T")


def _guarded(what: str, cost: str, fn: Callable[..., T], *args, fallback: Callable[[str], T] | None = None):
    """fn(*args); on an error, one log line (with the traceback) saying what failed and what it costs, then
    fallback(reason) (or None)."""
    try:
        return fn(*args)
    except Exception as exc:
        logger.exception("tiercache: %s failed; %s", what, cost)
        return fallback(f"{exc.__class__.__name__}: {exc}") if fallback is not None else None


class TierCacheConnector(KVConnectorBase_V1):
    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        """False: loads and stores run once per step, outside the layers' graphs. vLLM asks this while it
        builds its config, before any engine process starts or weights load (where CUDA graphs are on: GPUs),
        so the tiercache config is read and checked here too: a bad one stops `vllm serve` or `LLM(...)` at
        once, as one ConfigError (elsewhere it is raised when the connector starts)."""
        config_from_extra(extra_config)
        return False

    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        _log_with_vllm()
        config = load_config(vllm_config)
        model = remote_model_name(vllm_config)
        geometry = Geometry.from_vllm(vllm_config, kv_cache_config, config.codec)
        self.scheduler = self.worker = None
        if role == KVConnectorRole.SCHEDULER:
            from .scheduler import ConnectorScheduler

            transfer = vllm_config.kv_transfer_config
            if transfer.kv_load_failure_policy != "recompute":
                logger.info(
                    "tiercache: kv_load_failure_policy %r → 'recompute'", transfer.kv_load_failure_policy
                )
                transfer.kv_load_failure_policy = "recompute"
            world_size = vllm_config.parallel_config.world_size
            self.scheduler = ConnectorScheduler(config, geometry, world_size, model)
        else:
            from .worker import ConnectorWorker

            self.worker = ConnectorWorker(config, geometry, vllm_config.parallel_config.rank, model)

    # ------------------------------------------------------------------ worker side
    def register_kv_caches(self, kv_caches) -> None:
        context = self._vllm_config.compilation_config.static_forward_context
        backends, isa = {}, None
        for name in kv_caches:
            backend = getattr(context.get(name), "attn_backend", None)
            backends[name] = backend.get_name() if backend is not None else ""
            if backends[name] == "CPU_ATTN" and not self.worker.geometry.primary:  # pages need no ISA map
                isa = getattr(context[name], "isa", None) or _cpu_isa(self._kv_cache_config)
        self.worker.register(kv_caches, backends, isa)

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        plan = self._plan()
        abandon = lambda reason: self.worker.abandon_loads(plan, reason)
        _guarded(f"step {plan.step}: loading", "its loads are recomputed", self.worker.start_step, plan,
                 fallback=abandon)  # fmt: skip

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads are done in start_load_kv, for requests that do not compute in this step

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs: Any) -> None:
        return  # stores read vLLM's cache once per step, in wait_for_save

    def wait_for_save(self) -> None:
        plan = self._plan()
        abandon = lambda reason: self.worker.abandon_stores(plan, reason)
        _guarded(f"step {plan.step}: storing", "its blocks are not stored", self.worker.finish_step, plan,
                 fallback=abandon)  # fmt: skip

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        """(sent: none, received: the requests whose loads are done, this step's or, where they waited for
        disk reads or remote fetches, an earlier step's; failed blocks included: those are in
        get_block_ids_with_load_errors, asked next, and vLLM recomputes them before the request runs)."""
        plan = self._plan()
        abandon = lambda reason: self.worker.abandon_stores(plan, reason)
        _guarded(f"step {plan.step}: ending", "its stores are not kept", self.worker.end_step, plan,
                 fallback=abandon)  # fmt: skip
        refuse = lambda reason: self.worker.abandon_loads(plan, reason) or set(plan.load_requests)
        done = _guarded(f"step {plan.step}: finishing loads", "this step's loads are recomputed",
                        self.worker.take_finished, plan, fallback=refuse)  # fmt: skip
        return None, done or None

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self.worker.take_load_errors()

    def build_connector_worker_meta(self) -> TierCacheWorkerMeta | None:
        report = _guarded("reporting to the scheduler", "this step's report is lost", self.worker.take_report)
        return None if report is None else TierCacheWorkerMeta.of(report)

    def shutdown(self) -> None:
        if self.worker is not None:
            _guarded("waiting for transfers at shutdown", "they are abandoned", self.worker.shutdown)
        if self.scheduler is not None:
            _guarded("closing the scheduler side", "nothing (shutting down)", self.scheduler.close)

    def _plan(self):
        """This step's StepPlan (decoded once per step). An unreadable plan (a bug, or different tiercache
        versions in the two processes) is raised: without it the worker cannot tell vLLM which of the
        blocks it counts as loaded were not written, and serving them unwritten would be wrong KV."""
        return self._get_connector_metadata().plan()

    # ------------------------------------------------------------------ scheduler side
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int | None, bool]:
        s = self.scheduler
        what = f"lookup of request {request.request_id}"
        miss = lambda reason: 0
        n = _guarded(what, "treated as a miss", s.num_matched_tokens, request, num_computed_tokens,
                     fallback=miss)  # fmt: skip
        if n is None:  # the remote store is being asked: vLLM skips the request this step and asks again
            return None, False
        return n, n > 0  # loaded asynchronously: see the module's docstring

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        s = self.scheduler
        block_ids = list(blocks.get_block_ids()[0])
        refuse = lambda reason: s.refuse_loads(request, block_ids, num_external_tokens)
        what = f"admission of request {request.request_id}"
        _guarded(what, "its loads are recomputed", s.after_alloc, request, block_ids, num_external_tokens,
                 fallback=refuse)  # fmt: skip
        self._drain()

    def build_connector_meta(self, scheduler_output) -> TierCacheMetadata:
        s = self.scheduler
        plan = _guarded("building the step plan", "this step stores nothing and recomputes its loads",
                        s.build_plan, scheduler_output, fallback=s.refuse_step)  # fmt: skip
        _guarded("releasing a refused step's reservations", "its slots stay reserved", s.release_refused_step)
        _guarded("the eviction policy's step hint", "none", s.observe_step, plan)
        self._drain()
        return TierCacheMetadata.of(plan)

    def update_connector_output(self, connector_output) -> None:
        meta = connector_output.kv_connector_worker_meta
        if meta is not None:
            reports = _guarded("reading worker reports", "their steps stay in flight", meta.reports)
            if reports:
                _guarded("applying worker reports", "some completions are lost", self.scheduler.on_reports,
                         reports)  # fmt: skip
        self._drain()

    def request_finished(self, request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        _guarded("request_finished", "none", self.scheduler.request_finished, request.request_id)
        return False, None

    # ------------------------------------------------------------------ metrics (vLLM's stats path)
    def get_kv_connector_stats(self) -> TierCacheStats | None:
        """Scheduler side: the counters since start, every step (vLLM calls it after update_connector_output;
        see scheduler/stats.py for why unchanged totals are sent too). Workers report through the
        scheduler: their side has none."""
        if self.scheduler is None:
            return None
        data = _guarded("collecting metrics", "this interval's metrics are lost", self.scheduler.stats_update)
        return None if data is None else TierCacheStats(data=data)

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> TierCacheStats:
        return TierCacheStats(data=data or {})

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        return TierCachePromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def _drain(self) -> None:
        _guarded("recording events for inspection", "inspection misses them", self.scheduler.drain_events)


def _cpu_isa(kv_cache_config) -> str:
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    spec = kv_cache_config.kv_cache_groups[0].kv_cache_spec
    return _get_attn_isa(spec.dtype, spec.block_size, spec.head_size)


def _log_with_vllm() -> None:
    """tiercache log lines (manager, pools, connector) go where vLLM's go, unless the user configured them."""
    ours, theirs = logging.getLogger("tiercache"), logging.getLogger("vllm")
    if not ours.handlers and theirs.handlers:
        for handler in theirs.handlers:
            ours.addHandler(handler)
        ours.setLevel(theirs.getEffectiveLevel())
        ours.propagate = False
