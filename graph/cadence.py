"""When the advisor's thread ranks: soon after the graph changes, for a bounded share of the time.

Provides `run_cycles(ref, stop, interval_s)` (the body of `GraphEvictionAdvisor`'s thread), `rest_after`,
`MIN_GAP_S` and `BUSY_FACTOR`. The schedule, after a cycle that took `d` seconds (wall clock):
- the next cycle starts no sooner than max(MIN_GAP_S, BUSY_FACTOR × d) after this one ended: the thread
  ranks at most 1 / (1 + BUSY_FACTOR) of the time (20 %), and leaves the GIL to the engine's scheduler the
  rest of it;
- from then on it starts as soon as the graph has changed since this cycle began (`graph.changes`, a sum
  of counters the notifications keep under the graph's lock, polled every MIN_GAP_S: the hot path
  signals nothing);
- changed or not, it starts at the latest `interval_s` after this one ended: the longest wait, which
  also caps the rest, so that a snapshot is renewed at least as often as on a fixed `interval_s` schedule
  (a cycle longer than interval_s / BUSY_FACTOR, e.g. under GIL contention, runs on exactly that one).
The thread holds the advisor only during a cycle or a poll, so dropping the advisor ends the thread.
"""

from __future__ import annotations

import threading
import time
import weakref

MIN_GAP_S = 0.01  # the shortest rest between cycles, and how often a resting thread looks for a change
BUSY_FACTOR = 4.0  # a rest lasts at least this many times the cycle before it: busy ≤ 1 / (1 + 4) of the time


def rest_after(cycle_s: float, interval_s: float) -> float:
    """Seconds from the end of a cycle that took `cycle_s` before the next one may start."""
    return min(max(MIN_GAP_S, BUSY_FACTOR * cycle_s), interval_s)


def run_cycles(ref: weakref.ref, stop: threading.Event, interval_s: float) -> None:
    """Rank (`advisor.refresh()`) on the schedule above until `stop` is set or the advisor is dropped."""
    while not stop.is_set():
        advisor = ref()
        if advisor is None:
            return
        seen = advisor.graph.changes  # read before the cycle: a change during it runs the next one
        start = time.monotonic()
        advisor.refresh()
        ended = time.monotonic()
        del advisor
        earliest = ended + rest_after(ended - start, interval_s)
        if not _wait_for_change(ref, stop, seen, earliest, ended + interval_s):
            return


def _wait_for_change(
    ref: weakref.ref, stop: threading.Event, seen: int, earliest: float, latest: float
) -> bool:
    """Sleep until `earliest`, then until the graph's `changes` differs from `seen` or `latest` comes;
    False when the thread should end instead (stopped, or the advisor dropped)."""
    wake = earliest
    while not stop.wait(max(wake - time.monotonic(), 0.0)):
        advisor = ref()
        if advisor is None:
            return False
        changed = advisor.graph.changes != seen
        del advisor
        now = time.monotonic()
        if changed or now >= latest:
            return True
        wake = min(now + MIN_GAP_S, latest)
    return False
