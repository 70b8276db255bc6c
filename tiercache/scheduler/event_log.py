"""The TierManager's event log: decisions as data (STYLE.md rule 6), numbered, shown to the eviction policy,
and kept until the caller drains them.

Provides:
    EventLog(codec_id, policy, clock, max_events)
        emit(event_type, block_hash, reason, **fields)   build the event (seq, time, codec id), policy.observe
                                                         it, keep it
        take() -> list[TierEvent]                        the events kept since the last take
        dropped                                          events not kept: max_events were waiting undrained

A policy that fails to observe an event is logged, never raised (a policy bug must not break the cache).
Past max_events undrained, new events are counted in `dropped` and not kept (one warning).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from tiercache.scheduler.events import TierEvent
from tiercache.scheduler.policies.base import EvictionPolicy

logger = logging.getLogger(__name__)


class EventLog:
    def __init__(
        self, codec_id: str, policy: EvictionPolicy, clock: Callable[[], float], max_events: int
    ) -> None:
        self.codec_id = codec_id
        self.policy = policy
        self.clock = clock
        self.max_events = max_events
        self.dropped = 0
        self._observes = type(policy).observe is not EvictionPolicy.observe
        self._events: list[TierEvent] = []
        self._seq = 0

    def emit(self, event_type: type[TierEvent], block_hash: bytes, reason: str, **fields) -> None:
        self._seq += 1
        event = event_type(self._seq, self.clock(), block_hash, self.codec_id, reason, **fields)
        if self._observes:
            try:
                self.policy.observe(event)
            except Exception:
                logger.exception("tiercache: eviction policy %s failed to observe an event", self.policy.name)
        if len(self._events) >= self.max_events:
            if not self.dropped:
                logger.warning("tiercache: %d events not drained; dropping new ones", len(self._events))
            self.dropped += 1
            return
        self._events.append(event)

    def take(self) -> list[TierEvent]:
        events, self._events = self._events, []
        return events
