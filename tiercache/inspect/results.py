"""Typed, frozen answers of the inspection client (built from the service's plain-data replies).

Provides:
    TierStats      one tier: capacity, used/free slots, stored blocks, occupancy, hits, evictions, bytes
    TTFTStats      time-to-first-token summary: count, mean_s, p50_s, p90_s
    Stats          the whole cache: policy, codec, hit rates, moves, evictions, tokens, TTFT, tiers
    Decision       one eviction / drop / warm / failed move, with reason, policy, score and components
    BlockRecord    one stored block: tier, slot, hits, ages, in-flight state
    Explanation    explain(): the block now, its score components, recent decisions about it, a summary
    RequestExplanation   explain_request(): per block of a recent prompt, where its KV came from or why it
                   missed (BlockOutcome), tokens by source, a summary (causes: tiercache/inspect/why.py)
    expect_map(value, what) / expect_list(value, what)   a reply's container, or InspectError
Every from_dict checks what it reads against the field's type (int, float, str, bytes, bool, optional,
Mapping[str, …] of plain values nested at most MAX_NESTING deep): a malformed reply raises InspectError
naming the field and the value (shortened), never a TypeError or AttributeError. Unknown keys in a reply
are ignored (a newer server stays readable by an older client).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from tiercache.errors import shown
from tiercache.inspect.protocol import InspectError

MAX_NESTING = 4
_HINT = "is the server a tiercache of the same version?"
_SCALARS: dict[str, Callable[[Any], bool]] = {
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "bytes": lambda v: isinstance(v, bytes),
    "bool": lambda v: isinstance(v, bool),
    "Any": lambda v: _plain(v, MAX_NESTING),
}


def expect_map(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InspectError(f"malformed reply: {what} should be a map, got {shown(value, 80)}; {_HINT}")
    return value


def expect_list(value: Any, what: str) -> list:
    if not isinstance(value, list | tuple):
        raise InspectError(f"malformed reply: {what} should be a list, got {shown(value, 80)}; {_HINT}")
    return list(value)


def _build(cls, data: Any, **override):
    """cls(**checked fields of data); `override` gives the fields built by a nested from_dict."""
    data = expect_map(data, cls.__name__)
    kwargs = dict(override)
    for name, (check, required) in _schema(cls).items():
        if name in override:
            continue
        if name not in data:
            if required:
                raise InspectError(f"malformed reply: {cls.__name__}.{name} is missing; {_HINT}")
            continue
        value = data[name]
        if check is not None and not check(value):
            kind = next(f.type for f in dataclasses.fields(cls) if f.name == name)
            raise InspectError(
                f"malformed reply: {cls.__name__}.{name} should be {kind}, got {shown(value, 80)}; {_HINT}"
            )
        kwargs[name] = MappingProxyType(dict(value)) if isinstance(value, Mapping) else value
    return cls(**kwargs)


@functools.cache
def _schema(cls) -> dict[str, tuple[Callable[[Any], bool] | None, bool]]:
    """field → (check of its value or None for nested results, required)."""
    out = {}
    for f in dataclasses.fields(cls):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        out[f.name] = (_checker(str(f.type)), required)
    return out


def _checker(annotation: str) -> Callable[[Any], bool] | None:
    if annotation.endswith(" | None"):
        inner = _checker(annotation.removesuffix(" | None"))
        return None if inner is None else lambda v: v is None or inner(v)
    if annotation.startswith("Mapping[str, ") and annotation[13:-1] in _SCALARS:
        ok = _SCALARS[annotation[13:-1]]
        return lambda v: isinstance(v, Mapping) and all(isinstance(k, str) and ok(x) for k, x in v.items())
    return _SCALARS.get(annotation)


def _plain(value: Any, depth: int) -> bool:
    """msgpack-able plain data nested at most `depth` deep (what the CLI's --json can print safely)."""
    if value is None or isinstance(value, bool | int | float | str | bytes):
        return True
    if depth <= 0:
        return False
    if isinstance(value, list | tuple):
        return all(_plain(v, depth - 1) for v in value)
    if isinstance(value, Mapping):
        return all(isinstance(k, str) and _plain(v, depth - 1) for k, v in value.items())
    return False


@dataclass(frozen=True)
class TierStats:
    name: str
    capacity_blocks: int
    used_slots: int  # stored blocks plus slots reserved by stores and moves in flight
    free_slots: int
    stored_blocks: int  # ready blocks in this tier
    occupancy: float  # used_slots / capacity_blocks
    hits: int = 0  # lookup hits served from this tier
    evictions: int = 0  # victims taken from this tier (spilled or dropped)
    capacity_bytes: int | None = None
    used_bytes: int | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TierStats:
        return _build(cls, data)


@dataclass(frozen=True)
class TTFTStats:
    count: int
    mean_s: float
    p50_s: float
    p90_s: float

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> TTFTStats | None:
        return None if data is None else _build(cls, data)


@dataclass(frozen=True)
class Stats:
    pid: int
    policy: str
    codec_id: str
    blocks: int
    hits: int  # block hits at lookup (a lookup stops at its first miss)
    hits_by_tier: Mapping[str, int]
    misses: int
    hit_rate: float | None  # hits / (hits + misses)
    stores: int
    store_failures: int
    spills: int
    spill_failures: int
    warms: int
    warm_failures: int
    evictions: int  # victims the policy chose: spilled to the next tier, or dropped from the last
    evictions_by_policy: Mapping[str, int]
    drops: int  # blocks removed without a policy choice (a failed load, store or transfer)
    tokens_loaded: int
    tokens_recomputed: int
    token_hit_rate: float | None  # loaded / (loaded + recomputed), when the connector reports tokens
    ttft_hit: TTFTStats | None
    ttft_miss: TTFTStats | None
    tiers: tuple[TierStats, ...]
    evictions_dropped: int = 0  # evictions that left the tiers (the rest were spilled)
    declines: int = 0  # new blocks not stored: the policy's admission control predicted no use in time
    declines_by_policy: Mapping[str, int] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    jobs_in_flight: int = 0
    spilling: int = 0
    events: int = 0
    events_dropped: int = 0
    version: int = 0  # snapshot version
    snapshot_age_s: float = 0.0
    uptime_s: float = 0.0

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Stats:
        data = expect_map(data, "Stats")
        ttft = expect_map(data.get("ttft") or {}, "Stats.ttft")
        return _build(
            cls,
            data,
            ttft_hit=TTFTStats.from_dict(ttft.get("hit")),
            ttft_miss=TTFTStats.from_dict(ttft.get("miss")),
            tiers=tuple(TierStats.from_dict(t) for t in expect_list(data.get("tiers", ()), "Stats.tiers")),
        )

    def tier(self, name: str) -> TierStats:
        for t in self.tiers:
            if t.name == name:
                return t
        raise KeyError(f"no tier {name!r}; tiers: {', '.join(t.name for t in self.tiers)}")


@dataclass(frozen=True)
class Decision:
    seq: int
    kind: str  # eviction | drop | decline | warm | spill
    block_hash: bytes
    reason: str
    age_s: float  # seconds ago
    tier_from: str
    tier_to: str | None  # None: dropped (decline: never stored; tier_from: where it was judged)
    slot: int
    policy: str | None = None  # evictions, declines: the policy actually used (graph, lru, lru-fallback)
    score: float | None = None
    components: Mapping[str, float] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    snapshot_age_s: float | None = None  # the advisor snapshot's age when the decision was taken
    stage: str | None = None  # warm/spill: planned | failed
    job_id: int | None = None
    codec_id: str = ""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Decision:
        return _build(cls, data)

    @property
    def action(self) -> str:
        """e.g. "spill vram→dram", "drop dram", "decline dram", "warm dram→vram", "spill failed"."""
        if self.kind == "decline":
            return f"decline {self.tier_from}"
        if self.stage == "failed":
            return f"{self.kind} failed"
        if self.tier_to is None:
            return f"drop {self.tier_from}"
        verb = "spill" if self.kind == "eviction" else self.kind
        return f"{verb} {self.tier_from}→{self.tier_to}"


@dataclass(frozen=True)
class BlockRecord:
    block_hash: bytes
    tier: str
    slot: int
    hits: int
    stored_age_s: float
    idle_s: float
    ready: bool
    loads_in_flight: int
    moving: bool
    evictable: bool

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BlockRecord:
        return _build(cls, data)


@dataclass(frozen=True)
class Explanation:
    block_hash: bytes
    stored: bool
    block: BlockRecord | None
    policy: str
    score: float | None
    components: Mapping[str, float]
    graph: Mapping[str, Any] | None  # the graph's view (tier, parent, children, counters) when it has one
    decisions: tuple[Decision, ...]  # about this block, newest first
    summary: str

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Explanation:
        data = expect_map(data, "Explanation")
        block = data.get("block")
        decisions = expect_list(data.get("decisions", ()), "Explanation.decisions")
        return _build(
            cls,
            data,
            block=None if block is None else BlockRecord.from_dict(block),
            decisions=tuple(Decision.from_dict(d) for d in decisions),
        )

    def __str__(self) -> str:
        return f"{self.block_hash.hex()[:16]}: {self.summary}"


@dataclass(frozen=True)
class BlockOutcome:
    index: int  # block of the prompt
    block_hash: bytes
    outcome: str  # vllm | hit | miss
    tier: str | None  # hit: the tier it was loaded from; miss: where it was stored at admission, if anywhere
    cause: str | None = None  # miss: never_stored, evicted, hash_mismatch, … (why.MISS_CAUSES)
    note: str | None = None
    event: Mapping[str, Any] | None = (
        None  # the departure behind the cause: kind, age_s, reason, tier, policy,
    )
    #                                         score, components
    loaded_then_failed: bool = False

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BlockOutcome:
        return _build(cls, data)


@dataclass(frozen=True)
class RequestExplanation:
    request_id: str
    external_id: str | None
    age_s: float  # since admission
    block_size: int
    prompt_tokens: int
    tokens_vllm: int  # from vLLM's own prefix cache
    tokens_loaded: int  # loaded by tiercache
    tokens_recomputed: int
    first_miss: int | None
    blocks: tuple[BlockOutcome, ...]
    summary: str

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RequestExplanation:
        data = expect_map(data, "RequestExplanation")
        blocks = expect_list(data.get("blocks", ()), "RequestExplanation.blocks")
        return _build(cls, data, blocks=tuple(BlockOutcome.from_dict(b) for b in blocks))

    def misses(self) -> tuple[BlockOutcome, ...]:
        return tuple(b for b in self.blocks if b.outcome == "miss")

    def __str__(self) -> str:
        return f"request {self.external_id or self.request_id}: {self.summary}"
