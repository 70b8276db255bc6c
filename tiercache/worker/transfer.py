"""Worker-side transfer engine: spill (VRAM → DRAM) and warm (DRAM → VRAM) of arbitrary block sets.

Provides:
    TransferEngine(vram, dram, max_batch_blocks=None, staging_bytes=64 MiB)   staging per direction
        submit(job: TransferJob)          start a move between the tiers the job names; never blocks the
                                          caller (CUDA); a job that cannot start is reported failed
        fail(job, error)                  report a job failed without running it
        poll() -> list[JobResult]         jobs finished since the last poll (non-blocking)
        wait() -> list[JobResult]         block until everything submitted has finished
        stage_dram(slots) -> (KVBlocks, rows)   DRAM blocks copied to the VRAM device (current stream), as
                                          [L, n, …] views over the staging rows; block slots[i] is at
                                          position rows[i] (a [n] int64 device tensor): a load decodes
                                          from there, no further copy
        read_dram(slots) -> KVBlocks      the same as contiguous [L, n, …] tensors, in slot order
        write_dram(slots, blocks)         blocks on the VRAM device → DRAM slots (a store that went to DRAM)
                                          (all three: IndexError for a slot outside [0, DRAM slots), before
                                          any copy)

How a batch moves (no scatter on the CPU, one DMA per run of consecutive DRAM slots):
    spill: pairs sorted by DRAM slot; GPU gather (index_select) of the VRAM blocks into a device staging
           buffer laid out like DRAM rows [n, stride]; then one copy per run of consecutive DRAM slots
           straight into the pinned pool (the manager hands out spill destinations as one run when it can).
    warm:  pairs sorted by DRAM slot; one copy per run pinned pool → staging; GPU scatter (index_copy_)
           into the VRAM tensors.
On CUDA each direction has its own stream (spill D2H and warm H2D overlap) that first waits for the caller's
current stream; CUDA events time each job. On CPU the same code runs synchronously on plain memory.
Jobs never depend on each other (see jobs.py), so their order on the streams does not matter.
"""

from __future__ import annotations

import logging
import time

import torch

from tiercache.layout import contiguous_runs
from tiercache.wire import DRAM, VRAM, JobResult, TransferJob
from tiercache.worker.pools import DramPool, KVBlocks, VramPool, block_views

logger = logging.getLogger(__name__)
DEFAULT_STAGING_BYTES = 64 * 2**20  # per direction, on the device
DIRECTIONS = ((VRAM, DRAM), (DRAM, VRAM))


class TransferEngine:
    def __init__(
        self,
        vram: VramPool,
        dram: DramPool,
        max_batch_blocks: int | None = None,
        staging_bytes: int = DEFAULT_STAGING_BYTES,
    ) -> None:
        """Device staging per direction: max_batch_blocks rows, or as many as fit in staging_bytes; larger
        jobs move in batches of that many blocks, in order on their stream."""
        if vram.layout != dram.layout:
            raise ValueError(f"VRAM and DRAM pools have different layouts: {vram.layout} vs {dram.layout}")
        self.vram = vram
        self.dram = dram
        self.device = vram.device
        self.cuda = self.device.type == "cuda"
        if self.cuda and not dram.pinned:
            logger.warning(
                "tiercache: DRAM tier is not pinned: transfers will be slow and partly synchronous"
            )
        if max_batch_blocks is None:
            max_batch_blocks = staging_bytes // dram.stride
        self.max_batch = max(1, min(max_batch_blocks, max(vram.num_blocks, 1)))
        stride = dram.stride
        self._staging = {
            way: torch.empty(self.max_batch, stride, dtype=torch.uint8, device=self.device)
            for way in DIRECTIONS
        }  # [max_batch, stride] uint8 per direction: device rows laid out exactly like DRAM rows
        self._streams = {way: torch.cuda.Stream(self.device) for way in DIRECTIONS} if self.cuda else {}
        # Copy in the widest word that divides every (layer, block) piece: 8 bytes for real geometries.
        pieces = [
            _nbytes(shape, dtype) // vram.layout.num_layers for _, _, shape, dtype in vram.layout.sections()
        ]
        self._word = next(w for w in (torch.int64, torch.int32, torch.int16, torch.uint8)
                          if all(p % w.itemsize == 0 for p in pieces))  # fmt: skip
        self._vram_words = {  # [L, NB, words] views of the VRAM tensors
            name: t.view(torch.uint8).reshape(t.shape[0], t.shape[1], -1).view(self._word)
            for name, t in vram.views().items()
        }
        self._pending: list[tuple[TransferJob, torch.cuda.Event, torch.cuda.Event]] = []
        self._done: list[JobResult] = []

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def submit(self, job: TransferJob) -> None:
        try:
            self._check(job)
            if not self.cuda:
                t0 = time.perf_counter()
                self._run(job)
                self._done.append(self._result(job, time.perf_counter() - t0))
                return
            stream = self._streams[job.src_tier, job.dst_tier]
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                start.record(stream)
                self._run(job)
                end.record(stream)
            self._pending.append((job, start, end))
        except Exception as exc:  # a failed transfer is reported, never raised into the engine
            self.fail(job, f"{exc.__class__.__name__}: {exc}")

    def fail(self, job: TransferJob, error: str) -> None:
        """Report a job as failed without running it (the next poll returns it)."""
        logger.warning("tiercache: %s job %d failed: %s", job.kind, job.job_id, error)
        self._done.append(self._result(job, 0.0, error=error))

    def poll(self) -> list[JobResult]:
        still = []
        for job, start, end in self._pending:
            if end.query():
                self._done.append(self._result(job, start.elapsed_time(end) / 1e3))
            else:
                still.append((job, start, end))
        self._pending = still
        done, self._done = self._done, []
        return done

    def wait(self) -> list[JobResult]:
        for _, _, end in self._pending:
            end.synchronize()
        return self.poll()

    def stage_dram(self, slots) -> tuple[KVBlocks, torch.Tensor]:
        """DRAM blocks → device staging rows (one copy per run of consecutive slots, on the current stream):
        ([L, n, …] views over the rows, rows [n] int64 on the device: where block slots[i] is)."""
        slots = list(slots)
        self._check_slots(DRAM, slots)
        staging = torch.empty(len(slots), self.dram.stride, dtype=torch.uint8, device=self.device)
        order = sorted(range(len(slots)), key=slots.__getitem__)
        self._dma([slots[i] for i in order], staging, to_dram=False)
        inverse = torch.empty(len(slots), dtype=torch.int64)
        inverse[torch.as_tensor(order, dtype=torch.int64)] = torch.arange(len(slots))
        return block_views(staging, self.dram.layout), self._device_index(inverse.tolist())

    def read_dram(self, slots) -> KVBlocks:
        """DRAM blocks → a fresh KVBlocks on the VRAM device ([L, n, …] contiguous), on the current stream."""
        views, rows = self.stage_dram(slots)
        return KVBlocks(*(v.index_select(1, rows).contiguous() for v in views.tensors().values()))

    def write_dram(self, slots, blocks: KVBlocks) -> None:
        """Blocks on the VRAM device ([L, n, …]) → DRAM slots, on the current stream."""
        slots = list(slots)
        self._check_slots(DRAM, slots)
        staging = torch.empty(len(slots), self.dram.stride, dtype=torch.uint8, device=self.device)
        for name, view in block_views(staging, self.dram.layout).tensors().items():
            view.copy_(getattr(blocks, name))
        order = sorted(range(len(slots)), key=slots.__getitem__)
        rows = staging.index_select(0, torch.as_tensor(order, device=self.device)) if order else staging
        self._dma([slots[i] for i in order], rows, to_dram=True)

    # ------------------------------------------------------------------ internals
    def _run(self, job: TransferJob) -> None:
        to_dram = job.dst_tier == DRAM
        vram_slots, dram_slots = (job.src_slots, job.dst_slots) if to_dram else (job.dst_slots, job.src_slots)
        pairs = sorted(zip(dram_slots, vram_slots, strict=True))
        staging = self._staging[job.src_tier, job.dst_tier]
        for i in range(0, len(pairs), self.max_batch):
            chunk = pairs[i : i + self.max_batch]
            rows = staging[: len(chunk)]
            idx = self._device_index([v for _, v in chunk])
            if to_dram:
                for name, view in self._words(rows).items():  # gather straight into the staging rows
                    torch.index_select(self._vram_words[name], 1, idx, out=view.transpose(0, 1))
                self._dma([d for d, _ in chunk], rows, to_dram=True)
            else:
                self._dma([d for d, _ in chunk], rows, to_dram=False)
                for name, view in self._words(rows).items():
                    self._vram_words[name].index_copy_(1, idx, view.transpose(0, 1))

    def _dma(self, dram_slots: list[int], rows: torch.Tensor, to_dram: bool) -> None:
        """Copy rows[i] ↔ DRAM block dram_slots[i] (slots ascending): one copy per run of consecutive slots,
        split where a pinned registration chunk ends."""
        buffer = self.dram.buffer
        i = 0
        for start, length in contiguous_runs(dram_slots):
            while length:
                n = min(length, self.dram.chunk_end(start) - start)
                host, dev = buffer[start : start + n], rows[i : i + n]
                if to_dram:
                    host.copy_(dev, non_blocking=self.cuda)
                else:
                    dev.copy_(host, non_blocking=self.cuda)
                i, start, length = i + n, start + n, length - n

    def _words(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        """[n, L, words] views of each section of rows laid out like DRAM rows: a (block, layer) piece is
        contiguous, so gather and scatter move it as whole words, whatever the section's dtype."""
        n, layers = rows.shape[0], self.vram.layout.num_layers
        out = {}
        for name, offset, shape, dtype in self.vram.layout.sections():
            width = _nbytes(shape, dtype)
            out[name] = rows[:, offset : offset + width].view(n, layers, width // layers).view(self._word)
        return out

    def _device_index(self, slots: list[int]) -> torch.Tensor:
        idx = torch.as_tensor(slots, dtype=torch.int64)
        if self.cuda:
            idx = idx.pin_memory().to(self.device, non_blocking=True)
        return idx

    def _check(self, job: TransferJob) -> None:
        for tier_slots, pool in ((job.src_slots, job.src_tier), (job.dst_slots, job.dst_tier)):
            self._check_slots(pool, tier_slots)

    def _check_slots(self, pool: str, slots: list[int]) -> None:
        """IndexError before any copy: a negative DRAM slot would address another slot's bytes."""
        limit = self.vram.num_blocks if pool == VRAM else self.dram.num_blocks
        bad = [s for s in slots if not 0 <= s < limit]
        if bad:
            raise IndexError(f"{pool} slots out of range [0, {limit}): {bad[:5]}")

    def _result(self, job: TransferJob, seconds: float, error: str | None = None) -> JobResult:
        n = len(job)
        return JobResult(job.job_id, error is None, n, n * self.vram.layout.block_bytes, seconds, error)


def _nbytes(shape: tuple[int, ...], dtype: str) -> int:
    n = 4 if dtype == "float32" else 1
    for s in shape:
        n *= s
    return n


__all__ = ["TransferEngine"]
