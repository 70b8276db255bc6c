"""What the engine's process and the service process send each other (length-prefixed msgpack frames on two
socketpairs, protocol.HEADER): each message one frozen value, encoded once, decoded once.

Provides:
    Update        frozen: the latest Snapshot (its decisions travel as `decisions`: only the new ones), and
                  what the state recorded since the last Update: decisions kept, departures (a drop as its
                  event, any other as its block's hash: all that explain_request reads of them, why.py),
                  admissions; `full` (the sizes of the state's rings) when the receiver must start over
        .encode() -> bytes          a msgpack body (frames: protocol.HEADER + body, as on the socket)
        Update.decode(body) -> Update   blocks come back as BlockRows (shapes.py), events and records as
                                    the same frozen types
    Sizes         (max_decisions, recent_requests, remembered_departures) of the engine's state
    EVENT_TYPES   the TierEvent classes an Update carries (scheduler/events.py), by position
    PointQuery(id, hashes)          service → engine: explain's point reads of these blocks
    PointReply(id, reads, error)    engine → service: explain.read_points's answer, one per hash, in order
                                    (error: why there is none)
        .encode() / PointQuery.decode(body), PointReply.decode(body)

Trusted data (the two processes' own, on socketpairs between them): decode checks the shape as far as
building the types does, and raises ValueError on anything else.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, NamedTuple

import msgpack

from tiercache.inspect.request_log import RequestRecord
from tiercache.inspect.snapshot import BLOCK_FIELDS, BlockRow, Snapshot
from tiercache.scheduler.events import (
    DeclineEvent,
    DropEvent,
    EvictionEvent,
    HitEvent,
    MissEvent,
    MoveEvent,
    StoreEvent,
    TierEvent,
)

EVENT_TYPES = (StoreEvent, HitEvent, MissEvent, MoveEvent, EvictionEvent, DropEvent, DeclineEvent)
_CODE = {cls: i for i, cls in enumerate(EVENT_TYPES)}
_FIELDS = {cls: attrgetter(*(f.name for f in dataclasses.fields(cls))) for cls in EVENT_TYPES}
_HEAD = {cls: (i,) for i, cls in enumerate(EVENT_TYPES)}  # an event's row: its type's position, its fields
_ROW = attrgetter(*BLOCK_FIELDS)
_HEADER = tuple(f.name for f in dataclasses.fields(Snapshot) if f.name not in ("decisions", "blocks"))
_RECORD = tuple(f.name for f in dataclasses.fields(RequestRecord))
_RECORD_ROW = attrgetter(*_RECORD)
_UNREADABLE, _DEPARTED = _RECORD.index("unreadable"), _RECORD.index("departed")


class Sizes(NamedTuple):
    max_decisions: int
    recent_requests: int
    remembered_departures: int


@dataclass(frozen=True)
class Update:
    snapshot: Snapshot | None  # None: nothing published yet
    decisions: tuple[TierEvent, ...] = ()  # kept since the last Update, oldest first
    departures: tuple[bytes | DropEvent, ...] = ()  # recorded since, oldest first: a drop, or the hash
    requests: tuple[RequestRecord, ...] = ()  # admitted since, oldest first
    forgotten: int = 0  # departures the engine's state has pushed out so far
    full: Sizes | None = None  # set: the receiver drops what it holds and starts over with these sizes

    def encode(self) -> bytes:
        snap = self.snapshot
        body = {
            "snapshot": None if snap is None else _encode_snapshot(snap),
            "decisions": _encode_events(self.decisions),
            "departures": [d if isinstance(d, bytes) else _encode_event(d) for d in self.departures],
            "requests": [_encode_record(r) for r in self.requests],
            "forgotten": self.forgotten,
            "full": self.full,
        }
        return msgpack.packb(body, use_bin_type=True)

    @staticmethod
    def decode(body: bytes) -> Update:
        try:
            raw = msgpack.unpackb(body, raw=False, use_list=False, strict_map_key=False)
            snap = raw["snapshot"]
            return Update(
                snapshot=None if snap is None else _decode_snapshot(snap),
                decisions=tuple(map(_decode_event, raw["decisions"])),
                departures=tuple(d if isinstance(d, bytes) else _decode_event(d) for d in raw["departures"]),
                requests=tuple(map(_decode_record, raw["requests"])),
                forgotten=int(raw["forgotten"]),
                full=None if raw["full"] is None else Sizes(*raw["full"]),
            )
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise ValueError(f"malformed inspection update ({type(exc).__name__}: {exc})") from None


def _encode_events(events: tuple[TierEvent, ...]) -> list[tuple]:
    """Rows of events, built in C where their types are EVENT_TYPES (the scheduler thread pays this per
    publish, for up to a ring of decisions)."""
    try:
        return [_HEAD[type(e)] + _FIELDS[type(e)](e) for e in events]
    except KeyError:  # a subclass among them
        return [_encode_event(e) for e in events]


def _encode_event(e: TierEvent) -> tuple:
    cls = type(e)
    if cls not in _CODE:  # a subclass: sent as the type it derives from
        cls = next(c for c in EVENT_TYPES if isinstance(e, c))
    return (_CODE[cls], *_FIELDS[cls](e))


def _decode_event(row: tuple) -> TierEvent:
    return EVENT_TYPES[row[0]](*row[1:])


def _encode_snapshot(snap: Snapshot) -> dict[str, Any]:
    out = {name: getattr(snap, name) for name in _HEADER}
    out["blocks"] = {tier: [_ROW(b) for b in blocks] for tier, blocks in snap.blocks.items()}
    return out


def _decode_snapshot(raw: Mapping[str, Any]) -> Snapshot:
    fields = {name: raw[name] for name in _HEADER}
    fields["tiers"] = tuple(fields["tiers"])
    blocks = {tier: tuple(BlockRow(*row) for row in rows) for tier, rows in raw["blocks"].items()}
    return Snapshot(**fields, decisions=(), blocks=blocks)


def _encode_record(r: RequestRecord) -> list:
    row = list(_RECORD_ROW(r))
    row[_UNREADABLE] = list(r.unreadable.items())
    row[_DEPARTED] = [(i, _encode_event(e)) for i, e in r.departed.items()]
    return row


def _decode_record(row: tuple) -> RequestRecord:
    fields = dict(zip(_RECORD, row, strict=True))
    fields["unreadable"] = dict(fields["unreadable"])
    fields["departed"] = {i: _decode_event(e) for i, e in fields["departed"]}
    return RequestRecord(**fields)


@dataclass(frozen=True)
class PointQuery:
    id: int
    hashes: tuple[bytes, ...]

    def encode(self) -> bytes:
        return msgpack.packb((self.id, self.hashes), use_bin_type=True)

    @staticmethod
    def decode(body: bytes) -> PointQuery:
        try:
            query_id, hashes = msgpack.unpackb(body, raw=False, use_list=False)
            if not (isinstance(query_id, int) and all(isinstance(h, bytes) for h in hashes)):
                raise TypeError("expected (int, [bytes])")
            return PointQuery(query_id, tuple(hashes))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"malformed point query ({type(exc).__name__}: {exc})") from None


@dataclass(frozen=True)
class PointReply:
    id: int
    reads: tuple[dict[str, Any], ...] = ()  # explain.PointRead per hash of the query, in its order
    error: str | None = None

    def encode(self) -> bytes:
        return msgpack.packb((self.id, self.reads, self.error), use_bin_type=True)

    @staticmethod
    def decode(body: bytes) -> PointReply:
        try:
            query_id, reads, error = msgpack.unpackb(body, raw=False, strict_map_key=False)
            return PointReply(int(query_id), tuple(reads), error)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"malformed point reply ({type(exc).__name__}: {exc})") from None
