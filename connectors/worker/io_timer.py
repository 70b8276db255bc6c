"""Timing of the copies between vLLM's cache and the tiers, without a host sync on a GPU.

Provides:
    IoTimer(device)
        measure(direction, blocks, nbytes)   context manager around one load or store of a step
        take() -> list[IoSample]             what to report now, oldest first: every copy measured since the
                                             last take with its blocks and bytes, and the seconds of each
                                             copy whose timing has resolved (on a GPU, a copy's seconds come
                                             as their own sample, blocks and bytes 0, once its end event has
                                             completed: blocks and bytes are never held back)

On a GPU a copy's time is the time between two CUDA events recorded on the current stream around it (the
device time of the copy and of anything queued between, read with Event.query(), never a synchronize); on
a CPU it is the wall time of the call, which ran the copy to its end. At most MAX_PENDING timings wait
unresolved; older ones are then dropped with a warning, so a stalled device cannot grow this list.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Iterator

import torch

from tiercache.wire import IoSample

logger = logging.getLogger(__name__)
MAX_PENDING = 4096


class IoTimer:
    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._pending: deque[tuple[str, object, object]] = deque()  # direction, begin, end
        self._ready: list[IoSample] = []
        self.dropped = 0

    @contextlib.contextmanager
    def measure(self, direction: str, blocks: int, nbytes: int) -> Iterator[None]:
        if not self.cuda:
            start = time.perf_counter()
            yield
            self._ready.append(IoSample(direction, blocks, nbytes, time.perf_counter() - start))
            return
        begin = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        begin.record()
        yield
        end.record()
        self._ready.append(IoSample(direction, blocks, nbytes, 0.0))
        if len(self._pending) >= MAX_PENDING:
            self._pending.popleft()
            self.dropped += 1
            if self.dropped == 1:
                logger.warning(
                    "tiercache: more than %d copy timings unresolved; dropping the oldest", MAX_PENDING
                )
        self._pending.append((direction, begin, end))

    def take(self) -> list[IoSample]:
        while self._pending and self._pending[0][2].query():
            direction, begin, end = self._pending.popleft()
            self._ready.append(IoSample(direction, 0, 0, begin.elapsed_time(end) / 1e3))
        out, self._ready = self._ready, []
        return out

    @property
    def pending(self) -> int:
        return len(self._pending)
