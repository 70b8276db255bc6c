"""`tiercache codec-report`: what TurboQuant does to vectors of one head_dim, per codebook and bit width.

For each codebook (--codebook lloyd uniform; default lloyd) and width: MSE on random unit vectors, the MSE
the density predicts (codec.expected_mse), its ratio to the paper's lower bound 1/4^b, mean cosine
similarity, relative inner-product error ‖⟨q, x̂⟩ − ⟨q, x⟩‖₂ / ‖⟨q, x⟩‖₂ over independent random unit q,
bytes per vector (packed indices + a float32 norm), compression against bf16, and CPU encode / decode
throughput on one batch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class CodecRow:
    codebook: str
    bits: int
    mse: float
    expected_mse: float
    mse_over_lower_bound: float
    cosine: float
    inner_product_rel_error: float
    bytes_per_vector: int
    compression_vs_bf16: float
    encode_mvec_per_s: float
    decode_mvec_per_s: float


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--head-dim", type=int, default=128, help="vector size (default 128)")
    parser.add_argument("--bits", type=int, nargs="+", default=list(range(1, 9)), help="widths (default 1-8)")
    parser.add_argument("--vectors", type=int, default=10_000, help="random unit vectors (default 10000)")
    parser.add_argument("--rotation", default="haar", choices=("haar", "hadamard"))
    parser.add_argument("--seed", type=int, default=0, help="codec seed (default 0)")
    parser.add_argument(
        "--codebook",
        nargs="+",
        default=["lloyd"],
        choices=("lloyd", "uniform"),
        help="codebooks to report: lloyd (Lloyd-Max), uniform (affine); both allowed (default lloyd)",
    )
    parser.add_argument("--repeats", type=int, default=10, help="timing repeats, median taken (default 10)")
    parser.add_argument("--json", action="store_true", help="print JSON rows instead of a table")


def measure(
    head_dim: int, bits: int, vectors: int, rotation: str, seed: int, repeats: int, codebook: str = "lloyd"
) -> CodecRow:
    import torch

    from tiercache.kernels import TurboQuantCodec

    codec = TurboQuantCodec(head_dim=head_dim, bits=bits, seed=seed, rotation=rotation, codebook=codebook)
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(vectors, head_dim, generator=gen, dtype=torch.float64)
    x /= x.norm(dim=-1, keepdim=True)
    q = torch.randn(vectors, head_dim, generator=gen, dtype=torch.float64)
    q /= q.norm(dim=-1, keepdim=True)
    x32 = x.float()
    packed, norms = codec.encode(x32)
    x_hat = codec.decode(packed, norms).double()
    mse = float(((x_hat - x) ** 2).sum(-1).mean())
    cosine = float(torch.nn.functional.cosine_similarity(x_hat, x, dim=-1).mean())
    exact_ip = (q * x).sum(-1)
    ip_error = float((q * x_hat).sum(-1).sub(exact_ip).norm() / exact_ip.norm())
    encode_s = _median_seconds(lambda: codec.encode(x32), repeats)
    decode_s = _median_seconds(lambda: codec.decode(packed, norms), repeats)
    bytes_per_vector = codec.packed_dim + 4
    return CodecRow(
        codebook=codebook,
        bits=bits,
        mse=mse,
        expected_mse=codec.expected_mse,
        mse_over_lower_bound=mse * 4**bits,
        cosine=cosine,
        inner_product_rel_error=ip_error,
        bytes_per_vector=bytes_per_vector,
        compression_vs_bf16=2 * head_dim / bytes_per_vector,
        encode_mvec_per_s=vectors / encode_s / 1e6,
        decode_mvec_per_s=vectors / decode_s / 1e6,
    )


def _median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up: device tables, allocator
    samples = []
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def format_table(head_dim: int, rows: list[CodecRow]) -> str:
    header = (
        f"{'codebook':<8} {'bits':>4} {'MSE':>10} {'density':>10} {'MSE·4^b':>8} {'cosine':>8} {'IP err':>8} "
        f"{'B/vec':>6} {'vs bf16':>8} {'enc Mv/s':>9} {'dec Mv/s':>9}"
    )
    lines = [f"TurboQuant codec report, head_dim={head_dim} (bf16: {2 * head_dim} B/vec)", header]
    for r in rows:
        lines.append(
            f"{r.codebook:<8} {r.bits:>4} {r.mse:>10.3g} {r.expected_mse:>10.3g} "
            f"{r.mse_over_lower_bound:>8.3f} {r.cosine:>8.5f} "
            f"{r.inner_product_rel_error:>8.4f} {r.bytes_per_vector:>6} {r.compression_vs_bf16:>7.2f}× "
            f"{r.encode_mvec_per_s:>9.3f} {r.decode_mvec_per_s:>9.3f}"
        )
    lines.append("density: the MSE the coordinate density predicts (codec.expected_mse).")
    lines.append("MSE·4^b: ratio to the paper's lower bound 1/4^b (its upper bound is √3·π/2 ≈ 2.72).")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    rows = [
        measure(args.head_dim, bits, args.vectors, args.rotation, args.seed, args.repeats, codebook)
        for codebook in dict.fromkeys(args.codebook)
        for bits in args.bits
    ]
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=2))
    else:
        print(format_table(args.head_dim, rows))
    return 0
