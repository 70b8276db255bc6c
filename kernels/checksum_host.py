"""Block checksums on the host: the same bits as the reference (kernels/reference.py, defined in checksum.py),
in two reductions per section instead of a product array — the CPU path of the connector's stores, loads and
remote fetches.

Provides:
    block_checksums_host(sections, blocks=None) -> [n, 2] int64   sections: [L, NB, …] CPU tensors; blocks:
                                                                   which of the NB blocks (None: all)

How: a section's words w[l, j] of one block (l < L layers, j < W words a piece) sit at positions
base + l·W + j + 1, so
    S1 += Σ_l r_l                                         r_l = Σ_j w[l, j]   (one pass over the words)
    S2 += (base + 1)·S1_section + W·Σ_l l·r_l + Σ_j j·c_j  c_j = Σ_l w[l, j]   (a second pass)
with numpy's uint64 arithmetic, which wraps mod 2^64 as the definition does.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .reference import piece_bytes


def block_checksums_host(
    sections: Sequence[torch.Tensor], blocks: torch.Tensor | None = None
) -> torch.Tensor:
    """[n, 2] int64 (S1, S2) per block, on the sections' device (CPU)."""
    if blocks is not None:
        idx = blocks.to(device=sections[0].device, dtype=torch.int64)
        sections = [section.index_select(1, idx) for section in sections]
    n = sections[0].shape[1]
    s1 = np.zeros(n, dtype=np.uint64)
    s2 = np.zeros(n, dtype=np.uint64)
    base = 0
    for section in sections:
        raw = piece_bytes(section)  # [L, n, B] uint8
        layers, _, nbytes = raw.shape
        words = -(-nbytes // 4)
        if words * 4 != nbytes:
            raw = torch.nn.functional.pad(raw, (0, words * 4 - nbytes))
        w = raw.contiguous().numpy().view(np.uint32)  # [L, n, W]
        rows = w.sum(axis=2, dtype=np.uint64)  # [L, n]
        cols = w.sum(axis=0, dtype=np.uint64)  # [n, W]
        first = rows.sum(axis=0, dtype=np.uint64)  # [n]
        by_layer = (np.arange(layers, dtype=np.uint64)[:, None] * rows).sum(axis=0, dtype=np.uint64)
        by_word = (cols * np.arange(words, dtype=np.uint64)).sum(axis=1, dtype=np.uint64)
        s1 += first
        s2 += np.uint64(base + 1) * first + np.uint64(words) * by_layer + by_word
        base += layers * words
    out = np.stack([s1, s2], axis=1).view(np.int64)
    return torch.from_numpy(out.copy()).to(sections[0].device)
