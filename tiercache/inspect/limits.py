"""How much the inspection service may take from the engine it runs in, and from each client.

Provides:
    ServiceLimits        frozen: connection caps, per-connection deadlines, the service thread's CPU shares
    CpuBudget(share, burst, idle_share=None)   a token bucket of the service thread's CPU time
        .charge(seconds)      after work (time.thread_time);  .pause() -> seconds to wait before the next work
                              (0: go on; at most MAX_PAUSE);  .rest() -> the same between turns, except that
                              once in debt it waits until the bucket holds RESUME again, so that the service
                              resumes with a batch of requests, not one (each turn has a fixed cost)
        .share_now() -> float  the share in force: `share` while the process's other threads run, else
                              `idle_share`; on the service thread only (it tells its CPU time from theirs)

The service thread shares the scheduler's process, and so its GIL: every millisecond it computes is a
millisecond the scheduler may wait. So it works in short slices (each request is bounded, see handlers.py),
and while the engine runs, its CPU time over any stretch is capped at `cpu_share` of wall time (plus one
`cpu_burst`): when a flood of requests spends the budget, the service stops reading, accepting and answering
until the bucket refills; clients wait, the scheduler does not. While the process's other threads are idle
(an engine with no requests: nobody waits for the GIL), the cap is `idle_cpu_share` instead, so that many
clients are answered in milliseconds; the other threads using BUSY_CPU within a WINDOW brings the strict share
back at once. Under the cap, connections are served in the order of the CPU time each has cost so far (one
request each per turn; accepting new connections takes its place in the same order), so a client of heavy
or hostile requests cannot starve one of light ones.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

MAX_PAUSE = 0.5  # s: the longest the service stops for one debt
RESUME = 0.002  # s of CPU the bucket holds again before a paused service resumes (a batch, not one request)
WINDOW = 0.1  # s: how long the other threads must stay (almost) idle for the idle share to apply
BUSY_CPU = 0.002  # s of CPU the other threads use within a WINDOW that mean "the engine is running"


@dataclass(frozen=True)
class ServiceLimits:
    max_connections: int = 64  # when full, the longest-idle connection makes room (else: refused, with why)
    max_per_client: int = 8  # connections of one client process (SO_PEERCRED pid)
    idle_timeout: float = 5.0  # s without a request in progress → closed (the client reconnects on its own)
    request_timeout: float = 2.0  # s for a started frame to arrive whole, or a reply to be taken
    evict_after: float = 1.0  # s idle before a connection may be closed to make room for a new one
    cpu_share: float = 0.03  # the service thread's CPU time as a share of wall time, while the engine runs
    idle_cpu_share: float = 0.5  # the same while the process's other threads are idle (nobody to starve)
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
        if not self.cpu_share <= self.idle_cpu_share <= 1:
            raise ValueError(
                f"ServiceLimits.idle_cpu_share must be between cpu_share ({self.cpu_share}) and 1, got "
                f"{self.idle_cpu_share}; set it to cpu_share for one fixed cap"
            )


class CpuBudget:
    def __init__(self, share: float, burst: float, idle_share: float | None = None) -> None:
        self.busy_share, self.burst = share, burst
        self.idle_share = share if idle_share is None else idle_share
        self._tokens = burst  # seconds of CPU the thread may still spend now
        self._last = time.monotonic()
        self._rate = share  # the share pause() last refilled at
        self._resting = False  # went into debt, and has not refilled RESUME since
        self._others: float | None = None  # the other threads' CPU time at the start of the window
        self._window = self._last  # when that window started
        self._busy_until = self._last + WINDOW  # strict until the other threads have been seen idle

    def charge(self, seconds: float) -> None:
        self._tokens -= seconds

    def share_now(self) -> float:
        now = time.monotonic()
        others = time.process_time() - time.thread_time()  # every other thread of this process
        if self._others is None or others - self._others >= BUSY_CPU:  # they run: strict from now on
            self._others, self._window, self._busy_until = others, now, now + WINDOW
        elif now - self._window >= WINDOW:  # a quiet window: start the next one
            self._others, self._window = others, now
        return self.busy_share if now < self._busy_until else self.idle_share

    def pause(self) -> float:
        """Seconds to wait until the bucket is no longer in debt (0 when work may go on now); at most
        MAX_PAUSE: one rare long slice (a garbage collection that happened to run on this thread) delays
        the clients for half a second, not for its whole cost / share."""
        now, share = time.monotonic(), self.share_now()
        tokens = min(self.burst, self._tokens + (now - self._last) * share)
        self._tokens = max(tokens, -MAX_PAUSE * share)
        self._last, self._rate = now, share
        return 0.0 if self._tokens >= 0 else -self._tokens / share

    def rest(self) -> float:
        """Seconds to wait before the next turn: pause(), and once in debt, until the bucket holds RESUME
        again (at most the burst). Resuming at zero, a flood is served one request per turn, and the turn's
        fixed cost (select, the fair order, the deadlines) becomes most of the budget."""
        self._resting = self.pause() > 0 or self._resting
        wait = (min(RESUME, self.burst) - self._tokens) / self._rate if self._resting else 0.0
        self._resting = wait > 0
        return max(wait, 0.0)
