"""The engine's side of the channel to the service process: what its mirror has been sent, and the sending.

Provides:
    Feed(sock, state)   sock: a stream socket to the service process (made non-blocking here)
        .send(force=False)   the state's publish() calls it on the scheduler thread after a new snapshot: an
                             Update of what changed since the last one (everything, on a new channel), sent
                             as far as the socket takes it now; the rest goes out by flush(). Skipped while
                             the last one is going out, or would put the feed over SHARE (not when forced)
        .flush()             publish() calls it at every step: sends what the socket did not take (nothing
                             pending: one test)
        .catch_up(idle)      the engine's inspection thread calls it between its reads: once publish() has
                             not run for `idle` seconds (the engine stopped stepping), an Update of what was
                             recorded since the last one sent, with the snapshot last published
        .behind()            the state holds what no Update sent yet (any thread)
        .restart(sock)       a new channel (a new service process): a full Update, built and queued at once on
                             the calling thread (the state's rings are copied in C, safe while the scheduler
                             records)
        .close()             closes the channel (the service process sees its end: it exits)
        .pending, .socket    bytes queued that the socket has not taken yet; the channel (None once closed)
        .updates, .errors    Updates queued, and Updates that could not be built or encoded (logged)

Never blocks the scheduler: the socket is non-blocking, and while an Update is still going out no newer one
is built: the next one carries everything since the last one sent (the state's rings are bounded, so is any
Update). With force=True (the last publish; an in-process client's) it waits up to FORCE_WAIT for the
socket, so that a client asking the service right after sees what was published. What the scheduler thread
pays per Update is the encoding of the new decisions, departures and admissions and of the snapshot's
counters and block lists: a few µs for a step's worth, ~4 ms for the ~1,000 decisions, 2,000 departures and
128 admissions of 0.1 s of benchmarks/inspect_attack.py's loop. The feed keeps that within SHARE of the
scheduler thread's time: after an Update that took t, the next waits t / SHARE (the mirror is then that much
older: stats().snapshot_age_s says how old). Updates go out from publish(), at the engine's steps, and from
catch_up() once the steps stop: the requests, decisions and departures an engine recorded after its last sent
Update reach the mirror within `idle` seconds of its last step (the snapshot's counters are those of its last
publish: publish's min_interval leaves up to 0.1 s of them unpublished). catch_up's walks back over the
state's rings run off the scheduler thread: were the engine to step again meanwhile, the walk fails (a ring
mutated during iteration, or an entry gone) and catch_up leaves the Update to the next publish.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import threading
import time
from typing import TYPE_CHECKING

from tiercache.inspect.messages import Sizes, Update
from tiercache.inspect.protocol import HEADER
from tiercache.scheduler.events import DropEvent

if TYPE_CHECKING:
    from tiercache.inspect.state import InspectionState

logger = logging.getLogger(__name__)
FORCE_WAIT = 1.0  # s
SHARE = 0.02  # of the scheduler thread's time, at most, spent building and encoding Updates
LOG_EVERY = 60.0  # s between two log lines about updates that failed


class Feed:
    def __init__(self, sock: socket.socket, state: InspectionState) -> None:
        self._state = state
        self._lock = threading.Lock()  # the scheduler thread's send/flush against a restart on another thread
        self._sock: socket.socket | None = None
        self._out = bytearray()
        self._last_decision: object = None  # the newest decision sent
        self._departures = 0  # serial of the newest departure sent
        self._requests = 0  # serial of the newest admission sent
        self.updates = self.errors = 0
        self._logged = -LOG_EVERY
        self._not_before = 0.0  # (time.monotonic) the next Update's earliest time, after a costly one
        self._published = 0.0  # (time.monotonic) the scheduler's last flush: publish() flushes at every call
        self._version = 0  # the version of the snapshot last sent
        self.restart(sock)

    @property
    def pending(self) -> int:
        return len(self._out)

    @property
    def socket(self) -> socket.socket | None:
        return self._sock

    def restart(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        with self._lock:
            if self._sock is not None:
                self._sock.close()
            self._sock, self._out = sock, bytearray()
            self._queue(self._full)
            self._flush()

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
            self._sock = None

    def flush(self) -> None:
        self._published = time.monotonic()
        if self._out and self._lock.acquire(blocking=False):  # taken: a restart is queueing a full Update
            try:
                self._flush()
            finally:
                self._lock.release()

    def send(self, force: bool = False) -> None:
        if not self._lock.acquire(blocking=False):
            return  # a restart is queueing a full Update: it holds this snapshot already
        try:
            if self._out and force:
                self._drain(time.monotonic() + FORCE_WAIT)
            if self._out or self._sock is None:
                return  # the last one is still going out: the next one will carry this one's changes
            start = time.monotonic()
            if start < self._not_before and not force:
                return  # the last one was costly: this one's changes go with the next
            self._queue(self._delta)
            self._flush()
            self._not_before = start + (time.monotonic() - start) / SHARE
            if force:
                self._drain(time.monotonic() + FORCE_WAIT)
        finally:
            self._lock.release()

    def catch_up(self, idle: float) -> None:
        if self._out or self._sock is None or time.monotonic() - self._published < idle or not self.behind():
            return
        if not self._lock.acquire(blocking=False):
            return
        try:
            if self._out or self._sock is None:
                return
            try:
                update = self._delta()
            except (RuntimeError, KeyError):  # the scheduler recorded meanwhile (a ring changed under the
                return  # walk): it steps again, and its publish sends
            self._queue(lambda: update)
            self._flush()
        finally:
            self._lock.release()

    def behind(self) -> bool:
        """The state holds something the last Update sent did not (reads of single attributes: any thread)."""
        state, snapshot = self._state, self._state.snapshot
        decisions = state.decisions
        newest = decisions[-1] if decisions else None
        return (
            (snapshot is not None and snapshot.version != self._version)
            or state.requests.serial != self._requests
            or state.departures.serial != self._departures
            or (newest is not None and newest is not self._last_decision)
        )

    # ----------------------------------------------------------------- under the lock
    def _full(self) -> Update:
        state = self._state
        marked = state.departures.serial  # before the copy: a departure in both is sent twice, harmlessly
        decisions = tuple(state.decisions)  # copies made in C: safe while the scheduler thread records
        departures, requests = state.departures.since(0), state.requests.since(0)
        self._mark(decisions, marked, requests, state.snapshot)
        sizes = Sizes(state.decisions.maxlen or 0, state.requests.size, state.departures.size)
        return Update(
            snapshot=state.snapshot, decisions=decisions, departures=_departures(departures),
            requests=tuple(r for _, r in requests), forgotten=state.departures.forgotten, full=sizes,
        )  # fmt: skip

    def _delta(self) -> Update:
        state = self._state
        marked, snapshot = state.departures.serial, state.snapshot  # before the walks (as _full)
        decisions = self._new_decisions()
        departures, requests = state.departures.since(self._departures), state.requests.since(self._requests)
        self._mark(decisions, marked, requests, snapshot)
        return Update(
            snapshot=snapshot, decisions=decisions, departures=_departures(departures),
            requests=tuple(r for _, r in requests), forgotten=state.departures.forgotten,
        )  # fmt: skip

    def _new_decisions(self) -> tuple:
        """The decisions kept since the last Update: a walk back from the end of the scheduler thread's own
        ring to the newest one sent (identity: the ring is first in, first out; not found, all are new)."""
        new, last = [], self._last_decision
        for e in reversed(self._state.decisions):
            if e is last:
                break
            new.append(e)
        new.reverse()
        return tuple(new)

    def _mark(self, decisions: tuple, departures: int, requests: list, snapshot) -> None:
        if snapshot is not None:
            self._version = snapshot.version
        if decisions:
            self._last_decision = decisions[-1]
        self._departures = departures
        if requests:
            self._requests = requests[-1][0]

    def _queue(self, build) -> None:
        try:
            body = build().encode()
        except Exception as exc:  # a bug (a value msgpack cannot take): the mirror misses this Update, say so
            self.errors += 1
            now = time.monotonic()
            if now - self._logged >= LOG_EVERY:
                self._logged = now
                logger.warning(
                    "tiercache inspect: an update for the service process failed (%s: %s; %d so far); its "
                    "answers miss what changed since the last one sent",
                    type(exc).__name__, exc, self.errors,
                )  # fmt: skip
            return
        self._out += HEADER.pack(len(body)) + body
        self.updates += 1

    def _flush(self) -> None:
        if not self._out or self._sock is None:
            return
        try:
            sent = self._sock.send(self._out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # the service process is gone: the supervisor restarts it (server.py), or not
            self._out.clear()
            return
        del self._out[:sent]

    def _drain(self, deadline: float) -> None:
        while self._out and self._sock is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            with contextlib.suppress(OSError, ValueError):
                select.select([], [self._sock], [], left)
            self._flush()


def _departures(events: list) -> tuple:
    """What the mirror keeps of departures (mirror.LastDepartures): a drop's event, else the block's hash."""
    return tuple(e if isinstance(e, DropEvent) else e.block_hash for e in events)
