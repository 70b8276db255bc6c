"""The tier manager (scheduler side): the one owner of where blocks live. Workers execute its plans.

Provides:
    TierManager(vram_blocks, dram_blocks, codec_id, policy=None, spill_watermark=1/16, clock=monotonic)
    TierManager.from_config(config, layout, codec_id, policy=None)
        the verbs of TierManagerBase (abstract.py), plus
        info(hash) -> BlockInfo | None      spill(n) -> int (the n coldest VRAM blocks to DRAM, now)
        remote tier (remote_write "through" | "evicted" | "reused" | None):
        take_uploads() -> list[RemoteItem]  blocks that go up to the remote store, queued since the last
                                            call, each with the tier and slot it is in ("through": every
                                            block once stored; "reused": at its first hit; "evicted": when
                                            dropped from DRAM; never a block that came from the store)
        prepare_fetch(hashes) -> PrepareLoadOutput | None   reserve DRAM slots for blocks the remote store
                                            holds, pinned as loads (None: no room, or a block is known here)
        complete_fetch(hashes, ok, reason)  the fetch and its load are done: ready in DRAM, or released
        disk tier (disk_blocks > 0: tiers.disk; disk_tier.py): disk_prefix, prepare_disk_read,
                                            complete_disk_read, take_disk_plan (blocks dropped from DRAM
                                            written to files, files dropped), restore_disk(hashes) at start
        stats() -> dict, quick_check(), check(), events_dropped

One object, its verbs grouped by module: the state and the primitives that change it in core.py
(ManagerCore, whose constructor this is), lookups and loads in loads.py, stores and admission in stores.py,
transfer jobs in transfers.py, the remote tier in remote_tier.py, the disk tier in disk_tier.py; hints,
events, views and checks here.

Room: new blocks go to VRAM while it has free slots, else straight to DRAM. Whenever free VRAM drops below the
watermark (spill_watermark × VRAM blocks), cold VRAM blocks are spilled to DRAM (not dropped), so VRAM keeps
room for the next stores and warms; a DRAM-resident block that gets a load hit is warmed back. When DRAM is
full, its victims are dropped. Only when neither tier can make room (no DRAM tier, or DRAM all in flight) are
cold VRAM blocks dropped for a store. The Mover (moves.py) plans each of these; the manager applies the plan
(slots, index, jobs, events). A source slot is released only when the workers report the move complete and no
load still reads it, so jobs never race each other. Not thread-safe: one scheduler thread calls it.
"""

from __future__ import annotations

from collections.abc import Sequence

from tiercache.disk.files import disk_blocks
from tiercache.errors import ConfigError
from tiercache.layout import tier_capacities
from tiercache.scheduler import invariants
from tiercache.scheduler.abstract import TierManagerBase
from tiercache.scheduler.disk_tier import DiskVerbs
from tiercache.scheduler.loads import LoadVerbs
from tiercache.scheduler.policies import EvictionPolicy, make_policy
from tiercache.scheduler.remote_tier import RemoteVerbs
from tiercache.scheduler.stores import StoreVerbs
from tiercache.scheduler.transfers import TransferVerbs
from tiercache.scheduler.views import ManagerView
from tiercache.wire import DRAM, VRAM


class TierManager(LoadVerbs, StoreVerbs, TransferVerbs, RemoteVerbs, DiskVerbs, TierManagerBase):
    @classmethod
    def from_config(cls, config, layout, codec_id: str, policy: EvictionPolicy | None = None) -> TierManager:
        """Capacities from the config's tier sizes and the per-rank block layout (the numbers the workers
        allocate, tiercache.layout.tier_capacities; the disk's: disk.files.disk_blocks); the policy from
        config.eviction unless given."""
        config.check_memory(layout.bytes_per_token, check_device=False)
        capacity = tier_capacities(config, layout)
        tiers = config.tiers
        remote = tiers.remote.write if tiers.remote is not None else None
        disk_write = tiers.disk.write if tiers.disk is not None else "evicted"
        if tiers.disk is not None and not capacity[DRAM]:
            raise ConfigError(
                f"tiers.disk needs a DRAM tier ({config.source}): blocks are written from DRAM slots and "
                "read back into them; set tiers.dram to a size above 0, or remove tiers.disk"
            )
        policy = policy or make_policy(config.eviction)
        return cls(
            capacity[VRAM], capacity[DRAM], codec_id, policy, remote_write=remote,
            disk_blocks=disk_blocks(config, layout), disk_write=disk_write,
        )  # fmt: skip

    # ----------------------------------------------------------------- hints, events, views
    def observe_request(self, request_id: str, hashes: Sequence[bytes]) -> None:
        observe = getattr(self.policy, "observe_request", None)
        if observe is not None:
            observe(request_id, hashes)

    def observe_step(self, hashes: Sequence[bytes]) -> None:
        observe = getattr(self.policy, "observe_step", None)
        if observe is not None:
            observe(hashes)

    def take_events(self):
        return self._log.take()

    @property
    def events_dropped(self) -> int:
        return self._log.dropped

    def view(self) -> ManagerView:
        return self._view

    def close(self) -> None:
        """Stop what the policy runs (the graph advisor's thread)."""
        self.policy.close()

    def stats(self) -> dict[str, int]:
        vram, dram = self._alloc[VRAM], self._alloc[DRAM]
        return {
            "blocks": len(self._index),
            "vram_capacity": vram.capacity, "vram_free": vram.num_free,
            "dram_capacity": dram.capacity, "dram_free": dram.num_free,
            "jobs_in_flight": self._jobs.jobs_in_flight, "spilling": self._jobs.leaving(VRAM),
            **(self._disk.stats() if self._disk is not None else {}),
        }  # fmt: skip

    def quick_check(self) -> None:
        """O(1) invariant: slots in use = stored blocks + move destinations + retired slots."""
        invariants.quick_check(self._alloc, len(self._index), self._jobs.moving_blocks, self._retired)

    def check(self) -> None:
        """Full invariant check, O(capacity + blocks): every used slot is owned by exactly one thing."""
        invariants.full_check(self._index, self._alloc, self._jobs.moving_blocks, self._retired)
