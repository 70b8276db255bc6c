"""The ConnectorScheduler's state: built once, changed by its verb groups (admission.py, steps.py,
reports.py), which subclass SchedulerCore; ConnectorScheduler (connector_scheduler.py) combines them: one
object, so one owner of the queued loads, the steps in flight and the job reports.

Provides:
    SchedulerCore(config, geometry, world_size=1, model="")   the state; ConnectorScheduler's constructor
        config, geometry, block_size, world_size, codec_id, disk_file_bytes (one block's file, per rank)
        manager (TierManager), requests (RequestTracker), remote (RemoteStore | None), inspection
        (InspectionState), inspection_service, stats (StatsTap), events (recent TierEvents), counters
        _loads, _fetches, _disk_reads       queued by admission for the next plan (fetches and disk reads go
                                            before loads)
    The disk tier's index (the manager's) is rebuilt at start from rank 0's directory index
    (tiercache.disk.files.scan: the slots' records; each slot's header and checksum are checked when read).
        _load_requests                      the requests those loads are for (vLLM waits for each)
        _in_flight {step: StepRecord}       steps sent to the workers and not yet reported
        _step_reports                       per step: [ranks reported, stores ok, loads ok, why]
        _job_reports, _job_kinds            per job id: [ranks reported, all ok]; "spill" | "warm"
        _step, _building, _refused          the next step, the step being built, a refused step (RefusedStep)
    StepRecord      a step sent and not yet reported: its stores, loads, tainted requests and fetched blocks
    RefusedStep     a step whose plan failed: what it had reserved, released by release_refused_step()
    logger          the connector_scheduler module's logger: every line the scheduler side writes
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

from tiercache.config import TierCacheConfig
from tiercache.disk.files import block_dir, file_bytes, scan
from tiercache.errors import ConfigError
from tiercache.inspect import InspectError, InspectionService, InspectionState
from tiercache.layout import describe_tiers
from tiercache.remote.format import RemoteNamespace
from tiercache.remote.store import RemoteStore, open_store
from tiercache.scheduler.manager import TierManager
from tiercache.scheduler.policies import make_policy
from tiercache.wire import LoadItem, RemoteItem

from ..common import Geometry
from .remote_lookups import RemoteLookups
from .requests import RequestTracker
from .stats import StatsTap

logger = logging.getLogger(__name__.rpartition(".")[0] + ".connector_scheduler")
MAX_RECENT_EVENTS = 100_000


@dataclass
class StepRecord:
    """A step sent to the workers and not yet reported: what to complete when the reports come."""

    stores: tuple[tuple[bytes, str], ...] = ()  # (block hash, the request that computed it)
    loads: tuple[tuple[bytes, bool, int], ...] = ()  # (block hash, pinned by prepare_load, vLLM block id)
    tainted: set[str] = field(default_factory=set)  # requests that computed over a failed load
    fetched: frozenset[bytes] = frozenset()  # loads whose block the workers fetch from the remote store
    disk_read: frozenset[bytes] = frozenset()  # loads whose block the workers read from the disk tier


@dataclass
class RefusedStep:
    """A step whose plan failed: what it had reserved, released by release_refused_step()."""

    step: int
    stores: tuple[bytes, ...]
    pinned: list[bytes] = field(default_factory=list)
    fetched: list[bytes] = field(default_factory=list)  # reserved by prepare_fetch
    disk_read: list[bytes] = field(default_factory=list)  # reserved by prepare_disk_read
    reason: str = ""


class SchedulerCore:
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
        self.remote_lookups = RemoteLookups(self.remote) if self.remote is not None else None
        self.disk_file_bytes = file_bytes(layout)
        if config.tiers.disk is not None:
            found = scan(block_dir(config.tiers.disk.path, RemoteNamespace(model, self.codec_id, layout)))
            self.manager.restore_disk([f.block_hash for f in found])
        self._loads: list[LoadItem] = []  # queued for the next plan
        self._fetches: list[RemoteItem] = []  # queued for the next plan, before its loads
        self._disk_reads: list[RemoteItem] = []  # queued for the next plan, before its loads
        self._load_requests: list[str] = []  # requests whose loads are queued: received after the next step
        self._in_flight: dict[int, StepRecord] = {}
        self._step_reports: dict[int, list] = {}  # step → [ranks reported, stores ok, loads ok, why]
        self._job_reports: dict[int, list] = {}  # job id → [ranks reported, all ok]
        self._step = 0
        self._building: tuple[int, tuple[bytes, ...]] | None = None  # step being built, its reserved stores
        self._refused: RefusedStep | None = None
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
