"""Who gets a place among the inspection service's connections (server thread).

Provides:
    admit(conns, pid, now, limits) -> (refusal, leaving)   for a newcomer of process `pid` (None: unknown):
        refusal: None to serve it, else why not (sent to it before the close); leaving: the connections to
        close first. Only when a limit is reached: connections whose peer has closed leave at once (they
        never hold a place), then, for a full service, one other makes room (make_room)
    make_room(conns, now, limits) -> Connection | None   the longest idle for `evict_after` (nothing received
        and unanswered, in the service's buffer or the kernel's; no reply owed), else the one stalled
        longest in the middle of a frame (begun `evict_after` ago, its rest not arrived); None when every
        connection has a request in progress
    hung_up(conns) -> list[Connection]    those whose peer has closed its end (poll: POLLHUP / POLLERR)

A connection whose request has arrived (whole or being sent) or is being answered is never chosen: a newcomer
is refused instead, and told to retry.
"""

from __future__ import annotations

import select
from collections.abc import Sequence

from tiercache.inspect.connection import Connection
from tiercache.inspect.limits import ServiceLimits

_GONE = getattr(select, "POLLHUP", 0) | getattr(select, "POLLERR", 0) | getattr(select, "POLLNVAL", 0)


def admit(
    conns: Sequence[Connection], pid: int | None, now: float, limits: ServiceLimits
) -> tuple[str | None, list[Connection]]:
    mine = lambda cs: sum(c.pid == pid for c in cs) if pid is not None else 0
    full = len(conns) >= limits.max_connections or mine(conns) >= limits.max_per_client
    gone = hung_up(conns) if full else []
    live = [c for c in conns if c not in gone] if gone else list(conns)
    if mine(live) >= limits.max_per_client:
        return (
            f"too many inspection connections from process {pid} ({limits.max_per_client}); reuse "
            "one (an InspectClient is thread-safe) or close some"
        ), gone
    if len(live) < limits.max_connections:
        return None, gone
    victim = make_room(live, now, limits)
    if victim is None:
        return (
            f"too many inspection clients ({limits.max_connections}), none idle for {limits.evict_after:g}s; "
            "retry in a moment"
        ), gone
    return None, [*gone, victim]


def make_room(conns: Sequence[Connection], now: float, limits: ServiceLimits) -> Connection | None:
    after = limits.evict_after
    oldest_first = sorted((c for c in conns if c.quiet and now - c.last >= after), key=lambda c: c.last)
    idle = next((c for c in oldest_first if c.idle(now, after)), None)  # its syscall for the few that qualify
    if idle is not None:
        return idle
    slow = sorted((c for c in conns if c.frame_since is not None), key=lambda c: c.frame_since or now)
    return next((c for c in slow if c.stalled(now, after)), None)


def hung_up(conns: Sequence[Connection]) -> list[Connection]:
    if not hasattr(select, "poll"):
        return []
    poller, by_fd = select.poll(), {}
    for conn in conns:
        fd = conn.sock.fileno()
        if fd >= 0:
            poller.register(fd, 0)  # no events asked: poll reports hang-ups and errors regardless
            by_fd[fd] = conn
    return [by_fd[fd] for fd, events in poller.poll(0) if events & _GONE]
