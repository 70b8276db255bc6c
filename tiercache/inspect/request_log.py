"""What inspection remembers to answer "why did this request miss?": the recent requests as admitted, and the
last departure of each block that left the tiers.

Provides:
    RequestRecord        one admission: ids, prompt digest, the prompt's block hashes and where each block
                         was at that moment (.where: one character per block, see WHERE), the reason of
                         each block that was stored but could not be loaded, the last departure of each
                         block that was not stored (taken at admission: the request may store it again, and
                         it may leave again), tokens by source
    RequestLog(size)     the `size` most recent admissions; .add(record), .find(key) -> RequestRecord | None
                         (key: a request id, vLLM's internal or the caller's, the id vLLM's OpenAI server
                         returned, or a prompt digest); .recent_ids: the newest callers' ids (≤ 5);
                         .serial (admissions so far), .since(serial) -> [(serial, record)] those added after
    Departures(size)     block hash → the event that took it out of the tiers (an eviction that dropped it,
                         a drop after a failed load, a store that failed or found no room) or kept it out
                         (a store the policy's admission control declined), for the `size`
                         most recently departed blocks; .record(event), .get(block_hash), .forgotten;
                         .serial (departures recorded so far), .since(serial) -> [event] those recorded
                         after, oldest first (what the service process's mirror is sent)
    prompt_digest(token_ids) -> bytes   16 bytes naming a prompt (blake2b of its token ids)

Written on the scheduler thread; read by in-process clients by point reads only (dict.get, which the GIL
makes atomic), never by iterating a structure the scheduler is changing. since() iterates: on the scheduler
thread (feed.py, at publish), or with serial 0 (a copy of everything, made in C: any thread).
Memory: a record keeps its prompt's block hashes (≈ 75 B per block: 32 K tokens in blocks of 16 ≈ 150 KB),
so `inspect.recent_requests` bounds it; a departure keeps one frozen event (≈ 250 B).
"""

from __future__ import annotations

import hashlib
import re
from array import array
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tiercache.scheduler.events import DeclineEvent, DropEvent, EvictionEvent, StoreEvent, TierEvent
from tiercache.wire import DISK, DRAM, REMOTE, VRAM

# RequestRecord.where: one character per block of the prompt that was looked up
WHERE = {
    "v": VRAM,
    "d": DRAM,
    "r": REMOTE,
    "k": DISK,
    "-": None,
}  # stored and readable in that tier (r: in the remote store, fetched; k: on the local disk, read);
# "-": not stored; "x": unreadable
_CODE = {VRAM: "v", DRAM: "d", REMOTE: "r", DISK: "k"}
# vLLM's OpenAI server answers with one id per response (cmpl-…) and gives the engine that id plus "-<i>",
# the prompt's index in the request: the response id names the newest of them.
_PROMPT_INDEX = re.compile(r"(?P<response>.+)-\d+")
RECENT_IDS = 5


@dataclass(frozen=True, slots=True)
class RequestRecord:
    request_id: str  # vLLM's (internal) id
    external_id: str | None  # the id the caller gave, when vLLM made the internal one from it
    digest: bytes | None  # prompt_digest of the prompt's token ids (None: no token ids, e.g. embeddings)
    clock: float  # the manager's clock at admission (events carry times on this clock)
    wall: float  # time.time() at admission
    block_size: int
    block_hashes: tuple[
        bytes, ...
    ]  # the blocks looked up: every full block but the one holding the last token
    vllm_blocks: int  # leading blocks vLLM's own prefix cache already had
    hit_blocks: int  # blocks after those that tiercache served
    where: str  # per block of block_hashes (vLLM's leading ones included): v, d, - or x
    unreadable: Mapping[int, str]  # block index → why a stored block could not be loaded ("x" in where)
    departed: Mapping[int, TierEvent]  # block index → its last departure before admission ("-" in where)
    prompt_tokens: int
    tokens_loaded: int
    tokens_recomputed: int

    @staticmethod
    def where_code(tier: str | None, reason: str | None) -> str:
        if tier is None:
            return "-"
        return "x" if reason else _CODE[tier]


class RequestLog:
    def __init__(self, size: int) -> None:
        if size < 0:
            raise ValueError(f"RequestLog: size must be ≥ 0, got {size}")
        self.size = size
        self.serial = 0  # admissions added so far
        self._records: OrderedDict[str, tuple[int, RequestRecord]] = OrderedDict()  # id → (serial, record)
        self._aliases: dict[bytes | str, str] = {}  # caller's ids or digest → newest request id
        self.recent_ids: tuple[str, ...] = ()  # the newest caller-facing ids, newest first (replaced whole)

    def add(self, record: RequestRecord) -> None:
        if self.size == 0:
            return
        records = self._records
        records.pop(record.request_id, None)
        self.serial += 1
        records[record.request_id] = (self.serial, record)
        for alias in _aliases(record):
            self._aliases[alias] = record.request_id
        while len(records) > self.size:
            _, (_, old) = records.popitem(last=False)
            for alias in _aliases(old):
                if self._aliases.get(alias) == old.request_id:
                    del self._aliases[alias]
        shown = record.external_id or record.request_id
        self.recent_ids = (shown, *(i for i in self.recent_ids if i != shown))[:RECENT_IDS]

    def find(self, key: str | bytes) -> RequestRecord | None:
        if isinstance(key, str):
            found = self._records.get(key)
            if found is not None:
                return found[1]
        request_id = self._aliases.get(key)
        found = None if request_id is None else self._records.get(request_id)
        return None if found is None else found[1]

    def since(self, serial: int) -> list[tuple[int, RequestRecord]]:
        """(serial, record) of the admissions after `serial`, oldest first: a walk back from the newest (on
        the scheduler thread), or for serial 0 all of them, copied in C (safe on any thread)."""
        if serial <= 0:
            return list(self._records.values())
        out = []
        for entry in reversed(self._records.values()):
            if entry[0] <= serial:
                break
            out.append(entry)
        out.reverse()
        return out

    def __len__(self) -> int:
        return len(self._records)


def _response_id(external_id: str | None) -> str | None:
    """The OpenAI response id an engine id "<response id>-<prompt index>" was made from, else None."""
    match = _PROMPT_INDEX.fullmatch(external_id) if external_id else None
    return match["response"] if match else None


def _aliases(record: RequestRecord) -> list[bytes | str]:
    """The keys besides its request id that find a record: the caller's id, the response id it came from,
    the prompt digest."""
    return [a for a in (record.external_id, _response_id(record.external_id), record.digest) if a is not None]


class Departures:
    def __init__(self, size: int) -> None:
        if size < 0:
            raise ValueError(f"Departures: size must be ≥ 0, got {size}")
        self.size = size
        self.forgotten = 0  # departures pushed out by newer ones
        self.serial = 0  # departures recorded so far
        self._events: OrderedDict[bytes, TierEvent] = OrderedDict()
        self._serials: dict[bytes, int] = {}  # hash → its departure's serial (ints: nothing more to collect)

    def record(self, event: TierEvent) -> None:
        """Keep the event if it took its block out of the tiers (ignores the others)."""
        if not is_departure(event) or self.size == 0:
            return
        events, block_hash = self._events, event.block_hash
        events.pop(block_hash, None)
        self.serial += 1
        events[block_hash] = event
        self._serials[block_hash] = self.serial
        if len(events) > self.size:
            gone, _ = events.popitem(last=False)
            del self._serials[gone]
            self.forgotten += 1

    def get(self, block_hash: bytes) -> TierEvent | None:
        return self._events.get(block_hash)

    def since(self, serial: int) -> list[TierEvent]:
        """The departures recorded after `serial`, oldest first: a walk back from the newest (on the scheduler
        thread), or for serial 0 all of them, copied in C (no bytecode runs: safe on any thread)."""
        if serial <= 0:
            return list(self._events.values())
        serials, out = self._serials, []
        for block_hash in reversed(self._events):
            if serials[block_hash] <= serial:
                break
            out.append(self._events[block_hash])
        out.reverse()
        return out


def is_departure(event: TierEvent) -> bool:
    if isinstance(event, EvictionEvent):
        return event.tier_to is None
    if isinstance(event, StoreEvent):
        return not event.stored
    return isinstance(event, DropEvent | DeclineEvent)


def prompt_digest(token_ids: Sequence[int] | None) -> bytes | None:
    if token_ids is None:
        return None
    return hashlib.blake2b(array("q", token_ids).tobytes(), digest_size=16).digest()
