"""The worker's loads and stores of one step, as a mixin of ConnectorWorker (connector_worker.py).

Provides:
    StepState                 one step's plan and how far it got (loads_ok / stores_ok turn True once done)
    StepIO                    the methods below, on the ConnectorWorker's state: tiers (TierWorker), timer,
                              layout, geometry, codec, k_views / v_views (offload), page_views (primary),
                              remote / disk (RemoteSteps, DiskSteps or None), _load_errors, _error(reason)
        _load(step)           refused loads (tags, failed fetches) reported; the others read from their
                              tiers and decoded (offload: each piece's checksum verified by the decode's own
                              kernels where they can, else compared on the device in a separate pass whose
                              flags the decode reads) or page-copied after their verdicts (primary)
        _settle(step)         the decoded loads' verdicts: ok, or refused with their reasons (a block the
                              step fetched or read from disk refused: that tier refuses its value)
        _store(step)          encode (offload) or copy (primary) the plan's stores into their slots
        _refuse(step, i, reason)   load i is a load error for vLLM and a LoadFailure for the scheduler
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tiercache.wire import VRAM, LoadFailure, StepPlan

from .codec_io import decode_blocks, encode_blocks, encode_into, verifies_in_kernel
from .page_io import load_pages, save_pages


@dataclass
class StepState:
    """One step's plan and how far it got (items turn ok only once done)."""

    plan: StepPlan
    loads_ok: list[bool]
    stores_ok: list[bool]
    submitted: set[int] = field(default_factory=set)  # job ids handed to the TierWorker
    load_failures: list[LoadFailure] = field(default_factory=list)
    unfetched: dict[bytes, str] = field(default_factory=dict)  # reads and fetches that failed: why
    reading: list = field(default_factory=list)  # PendingFetch of its disk reads and remote fetches in flight
    verdicts: tuple | None = None  # (load positions, LoadItems, ReadCheck): decoded, not yet settled
    stored: bool = False  # its stores are done (finish_step ran)
    ended: bool = False  # its StepResult is recorded

    @classmethod
    def of(cls, plan: StepPlan) -> StepState:
        return cls(plan, [False] * len(plan.loads), [False] * len(plan.stores))


class StepIO:
    def _load(self, step: StepState) -> None:
        todo = []
        loads = step.plan.loads
        unfetched = step.unfetched
        for i, reason in enumerate(self.tiers.refusals_before_read(loads)):
            reason = (unfetched.get(loads[i].block_hash) if unfetched else None) or reason
            if reason:
                self._refuse(step, i, reason)
            else:
                todo.append(i)
        if not todo:
            return
        items = [step.plan.loads[i] for i in todo]
        with self.timer.measure("load", len(items), len(items) * self.layout.block_bytes):
            sources = self.tiers.read(items)  # VRAM slots in place, DRAM blocks staged on the device
            if self.geometry.primary:
                reasons = self.tiers.verify_read(items, sources)  # before any byte reaches vLLM's cache
                self._copy_pages(items, sources, reasons)
                self._record(step, todo, reasons)
                return
            # the decode verifies or reads the verdicts on the device: no byte of a changed piece is
            # written, and the host learns which blocks were refused later in the step (_settle)
            expected = self.tiers.expected_sums(items, sources)
            if expected is not None and all(
                verifies_in_kernel(self.codec, s.blocks, self.k_views, self.v_views) for s in sources
            ):
                check = self._decode_verified(items, sources, expected)
            else:
                check = self.tiers.check_read(items, sources)
                for source in sources:
                    ids = [items[j].block_id for j in source.positions]
                    ok = None if check is None else _part(check.ok, source.positions, len(items))
                    decode_blocks(self.codec, source.blocks, self.k_views, self.v_views, ids, source.ids, ok)
            step.verdicts = (todo, items, check)

    def _decode_verified(self, items: list, sources: list, expected: torch.Tensor):
        """Each source decoded by kernels that check every piece's sums against the recorded ones
        (source.expected; expected: all of them, [n, 2, L, 2] in item order) before writing it; the ReadCheck
        of the sums they read."""
        got = torch.empty_like(expected)
        for source in sources:
            ids = [items[j].block_id for j in source.positions]
            whole = len(source.positions) == len(items)
            at = None if whole else torch.as_tensor(source.positions, dtype=torch.int64, device=got.device)
            want = expected if whole else source.expected
            read = got if whole else torch.empty_like(want)
            decode_blocks(
                self.codec, source.blocks, self.k_views, self.v_views, ids, source.ids, verify=(want, read)
            )
            if not whole:
                got.index_copy_(0, at, read)
        return self.tiers.verdict(expected, got)

    def _settle(self, step: StepState) -> None:
        """The step's decoded loads: ok, or refused with their reasons (waits for the comparison's event:
        the verifying decode itself, or a separate pass queued before the decode). Runs before vLLM reads
        this step's load errors."""
        if step.verdicts is None:
            return
        todo, items, check = step.verdicts
        try:
            reasons = self.tiers.refusals(items, check)
        except Exception as e:  # the verdicts are lost: none of these loads is served
            reasons = [f"its checksum verdict could not be read ({type(e).__name__}: {e})"] * len(items)
        step.verdicts = None
        self._record(step, todo, reasons)

    def _record(self, step: StepState, todo: list[int], reasons: list[str | None]) -> None:
        for j, reason in enumerate(reasons):
            if reason:
                self._refuse(step, todo[j], reason)
                self._refuse_source(step, step.plan.loads[todo[j]].block_hash, reason)
            else:
                step.loads_ok[todo[j]] = True

    def _refuse_source(self, step: StepState, block_hash: bytes, reason: str) -> None:
        """A block this step fetched or read from disk failed its load's check: that tier refuses its value
        (fetches keep the values' piece checksums unchecked on the host: the load's check is theirs)."""
        for steps, reads in ((self.remote, step.plan.fetches), (self.disk, step.plan.disk_reads)):
            if steps is not None and any(item.block_hash == block_hash for item in reads):
                steps.refuse_loaded(block_hash, reason)

    def _copy_pages(self, items: list, sources: list, reasons: list[str | None]) -> None:
        """Primary mode: the intact blocks' pages copied into vLLM's blocks."""
        for source in sources:
            keep = [k for k, j in enumerate(source.positions) if not reasons[j]]
            if keep:
                ids = [items[source.positions[k]].block_id for k in keep]
                src = source.ids if len(keep) == len(source.positions) else source.ids[keep]
                load_pages(source.blocks, self.page_views, ids, src)

    def _refuse(self, step: StepState, i: int, reason: str) -> None:
        """Load i of the step is not served: vLLM recomputes its block; the scheduler learns why."""
        item = step.plan.loads[i]
        self._error(f"load of block {item.block_hash.hex()[:16]} refused: {reason}")
        self._load_errors.add(item.block_id)
        step.load_failures.append(LoadFailure(i, reason))

    def _store(self, step: StepState) -> None:
        """Offload mode encodes VRAM-tier stores straight into their slots (encode_into); DRAM-tier stores,
        and primary mode's page copies, go through one [L, n, …] copy (TierWorker.store)."""
        stores = step.plan.stores
        with self.timer.measure("store", len(stores), len(stores) * self.layout.block_bytes):
            in_place = [] if self.geometry.primary else [s for s in stores if s.tier == VRAM]
            if in_place:
                ids = [s.block_id for s in in_place]
                self.tiers.store_in_place(
                    in_place,
                    lambda pool, slots: encode_into(
                        self.codec, self.k_views, self.v_views, ids, self.layout, pool, slots
                    ),
                )
            copied = [s for s in stores if self.geometry.primary or s.tier != VRAM]
            if copied:
                ids = [s.block_id for s in copied]
                if self.geometry.primary:
                    blocks = save_pages(self.page_views, ids)
                else:
                    blocks = encode_blocks(self.codec, self.k_views, self.v_views, ids, self.layout)
                self.tiers.store(copied, blocks)
        step.stores_ok[:] = [True] * len(stores)


def _part(flags: torch.Tensor, positions: list[int], total: int) -> torch.Tensor:
    """flags[positions] (flags itself when the positions are all of them, in order)."""
    if len(positions) == total:
        return flags
    return flags[torch.as_tensor(positions, dtype=torch.int64, device=flags.device)]
