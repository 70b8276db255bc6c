"""How much the inspection service may take from the engine it runs in, and from each client.

Provides:
    ServiceLimits        frozen: connection caps, per-connection deadlines, the service thread's CPU share
    CpuBudget(share, burst)   a token bucket of the service thread's CPU time (time.thread_time):
        .charge(seconds)      after work;  .pause() -> seconds to wait before the next work (0: go on;
                              at most MAX_PAUSE)

The service thread shares the scheduler's process, and so its GIL: every millisecond it computes is a
millisecond the scheduler may wait. So it works in short slices (each request is bounded, see handlers.py),
and its CPU time over any stretch is capped at `cpu_share` of wall time (plus one `cpu_burst`): when a
flood of requests spends the budget, the service stops reading, accepting and answering until the bucket
refills; clients wait, the scheduler does not. Under that cap, connections are served in the order of the CPU
time each has cost so far (one request each per turn; accepting new connections takes its place in the same
order), so a client of heavy or hostile requests cannot starve one of light ones.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

MAX_PAUSE = 0.5  # s: the longest the service stops for one debt


@dataclass(frozen=True)
class ServiceLimits:
    max_connections: int = 32  # when full, the longest-idle connection makes room (else: refused, with why)
    max_per_client: int = 8  # connections of one client process (SO_PEERCRED pid)
    idle_timeout: float = 5.0  # s without a request in progress → closed (the client reconnects on its own)
    request_timeout: float = 2.0  # s for a started frame to arrive whole, or a reply to be taken
    evict_after: float = 1.0  # s idle before a connection may be closed to make room for a new one
    cpu_share: float = 0.03  # the service thread's CPU time as a share of wall time
    cpu_burst: float = 0.02  # s of CPU it may spend at once (a burst of requests) before the share applies
    tick: float = 0.002  # s: while busy, events are gathered this long between turns (fewer GIL handoffs)

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_per_client"):
            if getattr(self, name) < 1:
                raise ValueError(f"ServiceLimits.{name} must be ≥ 1, got {getattr(self, name)}")
        for name in ("idle_timeout", "request_timeout", "cpu_share", "cpu_burst"):
            if not getattr(self, name) > 0:
                raise ValueError(f"ServiceLimits.{name} must be > 0, got {getattr(self, name)}")
        if self.cpu_share > 1:
            raise ValueError(f"ServiceLimits.cpu_share is a share of one core, ≤ 1; got {self.cpu_share}")


class CpuBudget:
    def __init__(self, share: float, burst: float) -> None:
        self.share, self.burst = share, burst
        self._tokens = burst  # seconds of CPU the thread may still spend now
        self._last = time.monotonic()

    def charge(self, seconds: float) -> None:
        self._tokens -= seconds

    def pause(self) -> float:
        """Seconds to wait until the bucket is no longer in debt (0 when work may go on now); at most
        MAX_PAUSE: one rare long slice (a garbage collection that happened to run on this thread) delays
        the clients for half a second, not for its whole cost / share."""
        now = time.monotonic()
        tokens = min(self.burst, self._tokens + (now - self._last) * self.share)
        self._tokens = max(tokens, -MAX_PAUSE * self.share)
        self._last = now
        return 0.0 if self._tokens >= 0 else -self._tokens / self.share
