"""Warm start: the kernels a connector worker's configuration will use are compiled and run once when vLLM
registers its caches, so the first requests pay no JIT compile.

Provides:
    warm_up(tiers, codec, layout, k_views, v_views, page_views) -> float   for one rank's registered caches
                                  (page_views: primary mode's, else k_views / v_views): seconds taken; 0.0
                                  when there is nothing to warm (no GPU) or $TIERCACHE_WARM_START is 0
    WARM_START_ENV, WARM_COUNTS
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

import torch

from tiercache.codecs import KVCodec
from tiercache.layout import BlockLayout
from tiercache.pages import PageViews
from tiercache.worker.integrity import checksums_of
from tiercache.worker.tier_worker import TierWorker

from .codec_io import decode_blocks, encode_blocks, verifies_in_kernel
from .kv_views import BlockAccess
from .page_io import save_pages

WARM_START_ENV = "TIERCACHE_WARM_START"
# Triton specializes an integer argument equal to 1 and one divisible by 16: one store and one load of each
# kind of count compiles every variant the serving path will launch
WARM_COUNTS = (1, 2, 16)


def warm_up(
    tiers: TierWorker,
    codec: KVCodec,
    layout: BlockLayout,
    k_views: Sequence[BlockAccess],
    v_views: Sequence[BlockAccess],
    page_views: Sequence[PageViews],
) -> float:
    """Encode vLLM's block 0 n times, checksum the copies and decode them as a load of n blocks into distinct
    blocks 0 … n−1 would, with every block but the first refused (its expected sums or its flag off: only
    block 0 is written), straight and through DRAM staging (primary mode: copy block 0's pages and checksum
    them), for each n of WARM_COUNTS, through the serving path's own calls: the first requests then pay no JIT
    compile. Block 0 is vLLM's null block (its BlockPool reserves it; no request's KV lives there), and the
    cache holds no request yet when vLLM registers it. No VRAM slot is written; the DRAM slots written are
    untagged (nothing reads them before a store or a move rewrites them)."""
    if tiers.vram.device.type != "cuda":
        return 0.0
    if os.environ.get(WARM_START_ENV, "1").strip().lower() in ("0", "false", "off", "no"):
        return 0.0
    start = time.perf_counter()
    device = tiers.vram.device
    for n in WARM_COUNTS:
        ids = [0] * n
        rows = torch.arange(n, device=device)
        if page_views:
            checksums_of(save_pages(page_views, ids))  # a store's
            checksums_of(save_pages(page_views, ids), rows)  # a load's, read in place
            continue
        blocks = encode_blocks(codec, k_views, v_views, ids, layout)
        dst = list(range(min(n, k_views[0].num_blocks)))  # distinct destinations, as a load's
        _load(tiers, codec, k_views, v_views, blocks, dst, rows)
        dram_slots = list(range(min(n, tiers.dram.num_blocks)))
        if dram_slots:
            tiers.engine.write_dram(dram_slots, blocks.select(list(range(len(dram_slots)))))
            staged, at = tiers.engine.stage_dram(dram_slots)
            _load(tiers, codec, k_views, v_views, staged, dst[: len(at)], at)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def _load(tiers, codec, k_views, v_views, blocks, dst: list[int], at: torch.Tensor) -> None:
    """blocks[:, at[i]] loaded into vLLM's blocks dst[i] as the serving path loads them (StepIO._load),
    every block but the first refused: its expected sums off by one (verified in the decode) or its flag
    off (a separate pass)."""
    at = at[: len(dst)]
    sums = checksums_of(blocks, at)  # what a store records, read in place
    if tiers.checksums is None:  # nothing to refuse with: one block, as nothing else may be written
        decode_blocks(codec, blocks, k_views, v_views, dst[:1], at[:1])
        return
    expected = sums.clone()
    expected[1:, :, :, 0] += 1
    if verifies_in_kernel(codec, blocks, k_views, v_views):
        got = torch.empty_like(expected)
        decode_blocks(codec, blocks, k_views, v_views, dst, at, verify=(expected, got))
        tiers.verdict(expected, got)
    else:
        ok = tiers.verdict(expected, sums).ok  # a separate pass's flags (sums is that pass), on the device
        decode_blocks(codec, blocks, k_views, v_views, dst, at, ok)
