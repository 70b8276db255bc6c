"""Piece checksums on the host: the same bits as the reference (kernels/reference.py, defined in checksum.py),
in two reductions per section — the CPU path of the connector's stores, loads and remote fetches.

Provides:
    piece_checksums_host(groups, blocks=None) -> [n, G, L, 2] int64   groups: G sequences of [L, NB, …] CPU
                                                                       tensors; blocks: which of the NB
                                                                       blocks (None: all)
    host_threads() -> ThreadPoolExecutor   the process's one pool of MAX_THREADS threads for host byte work
                                           that releases the GIL (these sums; the remote values' MACs)
    PARALLEL_BYTES, MAX_THREADS            from how many bytes such work is split, over at most how many

How: a section's words w[l, b, j] (j < W words of one piece of the section) sit at positions base + j + 1 of
their piece, so per (layer, block)
    S1 += Σ_j w[l, b, j]                 S2 += base · Σ_j w[l, b, j] + Σ_j (j + 1) · w[l, b, j]
with numpy's uint64 arithmetic (the weighted sum an einsum accumulating in uint64, without a product
array), which wraps mod 2^64 as the definition does. The words are read in place (no copy) where the
layout allows, and a batch of PARALLEL_BYTES or more is split by blocks over up to MAX_THREADS threads
(torch.get_num_threads() bounds them: the cores this process may use), numpy releasing the GIL while it sums.
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


def piece_checksums_host(
    groups: Sequence[Sequence[torch.Tensor]], blocks: torch.Tensor | None = None
) -> torch.Tensor:
    """[n, G, L, 2] int64 (S1, S2) per piece, on the sections' device (CPU)."""
    if blocks is not None:
        idx = blocks.to(device=groups[0][0].device, dtype=torch.int64)
        groups = [[t.index_select(1, idx) for t in group] for group in groups]
    n = groups[0][0].shape[1]
    nbytes = sum(t.numel() * t.element_size() for group in groups for t in group)
    workers = min(torch.get_num_threads(), MAX_THREADS, n)
    if nbytes < PARALLEL_BYTES or workers < 2:
        return _sums(groups)
    step = -(-n // workers)
    chunks = [[[t[:, i : i + step] for t in group] for group in groups] for i in range(0, n, step)]
    return torch.cat(list(host_threads().map(_sums, chunks)))


def host_threads() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(MAX_THREADS, thread_name_prefix="tiercache-host")
        return _pool


def _sums(groups: Sequence[Sequence[torch.Tensor]]) -> torch.Tensor:
    layers, n = groups[0][0].shape[:2]
    out = np.zeros((n, len(groups), layers, 2), dtype=np.uint64)
    for g, group in enumerate(groups):
        base = 0
        for section in group:
            raw = piece_bytes(section)  # [L, n, B] uint8
            nbytes = raw.shape[2]
            words = -(-nbytes // 4)
            if words * 4 != nbytes:
                raw = torch.nn.functional.pad(raw, (0, words * 4 - nbytes))
            w = _words(raw)  # [L, n, W]
            pos = np.arange(1, words + 1, dtype=np.uint32)
            s1 = w.sum(axis=2, dtype=np.uint64)  # [L, n]
            s2 = np.einsum("lnw,w->ln", w, pos, dtype=np.uint64)
            out[:, g, :, 0] += s1.T
            out[:, g, :, 1] += s2.T + np.uint64(base) * s1.T
            base += words
    return torch.from_numpy(out.view(np.int64)).to(groups[0][0].device)


def _words(raw: torch.Tensor) -> np.ndarray:
    """[L, n, B] uint8 (B a multiple of 4) as uint32 words [L, n, B / 4], read in place where each piece is
    contiguous and every piece starts on a 4-byte boundary (a block-major DRAM row's sections are), else
    through one contiguous copy."""
    a = raw.numpy()
    if a.strides[2] == 1 and a.strides[0] % 4 == 0 and a.strides[1] % 4 == 0 and raw.data_ptr() % 4 == 0:
        return a.view(np.uint32)
    return raw.contiguous().numpy().view(np.uint32)
