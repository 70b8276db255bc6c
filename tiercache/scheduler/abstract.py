"""The tier manager's interface (its verbs mirror vLLM's v1/kv_offload OffloadingManager) and its outputs.

Provides:
    PrepareStoreOutput      blocks to write and where: (tier, slot) per block; skipped and not-stored blocks
    PrepareLoadOutput       blocks to read and where each one lives now (tier, slot)
    TierManagerBase         the abstract verbs, below; TierManager (manager.py) implements them

Verbs (block hashes are bytes; a block is stored with the codec id it was encoded with):
    lookup(hashes, codec_id=None, record=True) -> int     leading blocks ready in any tier (hit/miss events)
    prepare_load(hashes) -> PrepareLoadOutput | None       pins the blocks; None = one is not readable
    complete_load(hashes, ok=True)                          unpins; ok=False drops them (never served again)
    touch(hashes)                                           marks recently used
    prepare_store(hashes) -> PrepareStoreOutput | None      (tier, slot) per new block; None = no room at all
    complete_store(hashes, ok=True) / abort_store(hashes, reason)
    prefetch(hashes) -> int                                 plan warms of blocks idle in a slower tier
    take_jobs() -> list[TransferJob]                        moves planned since the last call
    complete_transfer(job_id, ok=True)                      a job finished on every rank
    observe_request(request_id, hashes) / observe_step(hashes)   hints for the eviction policy
    take_events() -> list[TierEvent]                        everything that happened, with reasons
    view() -> ManagerView                                   read-only state, for inspection and checks
    close()
Running out of room is a return value, not an exception; prepare_* either return what they reserved or raise
having reserved nothing; blocks with loads, stores or moves in flight are never evicted.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from tiercache.scheduler.events import TierEvent
from tiercache.scheduler.views import ManagerView
from tiercache.wire import TransferJob


@dataclass(frozen=True)
class PrepareStoreOutput:
    block_hashes: tuple[bytes, ...]  # new blocks to write, in the order asked
    tiers: tuple[str, ...]  # "vram" while VRAM has room, else "dram" (written straight to the cold tier)
    slots: tuple[int, ...]  # slot of each in its tier
    skipped: tuple[bytes, ...] = ()  # already stored (or asked twice): nothing to write
    not_stored: tuple[bytes, ...] = ()  # no room for these (the tail of the request's new blocks), or
    # declined by the policy's admission control (a DeclineEvent each says why)


@dataclass(frozen=True)
class PrepareLoadOutput:
    block_hashes: tuple[bytes, ...]
    tiers: tuple[str, ...]  # per block: where to read it (a warm may be moving it; the source stays valid)
    slots: tuple[int, ...]


class TierManagerBase(ABC):
    codec_id: str

    @abstractmethod
    def lookup(self, hashes: Sequence[bytes], codec_id: str | None = None, record: bool = True) -> int: ...

    @abstractmethod
    def prepare_load(self, hashes: Sequence[bytes]) -> PrepareLoadOutput | None: ...

    @abstractmethod
    def complete_load(self, hashes: Sequence[bytes], ok: bool = True) -> None: ...

    @abstractmethod
    def touch(self, hashes: Sequence[bytes]) -> None: ...

    @abstractmethod
    def prepare_store(self, hashes: Sequence[bytes]) -> PrepareStoreOutput | None: ...

    @abstractmethod
    def complete_store(self, hashes: Sequence[bytes], ok: bool = True) -> None: ...

    @abstractmethod
    def abort_store(self, hashes: Sequence[bytes], reason: str) -> None: ...

    @abstractmethod
    def prefetch(self, hashes: Sequence[bytes]) -> int: ...

    @abstractmethod
    def take_jobs(self) -> list[TransferJob]: ...

    @abstractmethod
    def complete_transfer(self, job_id: int, ok: bool = True) -> None: ...

    @abstractmethod
    def observe_request(self, request_id: str, hashes: Sequence[bytes]) -> None:
        """A request was admitted with these block hashes (its prefix chain): a hint for the policy."""

    @abstractmethod
    def observe_step(self, hashes: Sequence[bytes]) -> None:
        """These blocks were loaded together in one step: a hint for the policy."""

    @abstractmethod
    def take_events(self) -> list[TierEvent]: ...

    @abstractmethod
    def view(self) -> ManagerView: ...

    @abstractmethod
    def close(self) -> None: ...
