"""TierCacheConnector: vLLM's KV connector interface, delegating to the scheduler or the worker side.

Provides:
    TierCacheConnector(vllm_config, role, kv_cache_config)    KVConnectorBase_V1 subclass
        .scheduler (ConnectorScheduler) on the scheduler role, .worker (ConnectorWorker) on the worker role

Glue only (STYLE.md rule 7): decisions live in scheduler.py / the TierManager, execution in worker.py /
the TierWorker. Load failures are recomputed: with the connector vLLM's kv_load_failure_policy is set to
"recompute" (a tier cache miss is never a request error). Connector errors are logged and turned into
misses or failed transfers, never raised into the engine (start-up configuration errors are raised).
"""

from __future__ import annotations

import logging
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorRole

from .common import Geometry, load_config
from .metadata import TierCacheMetadata

logger = logging.getLogger(__name__)


class TierCacheConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        _log_with_vllm()
        config = load_config(vllm_config)
        geometry = Geometry.from_vllm(vllm_config, kv_cache_config)
        self.scheduler = self.worker = None
        if role == KVConnectorRole.SCHEDULER:
            from .scheduler import ConnectorScheduler

            transfer = vllm_config.kv_transfer_config
            if transfer.kv_load_failure_policy != "recompute":
                logger.info(
                    "tiercache: kv_load_failure_policy %r → 'recompute'", transfer.kv_load_failure_policy
                )
                transfer.kv_load_failure_policy = "recompute"
            self.scheduler = ConnectorScheduler(config, geometry, vllm_config.parallel_config.world_size)
        else:
            from .worker import ConnectorWorker

            self.worker = ConnectorWorker(config, geometry)

    # ------------------------------------------------------------------ worker side
    def register_kv_caches(self, kv_caches) -> None:
        context = self._vllm_config.compilation_config.static_forward_context
        backends, isa = {}, None
        for name in kv_caches:
            backend = getattr(context.get(name), "attn_backend", None)
            backends[name] = backend.get_name() if backend is not None else ""
            if backends[name] == "CPU_ATTN":
                isa = getattr(context[name], "isa", None) or _cpu_isa(self._kv_cache_config)
        self.worker.register(kv_caches, backends, isa)

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        self.worker.start_step(self._get_connector_metadata())

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads are synchronous, done in start_load_kv

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs: Any) -> None:
        return  # stores read vLLM's cache once per step, in wait_for_save

    def wait_for_save(self) -> None:
        self.worker.finish_step(self._get_connector_metadata())

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self.worker.take_load_errors()

    def build_connector_worker_meta(self):
        return self.worker.take_report()

    def shutdown(self) -> None:
        if self.worker is not None:
            self.worker.shutdown()
        if self.scheduler is not None:
            self.scheduler.close()

    # ------------------------------------------------------------------ scheduler side
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int | None, bool]:
        try:
            return self.scheduler.num_matched_tokens(request, num_computed_tokens), False
        except Exception:
            logger.exception(
                "tiercache: lookup failed for request %s; treating as a miss", request.request_id
            )
            return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        block_ids = list(blocks.get_block_ids()[0])
        try:
            self.scheduler.after_alloc(request, block_ids, num_external_tokens)
        except Exception:
            logger.exception("tiercache: after_alloc failed for request %s; recomputing", request.request_id)
            self.scheduler.refuse_loads(request, block_ids, num_external_tokens)

    def build_connector_meta(self, scheduler_output) -> TierCacheMetadata:
        try:
            return self.scheduler.build_meta(scheduler_output)
        except Exception:
            logger.exception("tiercache: building connector metadata failed; this step stores nothing")
            return self.scheduler.failed_meta()

    def update_connector_output(self, connector_output) -> None:
        try:
            self.scheduler.on_worker_meta(connector_output.kv_connector_worker_meta)
        except Exception:
            logger.exception("tiercache: consuming worker reports failed")

    def request_finished(self, request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self.scheduler.request_finished(request.request_id)
        return False, None


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
