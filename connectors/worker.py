"""Worker side of the connector: executes the scheduler's metadata on this rank's pools and vLLM's cache.

Provides:
    ConnectorWorker(config, geometry)
        register(kv_caches, backend_names)   K/V views per layer, the rank's TierWorker (pools on the
                                             cache's device: "vram" is the GPU, or host memory on CPU)
        start_step(meta)                     loads (decode into vLLM's blocks), then submit spills/warms
        finish_step()                        stores (encode vLLM's blocks into their slots), poll jobs
        take_load_errors() -> set[int]       vLLM block ids whose load was refused or failed
        take_report() -> TierCacheWorkerMeta

Never serve wrong KV (DESIGN.md decision 5): every slot written here records its provenance (block hash,
codec id); a load whose slot does not hold the asked block with this codec is refused, and a failed load,
store or transfer is reported as failed (vLLM recomputes; the manager drops or keeps the block). Errors are
logged with the reason and never raised into the engine.
"""

from __future__ import annotations

import logging

import torch

from tiercache.config import TierCacheConfig
from tiercache.worker import TierWorker

from .codec_io import decode_blocks, encode_blocks
from .common import Geometry
from .kv_views import BlockAccess, kv_access
from .metadata import TierCacheMetadata, TierCacheWorkerMeta

logger = logging.getLogger(__name__)


class ConnectorWorker:
    def __init__(self, config: TierCacheConfig, geometry: Geometry) -> None:
        self.config = config
        self.geometry = geometry
        self.layout = geometry.layout(config.codec)
        self.codec_id = geometry.codec_id(config.codec)
        self.tiers: TierWorker | None = None
        self.codec = None
        self.k_views: list[BlockAccess] = []
        self.v_views: list[BlockAccess] = []
        self.provenance: dict[tuple[str, int], tuple[bytes, str]] = {}  # (tier, slot) → (hash, codec id)
        self._jobs: dict[int, dict] = {}  # submitted, not finished
        self._load_errors: set[int] = set()
        self._steps: list[list] = []
        self._job_results: list[list] = []
        self._errors: list[str] = []
        self._loads_ok: list[bool] = []

    def register(
        self, kv_caches: dict[str, torch.Tensor], backend_names: dict[str, str], cpu_isa: str | None = None
    ) -> None:
        """cpu_isa: the CPU backend's ISA tag (layer.isa): its block layout is measured with vLLM's op."""
        g = self.geometry
        missing = [name for name in g.layer_names if name not in kv_caches]
        if missing:
            raise ValueError(f"tiercache: vLLM registered no KV cache for layers {missing}")
        for name in g.layer_names:
            k, v = kv_access(
                kv_caches[name],
                backend_names.get(name, ""),
                g.block_size,
                g.num_kv_heads,
                g.head_dim,
                cpu_isa,
            )
            self.k_views.append(k)
            self.v_views.append(v)
        device = self.k_views[0].device
        self.codec = self.config.codec.build(g.head_dim, g.dtype)
        if self.codec.codec_id != self.codec_id:
            raise AssertionError(f"codec id {self.codec.codec_id} != scheduler's {self.codec_id}")
        self.tiers = TierWorker.from_config(self.config, self.layout, device)
        first = next(iter(g.layer_names))
        logger.info(
            "tiercache: worker side: %d layers on %s, cache %s %s (backend %s), K block %s; pools: %d VRAM + "
            "%d DRAM blocks", len(self.k_views), device, tuple(kv_caches[first].shape), g.dtype,
            backend_names.get(first), self.k_views[0].shape, self.tiers.vram.num_blocks,
            self.tiers.dram.num_blocks,
        )  # fmt: skip

    # ------------------------------------------------------------------ per step
    def start_step(self, meta: TierCacheMetadata) -> None:
        self._loads_ok = self._load(meta.loads) if meta.loads else []
        if meta.jobs:
            self._submit(meta.jobs)

    def finish_step(self, meta: TierCacheMetadata) -> None:
        stores_ok = self._store(meta.stores) if meta.stores else []
        self._steps.append([meta.step, stores_ok, self._loads_ok])
        self._loads_ok = []
        if self._jobs:
            self._collect(self.tiers.poll)

    def take_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def take_report(self) -> TierCacheWorkerMeta | None:
        if not (self._steps or self._job_results or self._errors):
            return None
        report = TierCacheWorkerMeta(self._steps, self._job_results, self._errors)
        self._steps, self._job_results, self._errors = [], [], []
        return report

    def shutdown(self) -> None:
        if self.tiers is not None and self._jobs:
            self._collect(self.tiers.wait)

    # ------------------------------------------------------------------ loads and stores
    def _load(self, loads: list[list]) -> list[bool]:
        ok = [False] * len(loads)
        todo = []
        for i, (block_hash, tier, slot, block_id) in enumerate(loads):
            reason = self._refuse(block_hash, tier, slot)
            if reason:
                self._error(
                    f"load of block {bytes(block_hash).hex()[:16]} ({tier} slot {slot}) refused: {reason}"
                )
                self._load_errors.add(block_id)
            else:
                todo.append(i)
        if not todo:
            return ok
        try:
            blocks = self.tiers.load([loads[i][1] for i in todo], [loads[i][2] for i in todo])
            decode_blocks(self.codec, blocks, self.k_views, self.v_views, [loads[i][3] for i in todo])
        except Exception as exc:  # never crash the engine: vLLM recomputes these blocks
            logger.exception("tiercache: load of %d blocks failed", len(todo))
            self._error(f"load of {len(todo)} blocks failed: {exc!r}")
            self._load_errors.update(loads[i][3] for i in todo)
            return ok
        for i in todo:
            ok[i] = True
        return ok

    def _refuse(self, block_hash: bytes, tier: str, slot: int) -> str | None:
        if not tier:
            return "the manager refused it after the lookup"
        held = self.provenance.get((tier, slot))
        if held is None:
            return "the slot holds no block"
        if held[0] != block_hash:
            return f"the slot holds block {bytes(held[0]).hex()[:16]}"
        if held[1] != self.codec_id:
            return f"codec mismatch: slot has {held[1]}, this worker uses {self.codec_id}"
        return None

    def _store(self, stores: list[list]) -> list[bool]:
        tiers = [s[1] for s in stores]
        slots = [s[2] for s in stores]
        for tier, slot in zip(tiers, slots, strict=True):
            self.provenance.pop((tier, slot), None)
        try:
            blocks = encode_blocks(
                self.codec, self.k_views, self.v_views, [s[3] for s in stores], self.layout
            )
            self.tiers.store(tiers, slots, blocks)
        except Exception as exc:
            logger.exception("tiercache: store of %d blocks failed", len(stores))
            self._error(f"store of {len(stores)} blocks failed: {exc!r}")
            return [False] * len(stores)
        for block_hash, tier, slot, _ in stores:
            self.provenance[tier, slot] = (bytes(block_hash), self.codec_id)
        return [True] * len(stores)

    # ------------------------------------------------------------------ spills and warms
    def _submit(self, jobs: list[dict]) -> None:
        for job in jobs:
            dst_tier = "dram" if job["kind"] == "spill" else "vram"
            for slot in job["dst"]:
                self.provenance.pop((dst_tier, slot), None)
            try:
                self.tiers.run_jobs([job])
                self._jobs[job["job_id"]] = job
            except Exception as exc:
                logger.exception("tiercache: transfer job %s failed to start", job.get("job_id"))
                self._error(f"{job['kind']} job {job['job_id']} failed to start: {exc!r}")
                self._job_results.append([job["job_id"], False])

    def _collect(self, fetch) -> None:
        try:
            results = fetch()
        except Exception as exc:
            logger.exception("tiercache: polling transfers failed")
            self._error(f"polling transfers failed: {exc!r}")
            results = []
        for result in results:
            job = self._jobs.pop(result.job_id, None)
            if job is None:
                continue
            if result.ok:
                src_tier, dst_tier = ("vram", "dram") if job["kind"] == "spill" else ("dram", "vram")
                for src, dst in zip(job["src"], job["dst"], strict=True):
                    held = self.provenance.get((src_tier, src))
                    if held is not None:
                        self.provenance[dst_tier, dst] = held
            else:
                self._error(f"{job['kind']} job {result.job_id} failed: {result.error}")
            self._job_results.append([result.job_id, bool(result.ok)])

    def _error(self, reason: str) -> None:
        logger.warning("tiercache: %s", reason)
        self._errors.append(reason)
