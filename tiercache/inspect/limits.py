"""How much the inspection service may take from the engine and the machine, and give each client.

Provides:
    ServiceLimits        frozen: connection caps, per-connection deadlines, the CPU shares of the service
                         process and of the engine's thread that answers its point reads, its priority
    CpuBudget(share, burst, idle_share=None, others=None)   a token bucket of one thread's CPU time
        .charge(seconds)      after work (time.thread_time);  .pause() -> seconds to wait before the next work
                              (0: go on; at most MAX_PAUSE);  .rest() -> the same between turns, except that
                              once in debt it waits until the bucket holds RESUME again, so that the service
                              resumes with a batch of requests, not one (each turn has a fixed cost)
        .share_now() -> float  the share in force: `share` while the work it yields to runs (`others`: the
                              CPU seconds that work has used; by default this process's other threads, read
                              on the budgeted thread), else `idle_share`
    process_cpu(pid) -> Callable[[], float | None]   the CPU seconds process `pid` has used (all its
                              threads; None once it is gone): the service process's `others` (its engine)
    Bucket(rate, burst, now)  one client's CPU allowance (a connection's, or accepting's): .charge(seconds),
                              .wait(now) -> seconds until it may be served again (0: now)

The service runs in a process of its own (server.py), at a lower priority than the engine (`nice`), and
answers from a mirror of the engine's published state: it shares no GIL with the scheduler. What it may
take is CPU: its serving thread's CPU time over any stretch is capped at `cpu_share` of one core while the
engine's process uses CPU, at `idle_cpu_share` while it does not (plus one `cpu_burst`); when requests spend
the budget, the service stops reading, accepting and answering until the bucket refills. The one thing it
asks of the engine's process is a point read per `explain` (the block's entry, its graph counters); the
engine's thread that does those reads keeps to `engine_cpu_share` of wall time while the engine's other
threads run (the GIL it shares with the scheduler), `idle_cpu_share` while they are idle. Under the cap,
connections are served in the order of the CPU time each has cost so far (one request each per turn;
accepting new connections takes its place in the same order), so a client of heavy or hostile requests
cannot starve one of light ones, and no connection may take more than `client_cpu_share` of a core (nor may
accepting new connections): a client of many heavy requests waits for its own allowance, so that its share
of the service, and the CPU its own loop then uses, stay small, while one of the many light requests a
person or a dashboard sends never reaches it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

MAX_PAUSE = 0.5  # s: the longest the service stops for one debt
RESUME = 0.002  # s of CPU the bucket holds again before a paused service resumes (a batch, not one request)
WINDOW = 0.1  # s: how long the other threads must stay (almost) idle for the idle share to apply
BUSY_CPU = 0.002  # s of CPU the other threads use within a WINDOW that mean "the engine is running"
SAMPLE = 0.01  # s: the others' CPU time is read at most this often (a read of /proc costs ~10 µs)
MAX_NICE = 19


@dataclass(frozen=True)
class ServiceLimits:
    max_connections: int = 64  # when full, the longest-idle connection makes room (else: refused, with why)
    max_per_client: int = 8  # connections of one client process (SO_PEERCRED pid)
    idle_timeout: float = 5.0  # s without a request in progress → closed (the client reconnects on its own)
    request_timeout: float = 2.0  # s for a started frame to arrive whole, a reply to be taken, a point read
    evict_after: float = 1.0  # s idle before a connection may be closed to make room for a new one
    cpu_share: float = 0.25  # the service process's CPU time as a share of one core, while the engine runs
    idle_cpu_share: float = 0.5  # the same while the engine is idle; its point-read thread's too (at least
    # engine_cpu_share)
    cpu_burst: float = 0.02  # s of CPU it may spend at once (a burst of requests) before the share applies
    tick: float = 0.002  # s: while busy, events are gathered this long between turns (fewer, larger turns)
    engine_cpu_share: float = 0.03  # the engine's point-read thread, while the engine's other threads run
    client_cpu_share: float = 0.02  # what one connection may take (accepting too), as a share of one core
    nice: int = 0  # the service process's priority below the engine's (os.nice; 0: the same)

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_per_client"):
            if getattr(self, name) < 1:
                raise ValueError(f"ServiceLimits.{name} must be ≥ 1, got {getattr(self, name)}")
        shares = ("cpu_share", "engine_cpu_share", "client_cpu_share")
        for name in ("idle_timeout", "request_timeout", "cpu_burst", *shares):
            if not getattr(self, name) > 0:
                raise ValueError(f"ServiceLimits.{name} must be > 0, got {getattr(self, name)}")
        for name in shares:
            if getattr(self, name) > 1:
                got = getattr(self, name)
                raise ValueError(f"ServiceLimits.{name} is a share of one core, ≤ 1; got {got}")
        if not self.cpu_share <= self.idle_cpu_share <= 1:
            raise ValueError(
                f"ServiceLimits.idle_cpu_share must be between cpu_share ({self.cpu_share}) and 1, got "
                f"{self.idle_cpu_share}; set it to cpu_share for one fixed cap"
            )
        if not (isinstance(self.nice, int) and 0 <= self.nice <= MAX_NICE):
            raise ValueError(f"ServiceLimits.nice must be an integer 0..{MAX_NICE}, got {self.nice!r}")


class CpuBudget:
    def __init__(
        self,
        share: float,
        burst: float,
        idle_share: float | None = None,
        others: Callable[[], float | None] | None = None,
    ) -> None:
        self.busy_share, self.burst = share, burst
        self.idle_share = share if idle_share is None else idle_share
        self._others_cpu = others or _other_threads
        self._tokens = burst  # seconds of CPU the thread may still spend now
        self._last = time.monotonic()
        self._rate = share  # the share pause() last refilled at
        self._resting = False  # went into debt, and has not refilled RESUME since
        self._others: float | None = None  # the other threads' CPU time at the start of the window
        self._window = self._last  # when that window started
        self._busy_until = self._last + WINDOW  # strict until the other threads have been seen idle
        self._sampled = -SAMPLE  # when the others' CPU time was last read
        self._share = share

    def charge(self, seconds: float) -> None:
        self._tokens -= seconds

    def share_now(self) -> float:
        now = time.monotonic()
        if now - self._sampled < SAMPLE:
            return self._share
        self._sampled = now
        others = self._others_cpu()
        if others is None:  # unknown (the engine is gone): strict
            self._busy_until = now + WINDOW
        elif self._others is None or others - self._others >= BUSY_CPU:  # they run: strict from now on
            self._others, self._window, self._busy_until = others, now, now + WINDOW
        elif now - self._window >= WINDOW:  # a quiet window: start the next one
            self._others, self._window = others, now
        self._share = self.busy_share if now < self._busy_until else self.idle_share
        return self._share

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


class Bucket:
    __slots__ = ("burst", "last", "rate", "tokens")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate, self.burst, self.tokens, self.last = rate, burst, burst, now

    def charge(self, seconds: float) -> None:
        self.tokens -= seconds

    def wait(self, now: float) -> float:
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate


def _other_threads() -> float:
    return time.process_time() - time.thread_time()  # every other thread of this process


def process_cpu(pid: int) -> Callable[[], float | None]:
    """CPU seconds (user + system, every thread) process `pid` has used, read from /proc/<pid>/stat in clock
    ticks; None when it cannot be read (the process is gone, or no /proc: always counted as running)."""
    path, tick = f"/proc/{pid}/stat", os.sysconf("SC_CLK_TCK")

    def cpu() -> float | None:
        try:
            with open(path, "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            return None

    return cpu
