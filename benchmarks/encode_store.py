"""Encode+store and block dequantize throughput: 64K tokens × 8 heads × head_dim 128.

Usage:  python benchmarks/encode_store.py [--bits k4v4,k8v4]
encode_store: bf16 K and V into random slots; figure = bf16 input bytes (K + V) / time.
dequantize: all 4096 blocks of one cache (K) into bf16 (and float32); figure = output bytes / time.
Prints a short table last.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import asdict, replace

import torch
from _timing import bench_us, compiled_report, copy_bandwidth_gbs, describe_device, git_commit

from tiercache.kernels import (
    DequantizeLaunchConfig,
    EncodeLaunchConfig,
    TurboQuantCodec,
    tq_dequantize_blocks,
    tq_encode_store,
)
from tiercache.kernels import dequantize as dequantize_module
from tiercache.kernels import encode_store as encode_module

TOKENS, H, D, BS = 65536, 8, 128, 16
PRESETS = {"k4v4": (4, 4), "k8v4": (8, 4)}


def run(k_bits: int, v_bits: int, encode: EncodeLaunchConfig, dequantize: DequantizeLaunchConfig) -> dict:
    kc, vc = TurboQuantCodec(D, k_bits, seed=1), TurboQuantCodec(D, v_bits, seed=2)
    nb = TOKENS // BS
    key = torch.randn(TOKENS, H, D, device="cuda", dtype=torch.bfloat16)
    value = torch.randn(TOKENS, H, D, device="cuda", dtype=torch.bfloat16)
    slots = torch.randperm(TOKENS, device="cuda")
    kp = torch.empty(nb, BS, H, kc.packed_dim, device="cuda", dtype=torch.uint8)
    vp = torch.empty(nb, BS, H, vc.packed_dim, device="cuda", dtype=torch.uint8)
    kn, vn = torch.empty(nb, BS, H, device="cuda"), torch.empty(nb, BS, H, device="cuda")
    enc_us = bench_us(lambda: tq_encode_store(key, value, slots, kp, kn, vp, vn, kc, vc, config=encode))
    want_packed, _ = kc.encode(key[:4096])
    mismatch = (kp.view(-1, H, kc.packed_dim)[slots[:4096]] != want_packed).any(-1).float().mean().item()
    ids = torch.randperm(nb, device="cuda", dtype=torch.int32)
    row = {
        "encode_us": enc_us,
        "encode_tbs": 2 * key.numel() * 2 / enc_us / 1e6,
        "encode_row_mismatch": mismatch,
    }
    for dtype, tag in ((torch.bfloat16, "bf16"), (torch.float32, "f32")):
        out = torch.empty(nb, BS, H, D, device="cuda", dtype=dtype)
        us = bench_us(lambda out=out: tq_dequantize_blocks(kp, kn, ids, kc, out, config=dequantize))
        row[f"deq_{tag}_us"] = us
        row[f"deq_{tag}_tbs"] = out.numel() * out.element_size() / us / 1e6
    return row


def sweep(adopt: bool) -> tuple[EncodeLaunchConfig, DequantizeLaunchConfig]:
    """Launch-configuration sweep, K4V4 encode and bf16 dequantize (µs); returns the configurations the
    table uses: with `adopt` the best of each, else the defaults."""
    kc = TurboQuantCodec(D, 4, seed=1)
    nb = TOKENS // BS
    key = torch.randn(TOKENS, H, D, device="cuda", dtype=torch.bfloat16)
    slots = torch.randperm(TOKENS, device="cuda")
    kp = torch.empty(nb, BS, H, kc.packed_dim, device="cuda", dtype=torch.uint8)
    kn = torch.empty(nb, BS, H, device="cuda")
    ids = torch.randperm(nb, device="cuda", dtype=torch.int32)
    out = torch.empty(nb, BS, H, D, device="cuda", dtype=torch.bfloat16)
    chosen = []
    for base, module, name, knobs, fn in (
        (EncodeLaunchConfig(), encode_module, "encode", ("block_tokens", (32, 64)),
         lambda config: tq_encode_store(key, key, slots, kp, kn, kp, kn, kc, kc, config=config)),
        (DequantizeLaunchConfig(), dequantize_module, "dequantize", ("rows", (64, 128)),
         lambda config: tq_dequantize_blocks(kp, kn, ids, kc, out, config=config)),
    ):  # fmt: skip
        best, best_config = (math.inf, None), None
        for size in knobs[1]:
            for warps in (4, 8):
                for stages in (1, 3):
                    for pps in (2, 4):
                        changes = {
                            knobs[0]: size,
                            "num_warps": warps,
                            "num_stages": stages,
                            "programs_per_sm": pps,
                        }
                        config = replace(base, **changes)
                        try:
                            us = bench_us(lambda fn=fn, config=config: fn(config), rep_ms=50)
                        except Exception as err:  # a config that does not compile or fit
                            print(f"  {name} {changes}: fail {type(err).__name__} {str(err)[:80]}")
                            continue
                        if us < best[0]:
                            best, best_config = (us, asdict(config)), config
                        report = compiled_report(module.LAST_COMPILED.get(name))
                        print(f"  {name} {asdict(config)}: {us:8.1f}  {report}")
        chosen.append(best_config if adopt and best_config else base)
        print(f"  {name}: best {best}; tables use {asdict(chosen[-1])}")
    return chosen[0], chosen[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bits", default="k4v4,k8v4")
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--adopt-best", action="store_true", help="run the table with the sweep's best")
    args = parser.parse_args()
    torch.manual_seed(0)
    configs = sweep(args.adopt_best) if args.sweep else (EncodeLaunchConfig(), DequantizeLaunchConfig())
    copy = copy_bandwidth_gbs()
    rows = {name: run(*PRESETS[name], *configs) for name in args.bits.split(",")}
    print(f"\n# encode_store / dequantize, {describe_device()}, commit {git_commit()}, copy {copy:.0f} GB/s")
    print(
        "preset | encode µs | encode TB/s (bf16 in) | deq bf16 µs | deq bf16 TB/s out"
        " | deq f32 µs | deq f32 TB/s out"
    )
    for name, r in rows.items():
        print(f"{name:6} | {r['encode_us']:9.1f} | {r['encode_tbs']:21.2f} | {r['deq_bf16_us']:11.1f} |"
              f" {r['deq_bf16_tbs']:17.2f} | {r['deq_f32_us']:10.1f} | {r['deq_f32_tbs']:16.2f}")  # fmt: skip
        print(f"       (rows differing from codec.encode: {r['encode_row_mismatch']:.1e})")


if __name__ == "__main__":
    main()
