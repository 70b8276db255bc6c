"""Connector I/O: save (encode vLLM blocks into the VRAM tier) and load (decode tier blocks into a bf16 paged
cache) through the connector's worker code path, against a plain bf16 block copy of the same blocks.

    python benchmarks/connector_io.py                      # GPU: 1024 blocks × 32 layers × 8 KV heads × d128
    python benchmarks/connector_io.py --tiny               # CPU smoke: 64 blocks × 2 layers × 2 heads × d64

Path measured: ConnectorWorker.finish_step (stores: encode vLLM's blocks straight into their VRAM slots —
tq_encode_layers on CUDA, one launch for every layer, reading the cache in place —, checksum the slots, tag
them) and ConnectorWorker.start_step and take_load_errors (loads: check the slots' tags, decode —
tq_dequantize_layers on CUDA, one launch per side for every layer, each program summing its (layer, side)
piece and comparing the sums with the recorded ones before it writes — straight into vLLM's blocks, then
learn the verdicts).
The paged cache uses the FLASH_ATTN logical layout [NB, H, BS, 2·D] (K‖V per token). Baseline: the same
blocks copied bf16 → bf16 (index_select into a pool / index_copy_ back). GB/s counts bf16 KV bytes (what
the blocks hold in vLLM), so the columns compare directly; the median of --repeat runs is reported.
Each codec runs on two workers with the same caches, alternated --rounds times (medians over the rounds):
piece checksums on (as served: computed from the encoded bytes on save, verified by the decode on load) and
off; the last table is what they cost (issue 26 target: ≤ 5 % of the save and of the load).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from tiercache.config import TierCacheConfig
from tiercache.connectors.common import Geometry
from tiercache.connectors.worker import ConnectorWorker
from tiercache.wire import VRAM, LoadItem, StepPlan, StoreItem


def timed(fn, device: torch.device, repeat: int) -> float:
    fn()  # warm-up (Triton compilation, allocator)
    times = []
    for _ in range(repeat):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def bench_codec(
    codec: str, caches: dict, geometry: Geometry, blocks: int, repeat: int, checksums: bool = True
) -> dict[str, float]:
    config = TierCacheConfig.from_dict(
        {
            "codec": codec,
            "tiers": {
                "vram": f"{blocks * geometry.block_size} tokens",
                "dram": f"{geometry.block_size} tokens",
            },
        }
    )
    worker = ConnectorWorker(config, geometry)
    worker.register(caches, dict.fromkeys(caches, "FLASH_ATTN"))
    if not checksums:
        worker.tiers.checksums = None  # neither computed on save nor verified on load
    device = worker.k_views[0].device
    hashes = [i.to_bytes(32, "little") for i in range(blocks)]
    src_ids = list(range(blocks))  # vLLM blocks saved …
    dst_ids = list(range(blocks, 2 * blocks))  # … and loaded back into other blocks
    save = StepPlan(
        0,
        stores=tuple(StoreItem(h, VRAM, i, b) for i, (h, b) in enumerate(zip(hashes, src_ids, strict=True))),
    )
    load = StepPlan(
        1, loads=tuple(LoadItem(h, VRAM, i, b) for i, (h, b) in enumerate(zip(hashes, dst_ids, strict=True)))
    )
    t_save = timed(lambda: worker.finish_step(save), device, repeat)
    # a load as vLLM drives it: start_step, then the step's load errors (the checksum verdicts settled)
    t_load = timed(lambda: (worker.start_step(load), worker.take_load_errors()), device, repeat)
    worker.finish_step(load)  # records the last load's step result
    report = worker.take_report()
    ok = report is not None and len(report.steps) == 2
    assert ok and all(all(s.loads_ok) and all(s.stores_ok) for s in report.steps), "a save or load failed"
    assert not worker.take_load_errors()
    pool_bytes = worker.layout.block_bytes * blocks
    return {"save": t_save, "load": t_load, "pool_bytes": pool_bytes}


def bench_copy(caches: dict, blocks: int, repeat: int) -> dict[str, float]:
    device = next(iter(caches.values())).device
    src = torch.arange(blocks, device=device)
    dst = torch.arange(blocks, 2 * blocks, device=device)
    pool = {name: c.index_select(0, src) for name, c in caches.items()}

    def save() -> None:
        for name, c in caches.items():
            torch.index_select(c, 0, src, out=pool[name])

    def load() -> None:
        for name, c in caches.items():
            c.index_copy_(0, dst, pool[name])

    return {"save": timed(save, device, repeat), "load": timed(load, device, repeat)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="small CPU-friendly shape")
    parser.add_argument("--blocks", type=int)
    parser.add_argument("--layers", type=int)
    parser.add_argument("--heads", type=int)
    parser.add_argument("--head-dim", type=int)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--codecs", nargs="+", default=["tq4", "k8v4"])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=3, help="alternations of checksums on and off")
    args = parser.parse_args()
    tiny = args.tiny or not torch.cuda.is_available()
    blocks = args.blocks or (64 if tiny else 1024)
    layers = args.layers or (2 if tiny else 32)
    heads = args.heads or (2 if tiny else 8)
    head_dim = args.head_dim or (64 if tiny else 128)
    bs = args.block_size
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    names = tuple(f"model.layers.{i}.self_attn.attn" for i in range(layers))
    geometry = Geometry(names, heads, head_dim, bs, torch.bfloat16)
    gen = torch.Generator(device=device).manual_seed(0)
    caches = {  # logical [NB, H, BS, 2·D] over physical NHD [NB, BS, H, 2·D]
        n: torch.randn(2 * blocks, bs, heads, 2 * head_dim, generator=gen, device=device)
        .to(torch.bfloat16)
        .transpose(1, 2)
        for n in names
    }
    bf16_bytes = blocks * layers * bs * heads * head_dim * 2 * 2
    shape = f"{blocks} blocks × {layers} layers × {heads} KV heads × d{head_dim}, block size {bs}"
    print(f"device {device}: {shape}; {bf16_bytes / 2**20:.1f} MiB of bf16 KV per direction")
    rows = []
    copy = bench_copy(caches, blocks, args.repeat)
    for op in ("save", "load"):
        rows.append(("bf16 copy", op, copy[op], copy[op], bf16_bytes))
    cost = []
    for codec in args.codecs:
        runs = [(bench_codec(codec, caches, geometry, blocks, args.repeat),
                 bench_codec(codec, caches, geometry, blocks, args.repeat, checksums=False))
                for _ in range(args.rounds)]  # fmt: skip
        r = {key: statistics.median(on[key] for on, _ in runs) for key in runs[0][0]}
        off = {key: statistics.median(o[key] for _, o in runs) for key in runs[0][1]}
        for op in ("save", "load"):
            rows.append((codec, op, r[op], copy[op], r["pool_bytes"]))
            rows.append((f"{codec}, checksums off", op, off[op], copy[op], r["pool_bytes"]))
            cost.append((codec, op, off[op], r[op]))
    print("\n| path | op | blocks/s | GB/s (bf16 KV) | tier bytes | time vs bf16 copy |")
    print("|---|---|---|---|---|---|")
    for path, op, t, t_copy, tier_bytes in rows:
        gbps, mib = bf16_bytes / t / 1e9, tier_bytes / 2**20
        print(f"| {path} | {op} | {blocks / t:,.0f} | {gbps:.2f} | {mib:.1f} MiB | {t / t_copy:.1f}× |")
    print("\nchecksum cost (issue 26 target: on ≤ off + 5 %)")
    print("| codec | op | off ms | on ms | cost |\n|---|---|---|---|---|")
    for codec, op, t_off, t_on in cost:
        print(f"| {codec} | {op} | {t_off * 1e3:.2f} | {t_on * 1e3:.2f} | {t_on / t_off - 1:+.1%} |")


if __name__ == "__main__":
    main()
