"""The engine's inspection state as the service process holds it, rebuilt from the engine's Updates.

Provides:
    Mirror(engine_pid)   what handlers.handle answers from in the service process, with the attributes it
                         reads of an InspectionState: snapshot (the engine's latest, with the decisions it
                         kept), requests (RequestLog), departures (LastDepartures), pid (the engine's), view
                         (None: no live state here, so explain defers its point reads to the engine),
                         connections (the service's open connections, set by its loop)
        .apply(update)   the engine's next Update; a full one starts over, with the engine's ring sizes
        .updates         Updates applied
    LastDepartures(size) the engine's Departures as explain_request reads them: for each of the `size` most
                         recently departed blocks, its last departure when that was a drop (the event), else
                         None (why.py asks only about drops: a hit whose load then failed); kept in the same
                         order as the engine's, so the same blocks are forgotten. .get(hash), .forgotten

How old an answer can be: the engine publishes at most every 0.1 s (InspectionState.min_interval) and sends
an Update as it publishes, unless the last one cost the scheduler thread more than its share (feed.py,
SHARE: 2 %; then as much later as that takes: ~0.2 s at benchmarks/inspect_attack.py's ~10,000 decisions a
second), or is still going out. The service applies every Update before it answers the requests of the
same turn. So an answer is that much, plus the Update's transit, behind the engine (stats().snapshot_age_s
says how much); a request sent after publish(force=True) has returned sees that publish (a forced Update
waits for the socket). explain's block, disk and graph state is read from the engine itself, when asked.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict, deque

from tiercache.inspect.messages import Update
from tiercache.inspect.request_log import RequestLog
from tiercache.inspect.snapshot import Snapshot
from tiercache.scheduler.events import DropEvent, TierEvent


class LastDepartures:
    def __init__(self, size: int) -> None:
        self.size = size
        self.forgotten = 0
        self._last: OrderedDict[bytes, DropEvent | None] = OrderedDict()

    def record(self, departure: bytes | DropEvent) -> None:
        """A departure as the engine sends it: a drop's event, or the hash of a block that left otherwise."""
        if self.size == 0:
            return
        drop = departure if isinstance(departure, DropEvent) else None
        block_hash = departure.block_hash if drop is not None else departure
        last = self._last
        last.pop(block_hash, None)
        last[block_hash] = drop
        if len(last) > self.size:
            last.popitem(last=False)

    def get(self, block_hash: bytes) -> DropEvent | None:
        return self._last.get(block_hash)


class Mirror:
    view = None  # explain's point reads are the engine's (handlers.Deferred)

    def __init__(self, engine_pid: int) -> None:
        self.pid = engine_pid
        self.snapshot: Snapshot | None = None
        self.decisions: deque[TierEvent] = deque(maxlen=1000)
        self.requests = RequestLog(128)
        self.departures = LastDepartures(65_536)
        self.connections = 0
        self.updates = 0

    def apply(self, update: Update) -> None:
        if update.full is not None:
            sizes = update.full
            self.snapshot = None
            self.decisions = deque(maxlen=max(sizes.max_decisions, 1))
            self.requests = RequestLog(sizes.recent_requests)
            self.departures = LastDepartures(sizes.remembered_departures)
        self.decisions.extend(update.decisions)
        for departure in update.departures:
            self.departures.record(departure)
        self.departures.forgotten = update.forgotten
        for record in update.requests:
            self.requests.add(record)
        if update.snapshot is not None:
            self.snapshot = dataclasses.replace(update.snapshot, decisions=tuple(self.decisions))
        self.updates += 1
