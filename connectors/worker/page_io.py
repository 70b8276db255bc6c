"""Primary mode's connector I/O: vLLM's cache already holds TurboQuant pages in the tiers' byte format, so a
save gathers bytes and a load scatters them back — no encode, no decode.

Provides:
    save_pages(views, block_ids) -> KVBlocks          vLLM blocks → [L, n, BS, H, P] per section (a copy)
    load_pages(blocks, views, block_ids, src=None)    blocks[:, src[i]] (blocks[:, i] when src is None) →
                                                      vLLM block block_ids[i], in place
views: one PageViews per layer (tiercache.pages), in the pools' layer order; block_ids: vLLM block ids.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tiercache.pages import PageViews
from tiercache.worker.pools import SECTIONS, KVBlocks


def save_pages(views: Sequence[PageViews], block_ids: Sequence[int] | torch.Tensor) -> KVBlocks:
    idx = torch.as_tensor(block_ids, dtype=torch.long, device=views[0].k_packed.device)
    return KVBlocks(
        *(torch.stack([getattr(v, name).index_select(0, idx) for v in views]) for name in SECTIONS)
    )


def load_pages(
    blocks: KVBlocks,
    views: Sequence[PageViews],
    block_ids: Sequence[int] | torch.Tensor,
    src: torch.Tensor | None = None,
) -> None:
    idx = torch.as_tensor(block_ids, dtype=torch.long, device=views[0].k_packed.device)
    blocks = blocks.to(idx.device)
    if src is not None:  # one gather per section, all layers at once
        src = src.to(idx.device)
        blocks = KVBlocks(*(t.index_select(1, src) for t in blocks.tensors().values()))
    for layer, view in enumerate(views):
        for name in SECTIONS:
            getattr(view, name).index_copy_(0, idx, getattr(blocks, name)[layer])
