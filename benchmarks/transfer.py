"""Spill / warm bandwidth of the tier transfer engine against naive and contiguous baselines, in one run.

    python benchmarks/transfer.py            # CUDA: TQ4, 32 layers, 8 KV heads, block 16, d 128,
                                             # VRAM tier 4,096 blocks, move 1,024 random blocks
    python benchmarks/transfer.py --cpu      # tiny sizes on CPU (a smoke test: numbers mean nothing)

Rows (GB/s = payload bytes / wall seconds, median of --repeats, each timed with a device synchronize):
    ours            TransferEngine: GPU gather into device staging + one DMA per run of consecutive DRAM slots
                    (spill destinations from a fresh SlotAllocator: one run, as the manager hands them out)
    ours-scattered  the same with random DRAM slots (many runs): the worst case for the DRAM side
    naive           cold[:, idx] = gpu[:, idx].cpu()  (and gpu[:, idx] = cold[:, idx].cuda() for warm)
    contiguous      one pinned copy of the same number of bytes
Target (issue 4): ours ≥ min(40 GB/s, 80 % of contiguous) in both directions. Needs only torch (+ this repo).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

import torch

try:
    from tiercache.scheduler.allocator import SlotAllocator
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tiercache.scheduler.allocator import SlotAllocator
from tiercache.layout import BlockLayout
from tiercache.wire import DRAM, VRAM, TransferJob
from tiercache.worker.pools import SECTIONS, DramPool, VramPool
from tiercache.worker.transfer import TransferEngine


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu", action="store_true", help="tiny CPU smoke run (also used when CUDA is absent)")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--bits", type=int, default=4, help="TQ bits for K and V (4 = TQ4)")
    p.add_argument("--vram-blocks", type=int, default=4096)
    p.add_argument("--dram-blocks", type=int, default=4096)
    p.add_argument("--move", type=int, default=1024, help="blocks spilled then warmed")
    p.add_argument(
        "--staging-mib", type=int, default=64, help="device staging per direction (engine default)"
    )
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.cpu or not torch.cuda.is_available():
        args.cpu = True
        args.layers, args.kv_heads, args.vram_blocks, args.dram_blocks, args.move = 4, 2, 256, 256, 64
        args.repeats = min(args.repeats, 3)
        torch.set_num_threads(1)  # tiny copies: thread start-up would dominate
    return args


def timed(fn, sync, repeats: int) -> float:
    """Median wall seconds of fn() over repeats (after one warm-up), synchronizing around each call."""
    fn()
    sync()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device("cpu" if args.cpu else "cuda")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    packed = args.head_dim * args.bits // 8
    layout = BlockLayout(args.layers, args.block_size, args.kv_heads, packed, packed)
    vram = VramPool(layout, args.vram_blocks, device)
    dram = DramPool(layout, args.dram_blocks)
    engine = TransferEngine(vram, dram, staging_bytes=args.staging_mib * 2**20)
    torch.manual_seed(args.seed)
    for t in vram.views().values():  # random contents, so the round-trip check means something
        t.random_(0, 256) if t.dtype == torch.uint8 else t.normal_()
    rng = random.Random(args.seed)
    n = args.move
    src = rng.sample(range(args.vram_blocks), n)
    run_slots = SlotAllocator(args.dram_blocks).allocate(n)  # what the manager hands a spill batch: one run
    scattered = rng.sample(range(args.dram_blocks), n)
    back = rng.sample(range(args.vram_blocks), n)
    payload = n * layout.block_bytes
    job_ids = iter(range(1, 10**9))

    names = tuple(i.to_bytes(4, "little") for i in range(n))  # a job names its blocks; the engine moves bytes

    def ours(tiers, a, b):
        def fn():
            engine.submit(TransferJob(next(job_ids), *tiers, tuple(a), tuple(b), names))
            results = engine.wait()
            assert all(r.ok for r in results), results

        return fn

    expected = vram.read(src)
    ours((VRAM, DRAM), src, run_slots)()
    ours((DRAM, VRAM), run_slots, back)()
    round_trip_ok = vram.read(back).equal(expected)

    idx_dev = torch.as_tensor(src, device=device)
    cold_idx = torch.as_tensor(run_slots)
    back_dev = torch.as_tensor(back, device=device)
    cold = dram.views()

    def naive_spill():
        for name in SECTIONS:
            cold[name][:, cold_idx] = getattr(vram, name)[:, idx_dev].cpu()

    def naive_warm():
        for name in SECTIONS:
            getattr(vram, name)[:, back_dev] = cold[name][:, cold_idx].to(device)

    host = torch.empty(payload, dtype=torch.uint8, pin_memory=device.type == "cuda")
    dev = torch.empty(payload, dtype=torch.uint8, device=device)
    rows = []
    for label, fn in [
        ("spill  ours", ours((VRAM, DRAM), src, run_slots)),
        ("spill  ours-scattered", ours((VRAM, DRAM), src, scattered)),
        ("spill  naive", naive_spill),
        ("spill  contiguous D2H", lambda: host.copy_(dev, non_blocking=True)),
        ("warm   ours", ours((DRAM, VRAM), run_slots, back)),
        ("warm   ours-scattered", ours((DRAM, VRAM), scattered, back)),
        ("warm   naive", naive_warm),
        ("warm   contiguous H2D", lambda: dev.copy_(host, non_blocking=True)),
    ]:
        seconds = timed(fn, sync, args.repeats)
        rows.append((label, seconds, payload / seconds / 1e9))
    gbps = {label: rate for label, _, rate in rows}
    verdicts = []
    for direction, contiguous in (("spill", "spill  contiguous D2H"), ("warm", "warm   contiguous H2D")):
        target = min(40.0, 0.8 * gbps[contiguous])
        got = gbps[f"{direction:<6} ours"]
        verdicts.append(
            f"{direction}: ours {got:.1f} GB/s vs target {target:.1f} → {'PASS' if got >= target else 'FAIL'}"
        )

    where = (
        "CPU SMOKE RUN (tiny sizes; numbers are not meaningful)" if args.cpu else torch.cuda.get_device_name()
    )
    print(f"\n# benchmarks/transfer.py — {where}")
    print(
        f"TQ{args.bits}: {args.layers} layers, {args.kv_heads} KV heads, block {args.block_size}, "
        f"d {args.head_dim}; "
        f"VRAM tier {args.vram_blocks} blocks, DRAM tier {args.dram_blocks} blocks "
        f"({'pinned' if dram.pinned else 'plain'}); moving {n} random blocks = {payload / 1e6:.1f} MB "
        f"(K and V, packed + norms, {layout.block_bytes} B/block); device staging {args.staging_mib} MiB "
        f"per direction ({engine.max_batch} blocks per batch); median of {args.repeats}"
    )
    print(f"byte-exact round trip VRAM → DRAM → VRAM: {'yes' if round_trip_ok else 'NO'}")
    print(f"{'direction / method':<24} {'ms':>9} {'GB/s':>8}")
    for label, seconds, rate in rows:
        print(f"{label:<24} {seconds * 1e3:>9.2f} {rate:>8.2f}")
    for line in verdicts:
        print(line if not args.cpu else f"{line} (CPU smoke run: the target applies on CUDA only)")
    return 0 if round_trip_ok else 1


if __name__ == "__main__":
    sys.exit(main())
