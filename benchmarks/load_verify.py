"""The load's decode kernel with and without checksum verification (issue 26), GPU only, one run:

    python benchmarks/load_verify.py            # 1,024 blocks × 32 layers × 8 KV heads × d128, K8 and V4

Timed (CUDA events, best of 3 medians of 20): tq_dequantize_layers for both sides into bf16 FLASH_ATTN-layout
caches, (1) unverified; (2) a separate piece_checksums pass over the blocks, the comparison, then the
decode skipping refused blocks (ok flags); (3) verify=: each program sums its piece, compares, and decodes
only an intact piece. The sums that verify stores are checked against piece_checksums. The table's last
column is each row's time over the unverified decode's (target for (3): ≤ 1.05).
"""

from __future__ import annotations

import statistics

import torch

from tiercache.kernels import PagedLayers, TurboQuantCodec, piece_checksums, tq_dequantize_layers
from tiercache.kernels import dequantize as dequantize_module

LAYERS, BLOCKS, POOL, BLOCK_SIZE, HEADS, HEAD_DIM = 32, 1024, 1100, 16, 8, 128


def timed(fn, repeat: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/load_verify.py needs a CUDA GPU")
    dev = "cuda"
    caches = [torch.zeros(POOL, BLOCK_SIZE, HEADS, 2 * HEAD_DIM, device=dev, dtype=torch.bfloat16)
              for _ in range(LAYERS)]  # fmt: skip
    keys = PagedLayers([c[..., :HEAD_DIM] for c in caches])
    values = PagedLayers([c[..., HEAD_DIM:] for c in caches])
    sides = []
    for bits, out in ((8, keys), (4, values)):
        codec = TurboQuantCodec(HEAD_DIM, bits, seed=bits)
        shape = (LAYERS, POOL, BLOCK_SIZE, HEADS)
        packed = torch.randint(0, 256, (*shape, codec.packed_dim), device=dev, dtype=torch.uint8)
        sides.append((codec, out, packed, torch.rand(*shape, device=dev) + 0.5))
    ids = torch.randperm(POOL, device=dev)[:BLOCKS]
    dst = torch.randperm(POOL, device=dev)[:BLOCKS]
    expected = [piece_checksums([[p, n]], ids)[:, 0].clone() for _, _, p, n in sides]  # [N, L, 2] each
    got = [torch.empty_like(e) for e in expected]

    def plain() -> None:
        for codec, out, packed, norms in sides:
            tq_dequantize_layers(packed, norms, ids, codec, out, dst)

    def separate() -> None:
        read = [piece_checksums([[p, n]], ids)[:, 0] for _, _, p, n in sides]
        ok = torch.stack([(e == r).flatten(1).all(1) for e, r in zip(expected, read, strict=True)]).all(0)
        for codec, out, packed, norms in sides:
            tq_dequantize_layers(packed, norms, ids, codec, out, dst, ok=ok)

    def verified() -> None:
        for (codec, out, packed, norms), e, g in zip(sides, expected, got, strict=True):
            tq_dequantize_layers(packed, norms, ids, codec, out, dst, verify=(e, g))

    rows = []
    for label, fn in (("unverified decode", plain), ("separate checksum pass + ok flags", separate),
                      ("verified in the decode", verified)):  # fmt: skip
        ms = min(timed(fn) for _ in range(3))
        kernel = dequantize_module.LAST_COMPILED["dequantize"]
        rows.append((label, ms, kernel.n_regs, kernel.n_spills))
    for e, g in zip(expected, got, strict=True):
        assert torch.equal(e, g), "the sums verify stored differ from piece_checksums"
    print(f"{torch.cuda.get_device_name()}: {BLOCKS} blocks × {LAYERS} layers × {HEADS} heads × d{HEAD_DIM}, "
          "K8 and V4 into bf16; verify's sums equal piece_checksums")  # fmt: skip
    print("| path | ms | × unverified | decode registers / spills |\n|---|---|---|---|")
    for label, ms, regs, spills in rows:
        print(f"| {label} | {ms:.3f} | {ms / rows[0][1]:.2f} | {regs} / {spills} |")


if __name__ == "__main__":
    main()
