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
with numpy's uint64 arithmetic, which wraps mod 2^64 as the definition does. The words are read in place
(no copy) where the layout allows, and a batch of PARALLEL_BYTES or more is split by blocks over up to
MAX_THREADS threads (torch.get_num_threads() bounds them: the cores this process may use), numpy releasing
the GIL while it sums.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from .reference import piece_bytes

PARALLEL_BYTES = 32 << 20
MAX_THREADS = 8
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def block_checksums_host(
    sections: Sequence[torch.Tensor], blocks: torch.Tensor | None = None
) -> torch.Tensor:
    """[n, 2] int64 (S1, S2) per block, on the sections' device (CPU)."""
    if blocks is not None:
        idx = blocks.to(device=sections[0].device, dtype=torch.int64)
        sections = [section.index_select(1, idx) for section in sections]
    n = sections[0].shape[1]
    nbytes = sum(s.numel() * s.element_size() for s in sections)
    workers = min(torch.get_num_threads(), MAX_THREADS, n)
    if nbytes < PARALLEL_BYTES or workers < 2:
        return _sums(sections)
    step = -(-n // workers)
    chunks = [[s[:, i : i + step] for s in sections] for i in range(0, n, step)]
    return torch.cat(list(_threads().map(_sums, chunks)))


def _threads() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(MAX_THREADS, thread_name_prefix="tiercache-checksum")
        return _pool


def _sums(sections: Sequence[torch.Tensor]) -> torch.Tensor:
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
        w = _words(raw)  # [L, n, W]
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


def _words(raw: torch.Tensor) -> np.ndarray:
    """[L, n, B] uint8 (B a multiple of 4) as uint32 words [L, n, B / 4], read in place where each piece is
    contiguous and every piece starts on a 4-byte boundary (a block-major DRAM row's sections are), else
    through one contiguous copy."""
    a = raw.numpy()
    if a.strides[2] == 1 and a.strides[0] % 4 == 0 and a.strides[1] % 4 == 0 and raw.data_ptr() % 4 == 0:
        return a.view(np.uint32)
    return raw.contiguous().numpy().view(np.uint32)
