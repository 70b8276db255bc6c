"""Worker-side executor: runs the scheduler's plan items on one rank's pools. Nothing here decides anything.

Provides:
    TierWorker(vram, dram, codec_id, max_batch_blocks=None, checksums=True)   (None: 64 MiB of device
                                       staging per direction)
    TierWorker.create(layout, vram_blocks, dram_blocks, codec_id, device, pin=None)
    TierWorker.from_config(config, layout, codec_id, device, pin=None)   capacities from tiercache.layout,
                                       as the manager's
        store(items, blocks)           write encoded blocks ([L, n, …] on the device, aligned with the
                                       StoreItems) where the plan says, record their checksums, tag their
                                       slots
        store_in_place(items, write)   VRAM StoreItems whose bytes write(pool, slots) puts into the pool
                                       itself (pool: the VRAM tier's [L, NB, …] KVBlocks, slots [n] int64):
                                       then the same checksums and tags as store
        refusal(item) -> str | None    why a LoadItem cannot be served (refused by the manager, or its slot
                                       does not hold that block); None: load it
        refusals_before_read(items) -> list[str | None]   refusal of each, in one pass over the batch
        read(items) -> list[BlockSource]   where the LoadItems' blocks are readable on the device: VRAM
                                       slots in place, DRAM blocks staged (DMA); no other copy; with the
                                       sums recorded for them (BlockSource.expected)
        expected_sums(items, sources=None) -> [n, 2, L, 2] | None   the piece sums recorded for the
                                       LoadItems' slots, on the device (None: checksums off) — what a
                                       decode that verifies (tq_dequantize_layers's verify) compares with;
                                       from the sources' own (read(items)) when given, without a second
                                       slot index
        verdict(expected, got) -> ReadCheck   the comparison of the sums a decode read (got) with them,
                                       queued on the device (ReadCheck.ok: [n] bool, per item), its flags on
                                       their way to pinned host memory. The host does not wait.
        check_read(items, sources) -> ReadCheck | None   the same for a separate pass: the read blocks'
                                       checksums computed (checksums_of) and compared; None when checksums
                                       are off
        refusals(items, check) -> list[str | None]   per item, why its bytes cannot be served (they
                                       changed since they were stored: "checksum mismatch: …", the slot's
                                       tag cleared); None: serve them. Waits for the check's own event
                                       only, not for work queued after it (a decode)
        verify_read(items, sources)    refusals(items, check_read(items, sources))
        load(items) -> KVBlocks        a copy of the LoadItems' blocks, in item order
        verify(items, blocks) -> list[str | None]   verify_read for what load returned
        dram_rows(items) -> list[(row, pieces) | str]   per RemoteItem, its DRAM slot's bytes ([dram_stride]
                                       uint8, a view: copy it before the slot is written again) and
                                       recorded piece checksums ([2, L, 2] int64, host); a str: the slot
                                       does not hold that block
        fill_dram(items, rows, sums)   write fetched rows ([n, dram_stride] uint8) into the items' DRAM
                                       slots, record their piece checksums ([n, 2, L, 2] int64), tag them
        submit(job)                    start a TransferJob (destination tags: cleared now, set once done;
                                       the blocks' checksums go with them); a job with a slot outside its
                                       pool fails before any tag, checksum or byte changes
        poll() / wait() -> list[JobResult]   finished jobs; report each to the scheduler
        checksums                      the slots' SlotChecksums (integrity.py); None (checksums=False):
                                       not computed, not checked — only to measure what they cost

Slots are checked against their pool before anything is written: a store, fill_dram or store_in_place with a
slot outside [0, slots) raises IndexError (SlotTags.check) with no tag, checksum or byte changed.

codec_id: the codec the rank's blocks are encoded with; every slot's tag carries it (SlotTags). Every rank
receives the same items and holds its own KV-head shard in the same slots (tensor parallel). A job whose
source slot does not hold the block it names fails (never moves the wrong bytes under a tag).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from tiercache.layout import BlockLayout, tier_capacities
from tiercache.wire import DRAM, VRAM, JobResult, LoadItem, RemoteItem, StoreItem, TransferJob
from tiercache.worker.integrity import SlotChecksums, checksums_of, slot_checksum_bytes
from tiercache.worker.pools import SECTIONS, DramPool, KVBlocks, VramPool, block_views
from tiercache.worker.tags import SlotTags
from tiercache.worker.transfer import TransferEngine


@dataclass(frozen=True)
class ReadCheck:
    """A load's checksum comparison, queued on the device: item i's bytes are intact iff ok[i]."""

    ok: torch.Tensor  # [n] bool, on the device
    flags: torch.Tensor  # [n] bool on the host (pinned on CUDA): ok, once ready
    ready: torch.cuda.Event | None  # recorded once flags is filled (None: it already is)
    expected: torch.Tensor  # [n, 2, L, 2] int64 on the device: the sums recorded at the store
    got: torch.Tensor  # [n, 2, L, 2] int64 on the device: the sums of the bytes read


@dataclass(frozen=True)
class BlockSource:
    """Some of a load's blocks, readable on the device: item positions[j]'s block is blocks[:, ids[j]]."""

    positions: list[int]  # indices into the LoadItems
    blocks: KVBlocks  # [L, NB, …] sections: the VRAM pool's own tensors, or DRAM blocks staged on the device
    ids: torch.Tensor  # [n] int64, on the blocks' device
    expected: torch.Tensor | None = None  # [n, 2, L, 2] int64 on the device: the piece sums recorded when
    # these blocks were stored (read fills it; None: checksums off, or a source read() did not make)


class TierWorker:
    def __init__(
        self,
        vram: VramPool,
        dram: DramPool,
        codec_id: str,
        max_batch_blocks: int | None = None,
        checksums: bool = True,
    ) -> None:
        self.vram = vram
        self.dram = dram
        self.codec_id = codec_id
        self.engine = TransferEngine(vram, dram, max_batch_blocks)
        capacities = {VRAM: vram.num_blocks, DRAM: dram.num_blocks}
        self.tags = SlotTags(capacities)
        layers = vram.layout.num_layers
        self.checksums = SlotChecksums(capacities, vram.device, layers) if checksums else None
        self._jobs: dict[int, TransferJob] = {}  # submitted, not yet finished

    @classmethod
    def from_config(
        cls,
        config,
        layout: BlockLayout,
        codec_id: str,
        device: torch.device | str = "cuda",
        pin: bool | None = None,
    ) -> TierWorker:
        """Allocate this rank's pools for a config (fails at start, with both numbers, when a tier asks for
        more memory than the machine has; the VRAM tier's share counts the per-slot checksum tables, which
        live on the pools' device for both tiers)."""
        device = torch.device(device)
        capacity = tier_capacities(config, layout)
        slots = capacity[VRAM] + capacity[DRAM]
        table = slot_checksum_bytes(layout.num_layers) * slots
        sums = (table, f"the block checksums of its {slots:,} VRAM and DRAM slots")
        config.check_memory(layout.bytes_per_token, check_device=device.type == "cuda", device_extra=sums)
        return cls.create(layout, capacity[VRAM], capacity[DRAM], codec_id, device, pin)

    @classmethod
    def create(
        cls,
        layout: BlockLayout,
        vram_blocks: int,
        dram_blocks: int,
        codec_id: str,
        device: torch.device | str = "cuda",
        pin: bool | None = None,
    ) -> TierWorker:
        return cls(VramPool(layout, vram_blocks, device), DramPool(layout, dram_blocks, pin=pin), codec_id)

    # ------------------------------------------------------------------ stores and loads
    def store(self, items: Sequence[StoreItem], blocks: KVBlocks) -> None:
        groups = _by_tier(items)
        for tier, positions in groups.items():  # every tier's slots, before any of them is written
            self.tags.check(tier, (items[i].slot for i in positions))
        sums = checksums_of(blocks) if self.checksums is not None else None  # [n, 2, L, 2] on the device
        for tier, positions in groups.items():
            slots = [items[i].slot for i in positions]
            self.tags.clear(tier, slots)
            whole = len(positions) == len(items)
            part = blocks if whole else blocks.select(positions)
            if tier == VRAM:
                self.vram.write(slots, part)
            else:
                self.engine.write_dram(slots, part)
            if sums is not None:
                self.checksums.record(tier, slots, sums if whole else sums[positions])
            self.tags.set(tier, slots, (items[i].block_hash for i in positions), self.codec_id)

    def refusal(self, item: LoadItem) -> str | None:
        if item.tier is None:
            return "the manager refused it after the lookup"
        return self.tags.refusal(item.tier, item.slot, item.block_hash, self.codec_id)

    def refusals_before_read(self, items: Sequence[LoadItem]) -> list[str | None]:
        reasons: list[str | None] = [None] * len(items)
        for tier, positions in _by_tier(items).items():
            at = [items[i] for i in positions]
            if tier is None:
                held = [False] * len(at)
            else:
                held = self.tags.holds(tier, [x.slot for x in at], [x.block_hash for x in at], self.codec_id)
            for i, item, ok in zip(positions, at, held, strict=True):
                if not ok:
                    reasons[i] = self.refusal(item)
        return reasons

    def store_in_place(
        self, items: Sequence[StoreItem], write: Callable[[KVBlocks, torch.Tensor], None]
    ) -> None:
        """items: all in VRAM. write(pool, slots) writes block i of the items into pool[:, slots[i]]."""
        if any(item.tier != VRAM for item in items):
            raise ValueError("store_in_place: every item must be a VRAM store")
        slots = [item.slot for item in items]
        self.tags.clear(VRAM, slots)
        idx = self.vram.slot_index(slots)
        pool = self.vram.sections()
        write(pool, idx)
        if self.checksums is not None:
            self.checksums.record(VRAM, slots, checksums_of(pool, idx))
        self.tags.set(VRAM, slots, (item.block_hash for item in items), self.codec_id)

    def read(self, items: Sequence[LoadItem]) -> list[BlockSource]:
        sources = []
        sums = self.checksums
        for tier, positions in _by_tier(items).items():
            slots = [items[i].slot for i in positions]
            if tier == VRAM:
                idx = self.vram.slot_index(slots)
                expected = sums.get(VRAM, idx) if sums is not None else None  # idx: on the device already
                sources.append(BlockSource(positions, self.vram.sections(), idx, expected))
            else:
                staged, rows = self.engine.stage_dram(slots)
                expected = sums.get(DRAM, slots) if sums is not None else None
                sources.append(BlockSource(positions, staged, rows, expected))
        return sources

    def expected_sums(
        self, items: Sequence[LoadItem], sources: Sequence[BlockSource] | None = None
    ) -> torch.Tensor | None:
        if self.checksums is None or not items:
            return None
        if not sources or any(source.expected is None for source in sources):
            return self.checksums.expected([(item.tier, item.slot) for item in items])
        return _in_item_order(len(items), sources, [source.expected for source in sources])

    def verdict(self, expected: torch.Tensor, got: torch.Tensor) -> ReadCheck:
        """expected, got: [n, 2, L, 2] int64 on the device (got filled by work queued before this call)."""
        ok = (expected == got).flatten(1).all(1)
        if ok.device.type != "cuda":
            return ReadCheck(ok, ok, None, expected, got)
        flags = torch.empty(ok.shape, dtype=torch.bool, pin_memory=True)
        flags.copy_(ok, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return ReadCheck(ok, flags, ready, expected, got)

    def check_read(self, items: Sequence[LoadItem], sources: Sequence[BlockSource]) -> ReadCheck | None:
        """sources: what read(items) returned. Nothing waits: a decode that reads ok skips the refused
        blocks before the host knows of them."""
        expected = self.expected_sums(items, sources)
        if expected is None:
            return None
        got = _in_item_order(len(items), sources, [checksums_of(s.blocks, s.ids) for s in sources])
        return self.verdict(expected, got.to(expected.device))

    def refusals(self, items: Sequence[LoadItem], check: ReadCheck | None) -> list[str | None]:
        """A block whose bytes no longer have the checksum recorded when they were stored gets a reason, and
        its slot's tag is cleared: nothing reads that slot again until a store or a move rewrites it (the
        scheduler drops the block on the failed load and frees the slot)."""
        if check is None:
            return [None] * len(items)
        if check.ready is not None:
            check.ready.synchronize()
        reasons: list[str | None] = [None] * len(items)
        for i, intact in enumerate(check.flags.tolist()):
            if intact:
                continue
            item = items[i]
            self.tags.clear(item.tier, [item.slot])
            reasons[i] = (
                f"checksum mismatch: {item.tier} slot {item.slot} (block {item.block_hash.hex()[:16]}): its "
                f"bytes changed after they were stored ({_mismatch(check.expected[i], check.got[i])})"
            )
        return reasons

    def verify_read(self, items: Sequence[LoadItem], sources: Sequence[BlockSource]) -> list[str | None]:
        return self.refusals(items, self.check_read(items, sources))

    def load(self, items: Sequence[LoadItem]) -> KVBlocks:
        groups = _by_tier(items)
        parts = {}
        for tier, positions in groups.items():
            slots = [items[i].slot for i in positions]
            parts[tier] = self.vram.read(slots) if tier == VRAM else self.engine.read_dram(slots)
        if len(parts) == 1:
            return next(iter(parts.values()))
        order = torch.as_tensor(groups[VRAM] + groups[DRAM])
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(len(order))
        inverse = inverse.to(self.vram.device)
        return KVBlocks(
            *(
                torch.cat([getattr(parts[VRAM], n), getattr(parts[DRAM], n)], dim=1).index_select(1, inverse)
                for n in SECTIONS
            )
        )

    def verify(self, items: Sequence[LoadItem], blocks: KVBlocks) -> list[str | None]:
        """blocks: what load(items) returned (see verify_read)."""
        everything = list(range(len(items)))
        ids = torch.arange(len(items), device=blocks.k_packed.device)
        return self.verify_read(items, [BlockSource(everything, blocks, ids)])

    # ------------------------------------------------------------------ the remote tier (DRAM rows)
    def dram_rows(self, items: Sequence[RemoteItem]) -> list[tuple[torch.Tensor, torch.Tensor] | str]:
        """The uploads' bytes, as views of their slots (the caller copies them before the slot is written
        again: RemoteWriter.offer into the value, at once), and the piece checksums recorded when the bytes
        were stored ([2, L, 2] int64 on the host; of the row only when checksums are off): bytes changed
        since then are refused by the reader."""
        wrongs = [self.tags.refusal(DRAM, item.slot, item.block_hash, self.codec_id) for item in items]
        slots = [item.slot for item, wrong in zip(items, wrongs, strict=True) if wrong is None]  # in range
        out: list[tuple[torch.Tensor, torch.Tensor] | str] = [f"not uploaded: {w}" for w in wrongs]
        if not slots:
            return out
        rows = [self.dram.buffer[slot] for slot in slots]  # [dram_stride] uint8 views
        if self.checksums is not None:
            pieces = self.checksums.get(DRAM, slots).cpu()
        else:
            pieces = checksums_of(block_views(torch.stack(rows), self.dram.layout))
        got = iter(zip(rows, pieces, strict=True))
        for i, wrong in enumerate(wrongs):
            if wrong is None:
                out[i] = next(got)
        return out

    def fill_dram(self, items: Sequence[RemoteItem], rows: torch.Tensor, sums: torch.Tensor) -> None:
        """rows: [n, dram_stride] uint8 (fetched, verified by the caller); sums: [n, 2, L, 2] int64, their
        piece checksums."""
        slots = [item.slot for item in items]
        if not slots:
            return
        want = (len(slots), 2, self.dram.layout.num_layers, 2)
        if tuple(sums.shape) != want:
            raise ValueError(
                f"fill_dram: sums must be the rows' piece checksums {list(want)}, got {list(sums.shape)}"
            )
        self.tags.clear(DRAM, slots)
        # numpy's copy: one thread; torch's intra-op threads, shared with the engine's, slow a host copy like
        # this one by 10-50x on a busy CPU (benchmarks/RESULTS.md)
        self.dram.buffer.numpy()[slots] = rows.numpy()
        if self.checksums is not None:
            self.checksums.record(DRAM, slots, sums)
        self.tags.set(DRAM, slots, (item.block_hash for item in items), self.codec_id)

    # ------------------------------------------------------------------ transfers
    def submit(self, job: TransferJob) -> None:
        self._jobs[job.job_id] = job
        wrong = self.tags.out_of_range(job.dst_tier, job.dst_slots)
        if wrong is not None:  # failed before any tag or checksum changes (-1 would wrap to another slot)
            self.engine.fail(job, f"destination check failed: {wrong}")
            return
        self.tags.clear(job.dst_tier, job.dst_slots)
        wrong = next(
            (r for s, h in zip(job.src_slots, job.block_hashes, strict=True)
             if (r := self.tags.refusal(job.src_tier, s, h, self.codec_id))), None,
        )  # fmt: skip
        if wrong is not None:
            self.engine.fail(job, f"source check failed: {wrong}")
            return
        if self.checksums is not None:
            self.checksums.move(job.src_tier, job.src_slots, job.dst_tier, job.dst_slots)
        self.engine.submit(job)

    def poll(self) -> list[JobResult]:
        return self._finished(self.engine.poll())

    def wait(self) -> list[JobResult]:
        return self._finished(self.engine.wait())

    @property
    def jobs_in_flight(self) -> int:
        return len(self._jobs)

    def _finished(self, results: list[JobResult]) -> list[JobResult]:
        for result in results:
            job = self._jobs.pop(result.job_id, None)
            if job is not None and result.ok:
                self.tags.set(job.dst_tier, job.dst_slots, job.block_hashes, self.codec_id)
        return results


def _by_tier(items: Sequence[StoreItem | LoadItem]) -> dict[str, list[int]]:
    """Positions of the items in each tier, in order."""
    tiers = [item.tier for item in items]
    if tiers and tiers.count(tiers[0]) == len(tiers):  # the common batch: one tier
        return {tiers[0]: list(range(len(tiers)))}
    groups: dict[str, list[int]] = {}
    for i, tier in enumerate(tiers):
        groups.setdefault(tier, []).append(i)
    return groups


def _in_item_order(count: int, sources: Sequence[BlockSource], parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """parts[k]: [len(sources[k].positions), …], source k's rows in its positions' order → [count, …] in
    item order, on parts[0]'s device (parts[0] itself when that one source holds every item)."""
    if len(sources) == 1 and len(sources[0].positions) == count:  # _by_tier keeps the order: 0 … count − 1
        return parts[0]
    first = parts[0]
    out = torch.empty(count, *first.shape[1:], dtype=first.dtype, device=first.device)
    for source, part in zip(sources, parts, strict=True):
        at = torch.as_tensor(source.positions, dtype=torch.int64, device=out.device)
        out.index_copy_(0, at, part.to(out.device))
    return out


def _mismatch(expected: torch.Tensor, got: torch.Tensor) -> str:
    """expected, got: [2, L, 2] int64 sums of one block's pieces → which pieces differ, the first one's
    sums."""
    expected, got = expected.cpu(), got.cpu()
    differ = (expected != got).any(2).nonzero().tolist()  # [(side, layer)]
    if not differ:
        return "its checksum verdict was negative but the sums agree"
    side, layer = differ[0]
    (e1, e2), (g1, g2) = expected[side, layer].tolist(), got[side, layer].tolist()
    more = (
        f"; {len(differ)} of its {expected.shape[0] * expected.shape[1]} pieces differ"
        if len(differ) > 1
        else ""
    )
    return (
        f"{'KV'[side]} of layer {layer}: sums {_hex(e1)}/{_hex(e2)} stored, {_hex(g1)}/{_hex(g2)} read{more}"
    )


def _hex(value: int) -> str:
    return f"{value & (2**64 - 1):016x}"
