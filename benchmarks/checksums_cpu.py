"""Piece checksums on the CPU: the PyTorch reference against piece_checksums_host (the CPU path of stores,
loads and remote fetches when there is no GPU), same blocks, same run; both give the same bits.

    python benchmarks/checksums_cpu.py            # 64 blocks of Llama-3.1-8B's k8v4 and tq4 layouts, 256 tiny
"""

from __future__ import annotations

import statistics
import time

import torch

from tiercache.codecs import KVCodecSpec
from tiercache.kernels import piece_checksums_host
from tiercache.kernels.reference import piece_checksums_reference
from tiercache.layout import BlockLayout

SHAPES = {
    "llama8b (32L×8H×d128, block 16)": (32, 8, 128, 16, 64),
    "tiny (2L×2H×d64, block 32)": (2, 2, 64, 32, 256),
}


def groups(layout: BlockLayout, n: int) -> list[list[torch.Tensor]]:
    """The tiers' pieces: K = (k_packed, k_norms), V = (v_packed, v_norms)."""
    g = torch.Generator().manual_seed(0)
    shape = (layout.num_layers, n, layout.block_size, layout.num_kv_heads)
    return [
        [torch.randint(0, 256, (*shape, layout.k_packed_dim), generator=g, dtype=torch.uint8),
         torch.randn(*shape, generator=g)],
        [torch.randint(0, 256, (*shape, layout.v_packed_dim), generator=g, dtype=torch.uint8),
         torch.randn(*shape, generator=g)],
    ]  # fmt: skip


def timed(fn, repeat: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    print("| shape | codec | MB | reference GB/s | host GB/s | host ÷ reference |\n|---|---|---|---|---|---|")
    for name, (layers, heads, head_dim, block, n) in SHAPES.items():
        for codec in ("k8v4", "tq4"):
            layout = BlockLayout.from_spec(KVCodecSpec.from_preset(codec), layers, heads, head_dim, block)
            blocks = groups(layout, n)
            assert torch.equal(piece_checksums_host(blocks), piece_checksums_reference(blocks))
            nbytes = sum(t.numel() * t.element_size() for group in blocks for t in group)
            ref = timed(lambda b=blocks: piece_checksums_reference(b))
            host = timed(lambda b=blocks: piece_checksums_host(b))
            print(f"| {name} | {codec} | {nbytes / 1e6:.1f} | {nbytes / ref / 1e9:.2f} | "
                  f"{nbytes / host / 1e9:.2f} | {ref / host:.1f}× |")  # fmt: skip


if __name__ == "__main__":
    main()
