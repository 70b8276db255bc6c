"""The wire between the two processes: typed, frozen values, encoded once (msgpack) and decoded once.

Provides:
    VRAM, DRAM, TIERS       local tier names, fastest first (plain strings); REMOTE the shared store's name,
                            DISK the disk tier's (files below DRAM: no slots, never a job's tier)
    move_kind(src, dst)     "spill" towards a slower tier, "warm" towards a faster one
    LoadItem                read one stored block into a vLLM block (tier None: refused → a load error)
    StoreItem               write one vLLM block into (tier, slot)
    TransferJob             move blocks between tiers: source and destination tier, slots and block hashes
    RemoteItem              one block between a local slot and the remote store or the disk tier (block
                            hash, slot, tier: an upload's VRAM or DRAM, a fetch's DRAM)
    StepPlan                scheduler → workers, one per engine step: loads, stores, jobs, the remote
                            tier's uploads (VRAM or DRAM slot → store) and fetches (store → DRAM slot), the
                            disk tier's writes (DRAM slot → file), reads (file → DRAM slot) and drops, and the
                            requests whose loads end with the step
    StepResult              one rank's outcome of a step's loads and stores, aligned with its plan, with
                            why each failed load failed (LoadFailure)
    JobResult               one rank's outcome of a transfer job: ok, blocks, bytes, seconds, error
    IoSample                one rank's timed copy between vLLM's cache and the tiers: direction ("load" |
                            "store"), blocks, bytes, seconds
    RemoteCount             one rank's remote-tier events since its last report: event ("written" |
                            "already_stored" | "dropped_full" | "write_failures", or a refused value:
                            "bad_values" | "bad_macs" | "vanished"), blocks
    WorkerReport            one rank → scheduler: step results, finished jobs, timed copies, errors, the
                            rank (vLLM's global rank: 0 … world_size-1), its remote writes and its disk
                            tier's writes and refused files (RemoteCount, the same events)
    encode(value) -> bytes / decode(data, cls)   the one encode and the one decode at the process boundary

The scheduler side builds each item once from the manager's decisions; the worker side reads its fields. No
receiver re-derives a direction: a job names both of its tiers. Values validate themselves on construction
(and so on decode): a malformed plan or report raises ValueError naming the field.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass
from typing import Any, TypeVar

import msgpack

VRAM = "vram"
DRAM = "dram"
TIERS = (VRAM, DRAM)  # fastest first: the local tiers, with slots
REMOTE = "remote"  # the store shared by engines below DRAM (RemoteItem; no slots, never a job's tier)
DISK = "disk"  # local disk below DRAM, above the remote store (RemoteItem; never a job's tier)
T = TypeVar("T")


def move_kind(src_tier: str, dst_tier: str) -> str:
    """ "spill" towards a slower tier, "warm" towards a faster one (a label for logs and counters)."""
    return "spill" if TIERS.index(dst_tier) > TIERS.index(src_tier) else "warm"


def check_tier(tier: object, what: str) -> None:
    if tier not in TIERS:
        raise ValueError(f"{what}: tier must be one of {', '.join(TIERS)}, got {tier!r}")


@dataclass(frozen=True, slots=True)
class LoadItem:
    block_hash: bytes
    tier: str | None  # None: the manager refused the block after the lookup; the worker reports a load error
    slot: int
    block_id: int  # vLLM's block to write

    def __post_init__(self) -> None:
        if self.tier is not None:
            check_tier(self.tier, "LoadItem")


@dataclass(frozen=True, slots=True)
class StoreItem:
    block_hash: bytes
    tier: str
    slot: int
    block_id: int  # vLLM's block to read

    def __post_init__(self) -> None:
        check_tier(self.tier, "StoreItem")


@dataclass(frozen=True, slots=True)
class TransferJob:
    """Blocks moving from src_tier to dst_tier: pair i moves block_hashes[i] from src_slots[i] to
    dst_slots[i]. Jobs of one step are independent (fresh destinations, sources owned until completion)."""

    job_id: int
    src_tier: str
    dst_tier: str
    src_slots: tuple[int, ...]
    dst_slots: tuple[int, ...]
    block_hashes: tuple[bytes, ...]

    def __post_init__(self) -> None:
        check_tier(self.src_tier, f"job {self.job_id} source")
        check_tier(self.dst_tier, f"job {self.job_id} destination")
        if self.src_tier == self.dst_tier:
            raise ValueError(f"job {self.job_id}: source and destination are both {self.src_tier}")
        if not len(self.src_slots) == len(self.dst_slots) == len(self.block_hashes):
            raise ValueError(
                f"job {self.job_id}: {len(self.src_slots)} sources, {len(self.dst_slots)} destinations, "
                f"{len(self.block_hashes)} blocks"
            )

    @property
    def kind(self) -> str:
        return move_kind(self.src_tier, self.dst_tier)

    def __len__(self) -> int:
        return len(self.src_slots)


@dataclass(frozen=True, slots=True)
class RemoteItem:
    """A block between slot `slot` of `tier` and the remote store. An upload's slot held the block when the
    manager queued it (stored, first hit or dropped from DRAM: tiers.remote.write; a dropped block's slot
    is freed by then): the worker copies its bytes out before anything else of the step. A fetch's slot is
    a DRAM slot reserved for it (the worker writes the fetched bytes there before the step's loads)."""

    block_hash: bytes
    slot: int
    tier: str = DRAM  # an upload's: VRAM or DRAM; a fetch's: DRAM

    def __post_init__(self) -> None:
        if self.tier not in TIERS:
            raise ValueError(f"RemoteItem.tier: expected one of {TIERS}, got {self.tier!r}")


@dataclass(frozen=True, slots=True)
class StepPlan:
    """Worker order: uploads, disk writes, disk drops, disk reads, fetches, loads, jobs (start of the
    step); stores (end of the step)."""

    step: int
    loads: tuple[LoadItem, ...] = ()
    stores: tuple[StoreItem, ...] = ()
    jobs: tuple[TransferJob, ...] = ()
    uploads: tuple[RemoteItem, ...] = ()  # VRAM or DRAM slot → remote store (tiers.remote.write says when)
    fetches: tuple[RemoteItem, ...] = ()  # remote store → DRAM (their loads follow in `loads`)
    disk_writes: tuple[RemoteItem, ...] = ()  # DRAM slot → its block's file (blocks dropped from DRAM)
    disk_reads: tuple[RemoteItem, ...] = ()  # file → DRAM slot (their loads follow in `loads`)
    disk_drops: tuple[bytes, ...] = ()  # block hashes whose files are deleted (and queued writes cancelled)
    load_requests: tuple[str, ...] = ()  # requests whose loads (all of them) are in `loads`: each rank
    # reports them to vLLM as received after this step (vLLM's asynchronous-load path)


@dataclass(frozen=True, slots=True)
class LoadFailure:
    index: int  # into the plan's loads
    reason: str


@dataclass(frozen=True, slots=True)
class StepResult:
    step: int
    loads_ok: tuple[bool, ...]  # aligned with the plan's loads
    stores_ok: tuple[bool, ...]  # aligned with the plan's stores
    load_failures: tuple[LoadFailure, ...] = ()  # why, for loads refused on this rank (not ok)


@dataclass(frozen=True, slots=True)
class JobResult:
    job_id: int
    ok: bool
    blocks: int
    bytes: int
    seconds: float
    error: str | None = None

    @property
    def gbps(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else float("inf")


IO_DIRECTIONS = ("load", "store")  # an IoSample's; with the jobs' move kinds, every TRANSFER_DIRECTION
TRANSFER_DIRECTIONS = ("load", "store", "spill", "warm")


@dataclass(frozen=True, slots=True)
class IoSample:
    direction: str  # "load" (tiers → vLLM's cache) or "store" (vLLM's cache → tiers)
    blocks: int
    bytes: int  # bytes of the tiers' format (what the tiers hold), this rank's share
    seconds: float  # device time on a GPU (CUDA events), wall time on a CPU

    def __post_init__(self) -> None:
        if self.direction not in IO_DIRECTIONS:
            raise ValueError(f"IoSample.direction: expected one of {IO_DIRECTIONS}, got {self.direction!r}")


@dataclass(frozen=True, slots=True)
class RemoteCount:
    event: str  # the write-behind queue's outcomes ("written" | "already_stored" | "dropped_full" |
    # "write_failures") or a refused value ("bad_values" | "bad_macs" | "vanished")
    blocks: int


@dataclass(frozen=True, slots=True)
class WorkerReport:
    steps: tuple[StepResult, ...] = ()
    jobs: tuple[JobResult, ...] = ()
    errors: tuple[str, ...] = ()
    io: tuple[IoSample, ...] = ()
    rank: int = 0
    remote: tuple[RemoteCount, ...] = ()
    disk: tuple[RemoteCount, ...] = ()


def encode(value: Any) -> bytes:
    """A wire value as msgpack bytes (dataclasses as lists of their fields, in order)."""
    return msgpack.packb(_plain(value), use_bin_type=True)


def decode(data: bytes, cls: type[T]) -> T:
    """The inverse of encode for a value of type cls; ValueError when the bytes do not hold one."""
    try:
        return _build(cls, msgpack.unpackb(data, raw=False))
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise ValueError(f"malformed {cls.__name__} on the wire: {exc}") from None


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return [_plain(getattr(value, f.name)) for f in dataclasses.fields(value)]
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def _build(tp: Any, data: Any) -> Any:
    if dataclasses.is_dataclass(tp):
        names, hints = _schema(tp)
        if not isinstance(data, list) or len(data) != len(names):
            raise ValueError(f"{tp.__name__} needs {len(names)} fields, got {data!r:.80}")
        return tp(*(_build(hints[name], item) for name, item in zip(names, data, strict=True)))
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is tuple:  # tuple[X, ...]
        if not isinstance(data, list):
            raise ValueError(f"expected a list, got {data!r:.80}")
        return tuple(_build(args[0], item) for item in data)
    if origin is types.UnionType:  # X | None
        return None if data is None else _build(next(a for a in args if a is not type(None)), data)
    if tp is float and isinstance(data, int) and not isinstance(data, bool):
        return float(data)
    if not isinstance(data, tp) or (tp is int and isinstance(data, bool)):
        raise ValueError(f"expected {tp.__name__}, got {data!r:.80}")
    return data


@functools.cache
def _schema(cls: type) -> tuple[tuple[str, ...], dict[str, Any]]:
    return tuple(f.name for f in dataclasses.fields(cls)), typing.get_type_hints(cls)
