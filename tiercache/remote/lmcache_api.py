"""The LMCache names the remote store uses, imported once, and two helpers around them.

Provides:
    lmcache() -> LMCacheApi     ObjectKey, MemoryObjMetadata, TensorMemoryObj, create_l2_adapter, config_class
                                (TierCacheError naming the install command when LMCache is missing)
    memory_obj(api, tensor)     an LMCache memory object over a contiguous CPU uint8 tensor (no copy)
    close_aside(adapter, buffers)   close an adapter in a daemon thread (its threads may be blocked on a dead
                                or wedged connection), then let go of the buffers its calls may still write
"""

from __future__ import annotations

import importlib
import logging
import threading
from typing import Any

import torch

from tiercache.config_remote import INSTALL_HINT
from tiercache.errors import TierCacheError

logger = logging.getLogger(__name__)


class LMCacheApi:
    def __init__(self) -> None:
        api = importlib.import_module("lmcache.v1.distributed.api")
        mm = importlib.import_module("lmcache.v1.memory_management")
        adapters = importlib.import_module("lmcache.v1.distributed.l2_adapters")
        config = importlib.import_module("lmcache.v1.distributed.l2_adapters.config")
        self.ObjectKey = api.ObjectKey
        self.MemoryObjMetadata = mm.MemoryObjMetadata
        self.TensorMemoryObj = mm.TensorMemoryObj
        self.create_l2_adapter = adapters.create_l2_adapter
        self.config_class = config.get_l2_adapter_config_class


_API: LMCacheApi | None = None


def lmcache() -> LMCacheApi:
    global _API
    if _API is None:
        try:
            _API = LMCacheApi()
        except ImportError as exc:
            raise TierCacheError(
                f"the remote tier needs LMCache ({exc}); install it with {INSTALL_HINT}"
            ) from None
    return _API


def memory_obj(api: LMCacheApi, tensor: torch.Tensor) -> Any:
    assert tensor.is_contiguous() and tensor.device.type == "cpu" and tensor.dtype == torch.uint8
    meta = api.MemoryObjMetadata(
        shape=tensor.shape, dtype=tensor.dtype, address=0, phy_size=tensor.numel(), ref_count=1
    )
    return api.TensorMemoryObj(tensor, meta, None)


def close_aside(adapter: Any, buffers: list[Any]) -> None:
    threading.Thread(target=_close, args=(adapter, buffers), daemon=True).start()


def _close(adapter: Any, buffers: list[Any]) -> None:
    try:
        adapter.close()
    except Exception:
        logger.exception("tiercache: closing a replaced remote adapter")
    buffers.clear()
