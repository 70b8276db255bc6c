"""Worker side of the connector: executes each step's plan on this rank's pools and vLLM's cache.

Provides:
    ConnectorWorker(config, geometry, rank=0, model="")   rank: vLLM's global rank of this worker (in its
                                             reports); model: the remote and disk tiers' namespace
        register(kv_caches, backend_names, cpu_isa=None)   K/V views per layer (primary mode: page views),
                                             the rank's TierWorker (pools on the cache's device: "vram" is the
                                             GPU, or host memory), then warm_up()
        warm_up() -> float                   on a GPU (warm_start.py): compile and run once the kernels of a
                                             store and a load, checksums included (seconds taken; 0.0 when
                                             there is nothing to warm or $TIERCACHE_WARM_START is 0)
        start_step(plan)                     remote uploads, disk writes and drops; disk reads
                                             (disk_steps.py) and remote fetches (remote_steps.py) started on
                                             their reader threads; loads (decode into vLLM's blocks; a failed
                                             read or fetch is a refused load), now, or for a plan with reads
                                             or fetches once they are in (below); then submit the jobs. The
                                             loads' checksum verdicts are compared on the device and read by
                                             the decode: the host learns them later (settled before the jobs,
                                             in finish_step or in take_load_errors, whichever comes first), so
                                             a load does not wait for its decode
        finish_step(plan)                    stores (encode vLLM's blocks into their slots), poll jobs,
                                             record the step's result (a step still reading: once its loads
                                             are done)
        end_step(plan)                       finish_step for a step without stores (maybe no forward pass)
        take_finished(plan) -> set[str]      the requests whose loads are done (vLLM's finished receiving):
                                             the plan's, unless it still reads, and those of earlier plans
                                             whose reads came in since
        abandon_loads(reason) / abandon_stores(reason)   fallbacks after start_step / finish_step raised:
                                             whatever did not complete is reported failed
        take_load_errors() -> set[int]       vLLM block ids whose load was refused or failed
        take_report() -> WorkerReport | None   step results (with why each refused load was refused),
                                             finished jobs, timed loads and stores (IoSample), errors, the
                                             remote and disk writes since the last report
        shutdown()

Reads from the disk tier and the remote store never hold up a step: the loads of a plan with reads or
fetches wait (the plan's requests wait in vLLM, which loads asynchronously) while later steps run, and are
done at the first start_step or take_finished after its reads are in; its StepResult follows once its stores
are done too (the scheduler waits for every rank's). A silent store costs those requests its timeout, and
nothing else.

Offload mode encodes vLLM's blocks into the tiers' TurboQuant format on save and decodes them on load;
primary mode (vLLM's cache already holds TurboQuant pages) copies the same bytes both ways (page_io.py).

Never serve wrong KV (DESIGN.md decision 5): the TierWorker tags every slot with the block its plan wrote
there and the codec id, and records the checksum of its bytes; a load whose slot does not hold the asked
block with this codec is refused, a loaded block whose bytes changed since they were stored is refused
before any of its bytes reaches vLLM's cache, and a failed load, store or transfer is reported as failed
(vLLM recomputes; the manager drops or keeps the block). Errors are raised to the connector
(connectors/vllm.py), which logs them and calls the fallbacks; nothing is raised into the engine.
"""

from __future__ import annotations

import logging

import torch

from tiercache.config import TierCacheConfig
from tiercache.errors import ConfigError
from tiercache.pages import PageViews, as_pages
from tiercache.remote.format import RemoteNamespace
from tiercache.wire import JobResult, StepPlan, StepResult, WorkerReport
from tiercache.worker.tier_worker import TierWorker

from ..common import Geometry
from .disk_steps import DiskSteps
from .io_timer import IoTimer
from .kv_views import BlockAccess, kv_access
from .remote_steps import RemoteSteps
from .step_io import StepIO, StepState
from .warm_start import warm_up

logger = logging.getLogger(__name__)


class ConnectorWorker(StepIO):
    def __init__(self, config: TierCacheConfig, geometry: Geometry, rank: int = 0, model: str = "") -> None:
        self.config = config
        self.rank = rank
        self.model = model
        self.remote: RemoteSteps | None = None
        self.disk: DiskSteps | None = None
        self.geometry = geometry
        self.layout = geometry.layout(config.codec)
        self.codec_id = geometry.codec_id(config.codec)
        self.tiers: TierWorker | None = None
        self.codec = None
        self.k_views: list[BlockAccess] = []
        self.v_views: list[BlockAccess] = []
        self.page_views: list[PageViews] = []  # primary mode
        self._step: StepState | None = None
        self._reading: list[StepState] = []  # steps whose loads wait for their disk reads or remote fetches
        self._finished: set[str] = set()  # requests whose loads were done after their own step
        self._load_errors: set[int] = set()
        self._steps: list[StepResult] = []
        self._jobs: list[JobResult] = []
        self._errors: list[str] = []
        self.timer: IoTimer | None = None
        self.warm_seconds = 0.0  # what warm_up took at registration

    def register(
        self, kv_caches: dict[str, torch.Tensor], backend_names: dict[str, str], cpu_isa: str | None = None
    ) -> None:
        """cpu_isa: the CPU backend's ISA tag (layer.isa): its block layout is measured with vLLM's op."""
        g = self.geometry
        missing = [name for name in g.layer_names if name not in kv_caches]
        if missing:
            raise ValueError(f"tiercache: vLLM registered no KV cache for layers {missing}")
        if g.primary:
            fmt = g.page_format(self.config.codec)
            self.page_views = [fmt.views(as_pages(kv_caches[name], fmt.page_bytes)) for name in g.layer_names]
        else:
            for name in g.layer_names:
                cache, backend = kv_caches[name], backend_names.get(name, "")
                k, v = kv_access(cache, backend, g.block_size, g.num_kv_heads, g.head_dim, cpu_isa)
                self.k_views.append(k)
                self.v_views.append(v)
        device = kv_caches[g.layer_names[0]].device
        self.codec = self.config.codec.build(g.head_dim, g.dtype)
        if self.codec.codec_id != self.codec_id:
            raise ConfigError(
                f"tiercache: the worker's codec {self.codec.codec_id} differs from the scheduler's "
                f"{self.codec_id}; both sides must read the same config (kv_connector_extra_config / "
                "$TIERCACHE_CONFIG) and tiercache version"
            )
        self.tiers = TierWorker.from_config(self.config, self.layout, self.codec_id, device)
        if self.config.tiers.remote is not None:
            namespace = RemoteNamespace(self.model, self.codec_id, self.layout, self.rank)
            self.remote = RemoteSteps(self.config.tiers.remote, namespace, self.tiers)
        if self.config.tiers.disk is not None:
            namespace = RemoteNamespace(self.model, self.codec_id, self.layout, self.rank)
            self.disk = DiskSteps(self.config.tiers.disk, namespace, self.tiers)
        self.timer = IoTimer(device)
        first = next(iter(g.layer_names))
        logger.info(
            "tiercache: worker side, rank %d (%s mode): %d layers on %s, cache %s %s (backend %s); this "
            "rank's pools: %d VRAM + %d DRAM blocks", self.rank, "primary" if g.primary else "offload",
            len(g.layer_names), device,
            tuple(kv_caches[first].shape), g.dtype, backend_names.get(first), self.tiers.vram.num_blocks,
            self.tiers.dram.num_blocks,
        )  # fmt: skip
        self.warm_seconds = self.warm_up()
        if self.warm_seconds:
            logger.info(
                "tiercache: warm start: store and load kernels compiled and run in %.2fs", self.warm_seconds
            )

    def warm_up(self) -> float:
        """warm_start.warm_up for this rank: the serving path's kernels compiled and run once (seconds)."""
        return warm_up(self.tiers, self.codec, self.layout, self.k_views, self.v_views, self.page_views)

    # ------------------------------------------------------------------ per step
    def start_step(self, plan: StepPlan) -> None:
        if self._step is not None:
            self._settle(self._step)
        self._load_read()
        step = self._step = StepState.of(plan)
        step.unfetched = self._remote(plan, step)
        if step.reading:
            self._reading.append(step)
        elif plan.loads:
            self._load(step)
        if plan.jobs:  # a refused block's slot is untagged before any job may read it
            self._settle(step)
        for job in plan.jobs:
            self.tiers.submit(job)
            step.submitted.add(job.job_id)

    def take_finished(self, plan: StepPlan) -> set[str]:
        """vLLM's finished-receiving requests of this step (get_finished): the plan's own, unless it still
        reads, and those whose reads came in since (their loads done now, their load errors with them)."""
        self._load_read()
        done, self._finished = self._finished, set()
        if not any(step.plan is plan for step in self._reading):
            done.update(plan.load_requests)
        return done

    def _load_read(self) -> None:
        """The loads of the steps whose disk reads and remote fetches are all in (each filled into DRAM as
        its batches arrive); a step whose stores are done too is recorded."""
        for step in list(self._reading):
            try:
                failed = [pending.poll() for pending in step.reading]
            except Exception as e:  # a read raised: its step's reads are all misses (recomputed)
                self._error(f"step {step.plan.step}: reading from the disk tier or the store failed: {e!r}")
                reads = (*step.plan.disk_reads, *step.plan.fetches)
                failed = [{item.block_hash: f"read failed ({type(e).__name__})" for item in reads}]
            if any(f is None for f in failed):
                continue
            self._reading.remove(step)
            step.reading = []
            self._finished.update(step.plan.load_requests)  # first: whatever happens next, vLLM hears of them
            for f in failed:
                step.unfetched.update(f)
            if step.plan.loads:
                try:
                    self._load(step)
                    self._settle(step)
                except Exception as e:  # the loads not done are load errors (vLLM recomputes them)
                    step.verdicts = None
                    self._unserved(step, f"loading after the reads failed: {e!r}")
            if step.stored:
                self._end(step)

    def _remote(self, plan: StepPlan, step: StepState) -> dict[bytes, str]:
        """Remote uploads and disk writes first (their slots may be reused by this step's reads, fetches and
        stores), disk drops after the writes, then disk reads and remote fetches, started (step.reading);
        the blocks that cannot be read or fetched, with why."""
        failed: dict[bytes, str] = {}
        tiers = (("remote", self.remote, plan.uploads, plan.fetches, ()),
                 ("disk", self.disk, plan.disk_writes, plan.disk_reads, plan.disk_drops))  # fmt: skip
        for name, steps, writes, reads, drops in tiers:
            if steps is None and (writes or reads or drops):
                self._error(f"step {plan.step}: {name} items in the plan but no {name} tier on this worker")
                failed.update({f.block_hash: f"no {name} tier on this worker" for f in reads})
        if self.remote is not None and plan.uploads:
            self.remote.upload(plan.uploads)
        if self.disk is not None:
            if plan.disk_writes:
                self.disk.upload(plan.disk_writes)
            if plan.disk_drops:
                self.disk.drop(plan.disk_drops)
            if plan.disk_reads:
                step.reading.append(self.disk.start_fetch(plan.disk_reads))
        if self.remote is not None and plan.fetches:
            step.reading.append(self.remote.start_fetch(plan.fetches))
        return failed

    def finish_step(self, plan: StepPlan) -> None:
        step = self._current(plan)
        if step.ended or step.stored:  # end_step finished it
            return
        self._settle(step)
        if plan.stores:
            self._store(step)
        step.stored = True
        if not step.reading:
            self._end(step)
        if self.tiers.jobs_in_flight:
            self._jobs += self.tiers.poll()

    def end_step(self, plan: StepPlan) -> None:
        """After the step: one without stores is finished here (it may have had no forward pass, and then
        vLLM calls no wait_for_save). A step with stores computed tokens, so wait_for_save comes, after
        get_finished where a speculative drafter writes its layers' KV first: it finishes that one."""
        if not plan.stores:
            self.finish_step(plan)

    def abandon_loads(self, plan: StepPlan, reason: str) -> None:
        """start_step raised: its loads not done are load errors (vLLM recomputes them) and its jobs not
        submitted are reported failed."""
        step = next((s for s in self._reading if s.plan is plan), None) or self._current(plan)
        step.verdicts = None  # whatever was decoded is not counted: every load not settled is an error
        if step in self._reading:  # its reads go on, unused: the scheduler frees their slots on the failure
            self._reading.remove(step)
            step.reading = []
            self._finished.update(plan.load_requests)
        self._unserved(step, f"loading failed: {reason}")
        for job in plan.jobs:
            if job.job_id not in step.submitted:
                self._jobs.append(JobResult(job.job_id, False, len(job), 0, 0.0, f"not submitted: {reason}"))
                step.submitted.add(job.job_id)

    def abandon_stores(self, plan: StepPlan, reason: str) -> None:
        """finish_step raised: the step is reported with its stores failed (the manager releases them), and
        its loads not settled yet are load errors."""
        self._error(f"step {plan.step}: storing failed: {reason}")
        step = self._current(plan)
        self._settle(step)
        self._end(step)

    def take_load_errors(self) -> set[int]:
        if self._step is not None:
            self._settle(self._step)
        errors, self._load_errors = self._load_errors, set()
        return errors

    def take_report(self) -> WorkerReport | None:
        io = tuple(self.timer.take()) if self.timer is not None else ()
        remote = self.remote.take_counts() if self.remote is not None else ()
        disk = self.disk.take_counts() if self.disk is not None else ()
        if not (self._steps or self._jobs or self._errors or io or remote or disk):
            return None
        report = WorkerReport(
            tuple(self._steps), tuple(self._jobs), tuple(self._errors), io, self.rank, remote, disk
        )
        self._steps, self._jobs, self._errors = [], [], []
        return report

    def shutdown(self) -> None:
        for step in list(self._reading):  # their requests are not served any more
            self.abandon_loads(step.plan, "shutting down")
        if self.tiers is not None and self.tiers.jobs_in_flight:
            self._jobs += self.tiers.wait()
        for steps in (self.remote, self.disk):
            if steps is not None:
                steps.close()
        self.remote = self.disk = None

    # ------------------------------------------------------------------ loads and stores
    def _current(self, plan: StepPlan) -> StepState:
        """The state of this plan's step. A plan whose start_step never ran gets a fresh state, and its
        loads, never done, become load errors (the step it replaces has its verdicts settled first)."""
        if self._step is None or self._step.plan is not plan:
            if self._step is not None:
                self._settle(self._step)
            self._step = StepState.of(plan)
            if plan.loads:
                self._error(f"step {plan.step}: its {len(plan.loads)} loads never started")
                self._load_errors.update(item.block_id for item in plan.loads)
        return self._step

    def _unserved(self, step: StepState, reason: str) -> None:
        """The step's loads not done are load errors."""
        self._error(f"step {step.plan.step}: {reason}")
        for item, ok in zip(step.plan.loads, step.loads_ok, strict=True):
            if not ok:
                self._load_errors.add(item.block_id)

    def _end(self, step: StepState) -> None:
        if not step.ended:
            step.ended = True
            result = StepResult(
                step.plan.step, tuple(step.loads_ok), tuple(step.stores_ok), tuple(step.load_failures)
            )
            self._steps.append(result)

    def _error(self, reason: str) -> None:
        logger.warning("tiercache: %s", reason)
        self._errors.append(reason)
