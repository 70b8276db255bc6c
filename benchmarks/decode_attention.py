"""Decode attention: fused TurboQuant kernel vs torch SDPA bf16 (cuDNN, flash) vs the TQ byte floor.

32 query heads, 8 KV heads, head_dim 128, block size 16, every sequence at full length S.
Usage:  python benchmarks/decode_attention.py [--presets k4v4,k8v4] [--sweep [--variants JSON]] [--before]
        [--json PATH] [--widths] [--shapes 256x1024,128x2048] [--sweep-widths 8x4,5x3]
--widths [--head-dim 64] times every key width with 4-bit values, every value width with 4-bit keys and a
few mixed pairs (capacity's K5V3 among them; --width-pairs 2x2,1x1: those and K4V4 instead) at 16 × 32K and
64 × 8K (graph replay) and prints each one's time per byte read against K4V4's (issue 35: within 1.3×).
Times are medians of CUDA-event timings with L2 flushed before each call, eager and CUDA-graph replay.
The byte floor is the TQ bytes read (packed K, V, norms, block table) over the copy bandwidth measured
in the same run. Prints one table per preset last; --before [JSON] adds another launch configuration
(default BEFORE: the Triton perfield kernel that the Gluon kernel replaced) timed in the same run.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, replace

import torch
import torch.nn.functional as F
from _timing import bench_us, compiled_report, copy_bandwidth_gbs, describe_device, git_commit, graphed
from torch.nn.attention import SDPBackend, sdpa_kernel

from tiercache.kernels import (
    DecodeLaunchConfig,
    DecodeWorkspace,
    TurboQuantCodec,
    tq_decode_attention,
    tq_dequantize_blocks,
)
from tiercache.kernels import decode_attention as decode_module

SHAPES = [(1, 4096), (1, 32768), (16, 4096), (16, 32768), (64, 8192)]
HQ, H, D, BS = 32, 8, 128, 16
# preset → (key bits, value bits, key codebook, value codebook)
PRESETS = {
    "k4v4": (4, 4, "lloyd", "lloyd"),
    "k8v4": (8, 4, "lloyd", "lloyd"),
    "k8v4u": (8, 4, "uniform", "lloyd"),  # the k8v4u codec preset: uniform 8-bit keys
    "k6v4": (6, 4, "lloyd", "lloyd"),  # the balanced preset
    "k5v3": (5, 3, "lloyd", "lloyd"),  # the capacity preset
}
WIDTH_SHAPES = [(16, 32768), (64, 8192)]
WIDTH_MIXED = [(5, 3), (6, 3), (3, 3), (2, 2), (1, 1), (8, 2), (7, 1)]  # capacity K5V3 and other corners
SDPA_BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
BEFORE = {"lut_kernel": False}  # the Triton perfield kernel (the default until the Gluon kernel, 066e2a9)


class Case:
    """One (B, S) decode problem in TQ form, plus dense bf16 K/V for SDPA; ours runs under `config`."""

    def __init__(
        self, batch, seq, k_bits, v_bits, k_codebook="lloyd", v_codebook="lloyd", dense=True, config=None,
        head_dim=D,
    ):  # fmt: skip
        self.head_dim = head_dim
        self.kc = TurboQuantCodec(head_dim, k_bits, seed=1, codebook=k_codebook)
        self.vc = TurboQuantCodec(head_dim, v_bits, seed=2, codebook=v_codebook)
        nb = batch * seq // BS
        dev = "cuda"
        self.query = torch.randn(batch, HQ, head_dim, device=dev, dtype=torch.bfloat16)
        self.kp = torch.randint(0, 256, (nb, BS, H, self.kc.packed_dim), device=dev, dtype=torch.uint8)
        self.vp = torch.randint(0, 256, (nb, BS, H, self.vc.packed_dim), device=dev, dtype=torch.uint8)
        self.kn = torch.rand(nb, BS, H, device=dev) * 4 + 8
        self.vn = torch.rand(nb, BS, H, device=dev) * 4 + 8
        self.tables = torch.randperm(nb, device=dev, dtype=torch.int32).view(batch, seq // BS)
        self.lens = torch.full((batch,), seq, device=dev, dtype=torch.int32)
        self.tq_bytes = nb * BS * H * (self.kc.packed_dim + self.vc.packed_dim + 8) + self.tables.numel() * 4
        self.use(DecodeLaunchConfig() if config is None else config)
        self.out = torch.empty_like(self.query)
        if dense:
            self.k = torch.randn(batch, H, seq, head_dim, device=dev, dtype=torch.bfloat16)
            self.v = torch.randn(batch, H, seq, head_dim, device=dev, dtype=torch.bfloat16)
            self.q4 = self.query.unsqueeze(2)

    def use(self, config: DecodeLaunchConfig) -> None:
        """Run ours under `config` from now on, with a workspace allocated for it."""
        self.config = config
        self.ws = DecodeWorkspace.allocate(self.query, self.tables, BS, H, config=config)

    def ours(self):
        args = (self.kp, self.kn, self.vp, self.vn, self.tables, self.lens, self.kc, self.vc)
        return tq_decode_attention(self.query, *args, workspace=self.ws, out=self.out, config=self.config)

    def sdpa(self):
        return F.scaled_dot_product_attention(self.q4, self.k, self.v, enable_gqa=True)

    def dequantized_dense(self):
        """The TQ cache as dense bf16 [B, H, S, head_dim] (for a correctness check against SDPA)."""
        ids = self.tables.reshape(-1)
        parts = []
        for packed, norms, c in ((self.kp, self.kn, self.kc), (self.vp, self.vn, self.vc)):
            out = torch.empty(ids.numel(), BS, H, self.head_dim, device="cuda", dtype=torch.float32)
            tq_dequantize_blocks(packed, norms, ids, c, out)
            b = self.tables.shape[0]
            parts.append(out.view(b, -1, H, self.head_dim).transpose(1, 2).contiguous())
        return parts


def time_sdpa(case: Case) -> dict[str, float]:
    times = {}
    for name, backend in SDPA_BACKENDS.items():
        try:
            with sdpa_kernel(backend):
                case.sdpa()
                times[name] = bench_us(case.sdpa)
                times[name + "_graph"] = bench_us(graphed(case.sdpa))
        except RuntimeError as err:
            print(f"  sdpa {name}: unavailable ({str(err).splitlines()[0][:80]})")
    return times


def check(case: Case) -> float:
    """‖ours − SDPA(float32 over the dequantized cache)‖ / ‖·‖ on one shape (bf16 query)."""
    k, v = case.dequantized_dense()
    ref = F.scaled_dot_product_attention(case.q4.float(), k, v, enable_gqa=True).squeeze(2)
    got = case.ours().float()
    return float((got - ref).norm() / ref.norm())


def time_with(case: Case, config: DecodeLaunchConfig) -> tuple[float, float]:
    """(eager, graph) µs of ours under another launch configuration (the case's own restored afterwards)."""
    own = case.config
    case.use(config)
    try:
        return bench_us(case.ours), bench_us(graphed(case.ours))
    finally:
        case.use(own)


def run_preset(
    name: str, copy_gbs: float, results: list[dict], config: DecodeLaunchConfig,
    before: DecodeLaunchConfig | None = None,
) -> None:  # fmt: skip
    k_bits, v_bits, k_codebook, v_codebook = PRESETS[name]
    print(f"\n{name}: K{k_bits}V{v_bits}, {k_codebook} keys, {v_codebook} values")
    for batch, seq in SHAPES:
        case = Case(batch, seq, k_bits, v_bits, k_codebook, v_codebook, config=config)
        if (batch, seq) == (16, 4096):
            print(f"  check vs f32 SDPA over the dequantized cache: rel err {check(case):.2e}")
        row = {"preset": name, "B": batch, "S": seq, "floor_us": case.tq_bytes / copy_gbs / 1e3}
        row["ours_us"] = bench_us(case.ours)
        row["ours_graph_us"] = bench_us(graphed(case.ours))
        if before is not None:
            row["before_us"], row["before_graph_us"] = time_with(case, before)
        row.update({f"sdpa_{k}_us": t for k, t in time_sdpa(case).items()})
        results.append(row)
        print("  " + json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}))
        del case
        torch.cuda.empty_cache()


SWEEP_WIDTHS = [(8, 4)]  # what --sweep times besides K4V4, at every shape (--sweep-widths)
SWEEP_VARIANTS = [  # launch shapes of the Gluon kernel
    {},
    {"lut_tma": False},  # staging by cp.async
    {"lut_warps": 4, "lut_tile": 32, "lut_maxnreg": 168, "lut_tma": False},  # the default before TMA
    {"lut_min_wave_fill": 1.0},
    {"lut_warps": 4, "lut_tile": 32, "lut_maxnreg": 168},
    {"lut_warps": 16, "lut_tile": 16, "lut_maxnreg": 128},
    {"lut_warps": 4, "lut_tile": 64, "lut_maxnreg": None},
    {"lut_warps": 8, "lut_tile": 32, "lut_maxnreg": 128},
    {"lut_warps": 8, "lut_tile": 32, "lut_maxnreg": None, "lut_programs_per_sm": 1},
]


def sweep_configs(base: DecodeLaunchConfig, variants: list[dict] | None = None) -> list[dict]:
    """The configurations --sweep times, as changes to `base`: BEFORE, then each of `variants` applied to
    `base` (default: the launch shapes in SWEEP_VARIANTS, the first of which, {}, is `base` itself)."""
    variants = SWEEP_VARIANTS if variants is None else variants
    return [BEFORE] + [{**asdict(base), **change} for change in variants]


def sweep(
    copy_gbs: float, base: DecodeLaunchConfig, adopt: bool, variants: list[dict] | None = None
) -> DecodeLaunchConfig:
    """Launch-configuration sweep (CUDA-graph µs) around `base`; returns the configuration the tables use:
    with `adopt` the best (geometric mean), else `base`."""
    shapes = [(b, s, 4, 4) for b, s in SHAPES] + [
        (b, s, *widths) for widths in SWEEP_WIDTHS for b, s in SHAPES
    ]
    configs = [(changes, replace(base, **changes)) for changes in sweep_configs(base, variants)]  # all valid
    cases = {s: Case(*s, dense=False) for s in shapes}
    best, best_score = (asdict(base), base), math.inf
    print("\nsweep (graph µs):", "  ".join(f"K{k}V{v} {b}x{s // 1024}K" for b, s, k, v in shapes))
    for changes, config in configs:
        times = []
        for case in cases.values():
            case.use(config)
            try:
                times.append(bench_us(graphed(case.ours), rep_ms=50))
            except Exception as err:  # a config that does not compile or fit
                times.append(math.inf)
                print("   ", type(err).__name__, str(err)[:100])
        if math.prod(times) < best_score:
            best, best_score = (changes, config), math.prod(times)
        report = compiled_report(decode_module.LAST_COMPILED.get("split"))
        print(f"  {changes}: {' '.join(f'{t:8.1f}' for t in times)}  {report}", flush=True)
    chosen = best[1] if adopt else base
    print(f"  best (geometric mean): {best[0]}; tables use {asdict(chosen)}")
    floors = [c.tq_bytes / copy_gbs / 1e3 for c in cases.values()]
    print("  floor:", " ".join(f"{f:8.1f}" for f in floors))
    return chosen


def breakdown(config: DecodeLaunchConfig, shapes=((1, 4096), (1, 32768), (16, 32768))) -> None:
    """Per-kernel CUDA time of one decode call (torch.profiler), K4V4 at `shapes` (--shapes, else (1, 4K),
    (1, 32K) and (16, 32K))."""
    from torch.profiler import ProfilerActivity, profile

    for shape in shapes:
        case = Case(*shape, 4, 4, dense=False, config=config)
        case.ours()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                case.ours()
            torch.cuda.synchronize()
        print(f"\nbreakdown {shape} (20 calls):")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=6, max_name_column_width=40))


def width_grid(
    config: DecodeLaunchConfig, head_dim: int = D, pairs: list[tuple[int, int]] | None = None
) -> None:  # fmt: skip
    """Graph µs of K{1..8}V4, K4V{1..8} and the mixed pairs of WIDTH_MIXED (or `pairs` and K4V4) at
    WIDTH_SHAPES and `head_dim`, per byte read against K4V4's (last table)."""
    from tiercache.kernels import decode_lut

    grid = {(k, 4) for k in range(1, 9)} | {(4, v) for v in range(1, 9)} | set(WIDTH_MIXED)
    pairs = sorted(grid if pairs is None else {(4, 4), *pairs})
    rows = []
    for k_bits, v_bits in pairs:
        for batch, seq in WIDTH_SHAPES:
            case = Case(batch, seq, k_bits, v_bits, dense=False, config=config, head_dim=head_dim)
            group = HQ // H
            gluon = decode_lut.lut_mode_of(case.query, case.kp, case.vp, case.kc, case.vc, group, BS, config)
            rows.append((k_bits, v_bits, batch, seq, bench_us(graphed(case.ours)), case.tq_bytes,
                         "Gluon" if gluon else "Triton"))  # fmt: skip
            print("  " + json.dumps(rows[-1]), flush=True)
            del case
            torch.cuda.empty_cache()
    per_byte = {(b, s): us / n for k, v, b, s, us, n, _ in rows if (k, v) == (4, 4)}
    print(
        f"\n# every width at head_dim {head_dim}: graph µs, time per byte read against K4V4's (≤ 1.3: target)"
    )
    print("K | V | B × S | kernel | graph µs | MB read | µs per MB | per byte × K4V4")
    for k, v, b, s, us, n, kernel in rows:
        ratio = us / n / per_byte[(b, s)]
        print(f"{k} | {v} | {b} × {s // 1024}K | {kernel} | {us:.1f} | {n / 1e6:.1f} | {us / n * 1e6:.2f} | "
              f"{ratio:.2f}")  # fmt: skip


def print_tables(results: list[dict], copy_gbs: float) -> None:
    print(f"\n# decode attention, {describe_device()}, commit {git_commit()}, copy {copy_gbs:.0f} GB/s")
    print("# times µs (eager / CUDA graph); speedup = best SDPA / ours; floor frac = floor / ours (graph)")
    for preset in PRESETS:
        rows = [r for r in results if r["preset"] == preset]
        if not rows:
            continue
        print(
            f"\n{preset.upper()}  | B  | S    | ours eager | ours graph | SDPA best eager | SDPA best graph"
            " | speedup eager | speedup graph | floor  | floor/ours | before graph | before/ours"
        )
        for r in rows:
            eager = min((r.get(f"sdpa_{k}_us", math.inf) for k in SDPA_BACKENDS), default=math.inf)
            graph = min((r.get(f"sdpa_{k}_graph_us", math.inf) for k in SDPA_BACKENDS), default=math.inf)
            print(f"{'':6}| {r['B']:<2} | {r['S'] // 1024:>3}K |"
                  f" {r['ours_us']:10.1f} | {r['ours_graph_us']:10.1f} |"
                  f" {eager:15.1f} | {graph:15.1f} | {eager / r['ours_us']:13.2f} |"
                  f" {graph / r['ours_graph_us']:13.2f} | {r['floor_us']:6.1f} |"
                  f" {r['floor_us'] / r['ours_graph_us']:10.2f} |"
                  f" {r.get('before_graph_us', math.nan):12.1f} |"
                  f" {r.get('before_graph_us', math.nan) / r['ours_graph_us']:11.2f}")  # fmt: skip


def width_pairs(text: str) -> list[tuple[int, int]]:
    """KxV pairs from the command line: "8x4,5x3" → [(8, 4), (5, 3)]."""
    return [tuple(int(n) for n in pair.split("x")) for pair in text.split(",")]


def config_changes(changes: dict) -> dict:
    """DecodeLaunchConfig fields parsed from JSON, its lists as the config's tuples (lut_head_dims)."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in changes.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="k4v4,k8v4,k8v4u")
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--adopt-best", action="store_true", help="run the tables with the sweep's best")
    parser.add_argument("--variants", default=None, help="JSON list of changes for --sweep to time")
    parser.add_argument("--json", default=None)
    parser.add_argument("--breakdown", action="store_true")
    parser.add_argument("--widths", action="store_true", help="every key and value width against K4V4 (last)")
    parser.add_argument(
        "--before", nargs="?", const=json.dumps(BEFORE), default=None,
        help=f"also time this JSON launch configuration (default {BEFORE}: the Triton kernel)",
    )  # fmt: skip
    parser.add_argument("--head-dim", type=int, default=D, help="the head_dim of --widths (64 or 128)")
    parser.add_argument("--width-pairs", default=None, help="KxV pairs --widths times (and K4V4): 2x2,1x1")
    parser.add_argument("--config", default=None, help="JSON launch configuration to apply first")
    parser.add_argument("--profile", default=None, help="PRESET,B,S: 5 calls and exit (run under ncu)")
    parser.add_argument("--shapes", default=None, help="B×S shapes of the tables and --sweep: 256x1024,…")
    parser.add_argument("--sweep-widths", default=None, help="KxV pairs --sweep times besides K4V4: 8x4,5x3")
    args = parser.parse_args()
    if args.shapes:
        SHAPES[:] = [tuple(int(n) for n in shape.split("x")) for shape in args.shapes.split(",")]
    if args.sweep_widths:
        SWEEP_WIDTHS[:] = width_pairs(args.sweep_widths)
    torch.manual_seed(0)
    config = replace(DecodeLaunchConfig(), **config_changes(json.loads(args.config or "{}")))
    if args.profile:
        preset, batch, seq = args.profile.split(",")
        case = Case(int(batch), int(seq), *PRESETS[preset], dense=False, config=config)
        for _ in range(5):
            case.ours()
        torch.cuda.synchronize()
        return
    copy_gbs = copy_bandwidth_gbs()
    print(f"{describe_device()}; copy bandwidth {copy_gbs:.0f} GB/s; config {asdict(config)}")
    if args.sweep:
        variants = [config_changes(v) for v in json.loads(args.variants)] if args.variants else None
        config = sweep(copy_gbs, config, args.adopt_best, variants)
    if args.breakdown:
        breakdown(config, *([SHAPES] if args.shapes else []))
    before = replace(config, **config_changes(json.loads(args.before))) if args.before else None
    results: list[dict] = []
    for preset in filter(None, args.presets.split(",")):
        run_preset(preset, copy_gbs, results, config, before)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"copy_gbs": copy_gbs, "config": asdict(config), "results": results}, f, indent=1)
    print_tables(results, copy_gbs)
    if args.widths:
        width_grid(config, args.head_dim, width_pairs(args.width_pairs) if args.width_pairs else None)


if __name__ == "__main__":
    main()
