"""What the inspection service serves: counters and recent decisions fed by the scheduler thread, published
as immutable snapshots (read without locks by in-process clients) and sent to the service process's mirror
by each attached feed (feed.py).

Provides:
    InspectionState(max_decisions=1000, max_blocks=256, max_ttft=10_000, bytes_per_block=None,
                    min_interval=0.1, recent_requests=128, remembered_departures=65_536)
                                            bytes_per_block: {"vram": n, "dram": n} adds bytes to tiers()
        record(events)                      scheduler thread, every step: counters + recent decisions (cheap:
                                            a few dict increments per event; decisions are kept as the
                                            frozen events themselves, converted only when someone asks),
                                            and each block's last departure (request_log.Departures)
        record_tokens(loaded, recomputed)   tokens served from the tiers vs computed by vLLM (optional)
        record_request(record)              one admission (request_log.RequestRecord), for explain_request
        record_io(direction, blocks, nbytes, seconds)   a timed copy: load, store (IoSample), spill, warm
        record_disk(**counts)               the disk tier's block counts, as counters disk_<name>
        record_failure(cause)               a failed load, by cause (events.CAUSES); failed stores and moves
                                            are counted from their events
        counters                            cumulative, plain ints: what stats() and vLLM's metrics read
        record_ttft(seconds, hit)           one time-to-first-token sample, with or without a cache hit
        close()                             leave the in-process registry (optional; a dropped state leaves)
        publish(view, force=False) -> bool  builds a Snapshot of a ManagerView (manager.view()) and swaps it
                                            in by one reference assignment, at most every min_interval
                                            seconds (0.1) unless force; then each attached feed sends what
                                            changed (every call first lets the feeds flush what is pending)
        attach(feed) / detach(feed)         a service's feed (server.py does both)
        snapshot                            the latest Snapshot (None before the first publish)
        view                                the ManagerView last published (for point reads: explain)
    Snapshot                                (snapshot.py) frozen; plain data only, never mutated after
                                            publication
    Feed                                    what attach expects: flush() and send(force)
    DECISION_KINDS                          event kinds kept as decisions
    live_states() -> list[InspectionState]  this process's live states, newest first (the in-process client)

Decisions kept: every EvictionEvent, DropEvent and DeclineEvent (a block the policy's admission control
did not store), warms (MoveEvents towards VRAM) when planned (a load hit or
prefetch) or failed, spills when failed (a planned spill is already described by its EvictionEvent;
completions are counted, not kept).
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from tiercache.inspect.request_log import Departures, RequestLog, RequestRecord
from tiercache.inspect.snapshot import Snapshot
from tiercache.scheduler.events import TierEvent, cause_of
from tiercache.wire import TIERS, TRANSFER_DIRECTIONS

if TYPE_CHECKING:  # views.py imports the allocators (and torch): the service process reads BlockRows instead
    from tiercache.scheduler.views import ManagerView, TierView

DECISION_KINDS = ("eviction", "drop", "decline", "warm", "spill")
_KEEP_STAGES = {"warm": ("planned", "failed"), "spill": ("failed",)}
_HIT_KEY = {tier: "hits_" + tier for tier in TIERS}
_FROM_KEY = {tier: "evictions_from_" + tier for tier in TIERS}
_MOVE_KEY = {(k, s): f"{k}s_{s}" for k in ("spill", "warm") for s in ("planned", "done", "failed")}
_IO_KEYS = {d: (f"io_{d}_blocks", f"io_{d}_bytes", f"io_{d}_us") for d in TRANSFER_DIRECTIONS}
_COUNTERS = (
    *_HIT_KEY.values(), *_FROM_KEY.values(), *_MOVE_KEY.values(), "events", "misses", "stores",
    "store_failures", "evictions", "evictions_dropped", "drops", "declines", "tokens_loaded",
    "tokens_recomputed",
    *(key for keys in _IO_KEYS.values() for key in keys),
)  # fmt: skip
_LIVE: list[weakref.ref] = []
_LIVE_LOCK = threading.Lock()


class Feed(Protocol):
    """What publish drives in an attached feed (feed.Feed): flush() sends what is pending, send(force) what
    changed since the last send."""

    def flush(self) -> None: ...

    def send(self, force: bool) -> None: ...


class InspectionState:
    def __init__(
        self,
        max_decisions: int = 1000,
        max_blocks: int = 256,
        max_ttft: int = 10_000,
        bytes_per_block: Mapping[str, int] | None = None,
        min_interval: float = 0.1,
        recent_requests: int = 128,
        remembered_departures: int = 65_536,
    ) -> None:
        if max_decisions < 1 or max_blocks < 0 or max_ttft < 1:
            raise ValueError(
                f"InspectionState: max_decisions and max_ttft must be ≥ 1 and max_blocks ≥ 0, got "
                f"{max_decisions}, {max_ttft}, {max_blocks}"
            )
        self.max_blocks = max_blocks
        self.min_interval = min_interval
        self.bytes_per_block = dict(bytes_per_block or {})
        self.counters: dict[str, int] = dict.fromkeys(_COUNTERS, 0)  # a plain dict: the fastest += path
        self.decisions: deque[TierEvent] = deque(maxlen=max_decisions)
        self.ttft: dict[bool, deque[float]] = {True: deque(maxlen=max_ttft), False: deque(maxlen=max_ttft)}
        self.requests = RequestLog(recent_requests)
        self.departures = Departures(remembered_departures)
        self.snapshot: Snapshot | None = None
        self.view: ManagerView | None = None
        self.owner_thread: int | None = None  # the thread that records (the scheduler's)
        self.started_wall = time.time()
        self._published_at = -float("inf")
        self._ttft_summary: dict[str, Any] = {"hit": None, "miss": None}
        self._ttft_dirty = False
        self._feeds: tuple[Feed, ...] = ()  # replaced whole (attach/detach run on other threads)
        with _LIVE_LOCK:
            _LIVE[:] = [r for r in _LIVE if r() is not None]
            _LIVE.append(weakref.ref(self))

    @property
    def pid(self) -> int:
        """The engine's process (this one)."""
        return os.getpid()

    def attach(self, feed: Feed) -> None:
        self._feeds = (*self._feeds, feed)

    def detach(self, feed: Feed) -> None:
        self._feeds = tuple(f for f in self._feeds if f is not feed)

    def close(self) -> None:
        """Leave this process's registry of live states (connect() stops finding it in-process)."""
        with _LIVE_LOCK:
            _LIVE[:] = [r for r in _LIVE if r() not in (None, self)]

    # ----------------------------------------------------------------- scheduler thread
    def record(self, events: Iterable[TierEvent]) -> None:
        c, keep, departed = self.counters, self.decisions.append, self.departures.record
        self.owner_thread = threading.get_ident()
        n = 0
        for e in events:
            n += 1
            kind = e.kind
            if kind == "hit":
                c[_HIT_KEY[e.tier]] += 1
            elif kind == "spill" or kind == "warm":
                c[_MOVE_KEY[kind, e.stage]] += 1
                if e.stage in _KEEP_STAGES[kind]:
                    keep(e)
                if e.stage == "failed":
                    _add(c, "failures_transfer_failed")
            elif kind == "eviction":
                c["evictions"] += 1
                _add(c, "evictions_by_" + e.policy)
                c[_FROM_KEY[e.tier_from]] += 1
                if e.tier_to is None:
                    c["evictions_dropped"] += 1
                    departed(e)
                _add(c, f"evicted_{'spill' if e.tier_to else 'drop'}_by_{e.policy}")
                keep(e)
            elif kind == "store":
                if e.stored:
                    c["stores"] += 1
                else:
                    c["store_failures"] += 1
                    _add(c, "failures_" + cause_of(e.reason))
                    departed(e)
            elif kind == "miss":
                c["misses"] += 1
            elif kind == "drop":
                c["drops"] += 1
                departed(e)
                keep(e)
            elif kind == "decline":
                c["declines"] += 1
                _add(c, "declined_by_" + e.policy)
                departed(e)
                keep(e)
        c["events"] += n

    def record_tokens(self, loaded: int = 0, recomputed: int = 0) -> None:
        self.counters["tokens_loaded"] += loaded
        self.counters["tokens_recomputed"] += recomputed

    def record_request(self, record: RequestRecord) -> None:
        self.requests.add(record)

    def record_io(self, direction: str, blocks: int, nbytes: int, seconds: float) -> None:
        c = self.counters
        k_blocks, k_bytes, k_us = _IO_KEYS[direction]
        c[k_blocks] += blocks
        c[k_bytes] += nbytes
        c[k_us] += round(seconds * 1e6)

    def record_remote(self, **counts: int) -> None:
        """The remote tier's block counts (lookups, found, fetched, fetch_failures, uploads; the workers'
        written, dropped_full, write_failures) as counters remote_<name>: present only once a remote tier
        counted something."""
        for name, n in counts.items():
            if n:
                self.counters["remote_" + name] = self.counters.get("remote_" + name, 0) + n

    def record_disk(self, **counts: int) -> None:
        """The disk tier's block counts (hits: found by admissions; read, read_failures, writes (planned),
        drops (planned); the workers' written, already_stored, dropped_full, write_failures, bad_values,
        vanished) and bytes (read_bytes, written_bytes: over all ranks) as counters disk_<name>: present
        only once a disk tier counted something."""
        for name, n in counts.items():
            if n:
                self.counters["disk_" + name] = self.counters.get("disk_" + name, 0) + n

    def record_failure(self, cause: str) -> None:
        _add(self.counters, "failures_" + cause)

    def record_ttft(self, seconds: float, hit: bool) -> None:
        self.ttft[bool(hit)].append(float(seconds))
        self._ttft_dirty = True

    def publish(self, view: ManagerView, force: bool = False) -> bool:
        """Build and publish a snapshot of a manager's view and the recorded counters; returns False (doing
        nothing) when the last one is younger than min_interval and not force."""
        feeds = self._feeds
        for feed in feeds:
            feed.flush()
        now = time.monotonic()
        if not force and now - self._published_at < self.min_interval:
            return False
        self._published_at = now
        self.view = view
        if self._ttft_dirty:
            self._ttft_summary = {"hit": _summary(self.ttft[True]), "miss": _summary(self.ttft[False])}
            self._ttft_dirty = False
        previous = self.snapshot
        self.snapshot = Snapshot(
            version=(previous.version + 1) if previous else 1,
            wall_time=time.time(),
            clock_time=view.clock(),
            pid=os.getpid(),
            started_wall=self.started_wall,
            policy=str(getattr(view.policy, "name", type(view.policy).__name__)),
            codec_id=str(view.codec_id),
            manager_stats=view.stats(),
            counters=dict(self.counters),
            tiers=tuple(self._tier(tier) for tier in view.tiers()),
            decisions=tuple(self.decisions),
            blocks={tier: tuple(view.blocks(tier, self.max_blocks)) for tier in TIERS},
            ttft=dict(self._ttft_summary),
        )
        for feed in feeds:
            feed.send(force)
        return True

    def _tier(self, tier: TierView) -> dict[str, Any]:
        out = {
            "name": tier.name,
            "capacity_blocks": tier.capacity_blocks,
            "used_slots": tier.used_slots,
            "free_slots": tier.free_slots,
            "stored_blocks": tier.stored_blocks,
        }
        per_block = self.bytes_per_block.get(tier.name)
        if per_block:
            out["capacity_bytes"] = tier.capacity_blocks * per_block
            out["used_bytes"] = tier.used_slots * per_block
        return out


def _add(counters: dict[str, int], key: str) -> None:
    counters[key] = counters.get(key, 0) + 1


def live_states() -> list[InspectionState]:
    with _LIVE_LOCK:
        states = [r() for r in _LIVE]
    return [s for s in reversed(states) if s is not None]


def _summary(samples: deque[float]) -> dict[str, float] | None:
    if not samples:
        return None
    ordered = sorted(samples)
    n = len(ordered)
    return {
        "count": n,
        "mean_s": sum(ordered) / n,
        "p50_s": ordered[(n - 1) // 2],
        "p90_s": ordered[min(n - 1, int(0.9 * n))],
    }
