"""`tiercache plan`: bytes per token and tokens per tier for bf16, fp8 and the TurboQuant presets.

Provides:
    ModelGeometry(num_layers, num_kv_heads, head_dim)      from a Hugging Face config.json (dict)
    model_geometry(config) / load_model_config(path_or_json)
    PlanRow(name, bytes_per_token, tokens_vram, tokens_dram, configured, quality, decode)
    MEASURED_DPPL                     preset → ΔPPL measured through vLLM (the plan's quality column)
    plan_rows(geometry, vram_bytes, dram_bytes, codec=None) -> list[PlanRow]
    memory_warnings(tiers, bytes_per_token, host_bytes, gpu_bytes, ranks=1) -> list[str]
                                      a tier larger than the memory it lives in, with both numbers, and a
                                      tier too small to hold one block (BLOCK_TOKENS)
    tier_size_lines(tiers, bytes_per_token, ranks=1) -> list[str]
                                      each tier per rank and over all ranks, in bytes and tokens
    add_arguments(parser), run(args) -> int                  the CLI subcommand

Bytes per token (per rank, all layers, K and V):
    bf16 / fp8:  layers × kv_heads × head_dim × 2 × (2 or 1)
    TQ K{k}V{v}: layers × kv_heads × [(head_dim·k/8 + 4) + (head_dim·v/8 + 4)]   (packed indices + f32 norm)
Tokens per tier = floor(tier bytes / bytes per token), before rounding down to whole blocks.
Beside them: each format's measured ΔPPL (MEASURED_DPPL) and which kernel decodes it in primary mode on a GPU
(the Gluon kernel at head_dim 128 and 64: every width 1–8 on Hopper and later, at 64 odd widths where KV
heads × bits is even; K4V4, K8V4, K4V8 and K8V8 before Hopper; the generic Triton kernel otherwise,
measured 2–35× slower per byte: decode_lut.lut_takes_pages).
Tier sizes (tiers.vram, tiers.dram) are per rank. Under tensor parallelism every rank holds its KV heads'
share of the same tokens: a tier holds as many tokens as one rank's tier does, and its bytes over all ranks
are the rank's × the rank count.
The tiers are checked against this machine's memory (or --host-memory / --gpu-memory, to plan for another
one): a warning with both numbers where the engine would refuse to start, or where the ranks together would
not fit in host memory.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

COMMON_PRESETS = ("balanced", "capacity", "k8v4", "tq4", "k3v4", "k8v8")
# SmolLM2-135M-Instruct through vLLM 0.26 on an H200: 160 windows of 1,024 tokens, prefill in chunks of 128
# (each window read back from the cache), ΔPPL against vLLM's bf16 cache in the same run
# (benchmarks/quality_backend.py, benchmarks/RESULTS.md 2026-11-28). Formats not in that run show "—".
MEASURED_DPPL = {"bf16": "0", "fp8": "+1.61 %", "balanced": "+1.18 %", "capacity": "+4.86 %"}


@dataclass(frozen=True)
class ModelGeometry:
    num_layers: int
    num_kv_heads: int
    head_dim: int

    def per_rank(self, tensor_parallel: int) -> ModelGeometry:
        """KV heads split over the ranks, or each replicated on tensor_parallel / num_kv_heads ranks (vLLM
        requires one to divide the other)."""
        heads, tp = self.num_kv_heads, tensor_parallel
        if tp < 1 or (heads % tp and tp % heads):
            raise ValueError(
                f"--tensor-parallel {tp}: vLLM splits the model's {heads} KV heads over the ranks, or "
                f"replicates them: use a divisor or a multiple of {heads}"
            )
        return ModelGeometry(self.num_layers, max(1, heads // tp), self.head_dim)


@dataclass(frozen=True)
class PlanRow:
    name: str
    bytes_per_token: int
    tokens_vram: int | None
    tokens_dram: int | None
    configured: bool = False
    quality: str = "—"  # measured ΔPPL (MEASURED_DPPL)
    decode: str = "—"  # the kernel that decodes it in primary mode on a GPU


def load_model_config(source: str) -> dict[str, Any]:
    """A config.json path, a model directory holding one, or the JSON text itself."""
    if source.lstrip().startswith("{"):
        return json.loads(source)
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ValueError(f"--model: {source!r} is not a config.json, a directory holding one, or JSON text")
    return json.loads(path.read_text())


def model_geometry(config: dict[str, Any]) -> ModelGeometry:
    config = config.get("text_config", config) if "num_hidden_layers" not in config else config
    missing = [k for k in ("num_hidden_layers", "num_attention_heads") if k not in config]
    if missing:
        raise ValueError(f"model config lacks {', '.join(missing)}: is this a Hugging Face config.json?")
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = config.get("head_dim")
    if not head_dim:
        if "hidden_size" not in config:
            raise ValueError("model config has neither head_dim nor hidden_size")
        head_dim = int(config["hidden_size"]) // heads
    return ModelGeometry(int(config["num_hidden_layers"]), kv_heads, int(head_dim))


def plan_rows(
    geometry: ModelGeometry, vram_bytes: int | None, dram_bytes: int | None, codec=None
) -> list[PlanRow]:
    from tiercache.codecs import KVCodecSpec
    from tiercache.kernels import DecodeLaunchConfig
    from tiercache.kernels.decode_lut import NATIVE_WIDTHS, lut_takes_pages

    L, H, d = geometry.num_layers, geometry.num_kv_heads, geometry.head_dim

    def tokens(total: int | None, per: int) -> int | None:
        return None if total is None else total // per

    def row(name: str, per: int, configured: bool, measured: str, decode: str) -> PlanRow:
        held = tokens(vram_bytes, per), tokens(dram_bytes, per)
        return PlanRow(name, per, *held, configured, MEASURED_DPPL.get(measured, "—"), decode)

    bf16_name = "bf16 (none: lossless)" if codec is not None and codec.lossless else "bf16"
    rows = [row(bf16_name, L * H * d * 2 * 2, bf16_name != "bf16", "bf16", "vLLM FlashAttention"),
            row("fp8", L * H * d * 2, False, "fp8", "vLLM FlashAttention 3")]  # fmt: skip
    specs = [KVCodecSpec.from_preset(p) for p in COMMON_PRESETS]
    if codec is not None and not codec.lossless and codec not in specs:
        specs.append(codec)
    for spec in specs:
        label = f"TQ K{spec.key_bits}V{spec.value_bits} ({spec.name})"
        widths = (spec.key_bits, spec.value_bits)
        if not lut_takes_pages(*widths, d, H, DecodeLaunchConfig()):
            decode = "Triton, 2-35x slower/byte"
        else:
            decode = "Gluon (fast)" if widths in NATIVE_WIDTHS else "Gluon on sm_90+ (fast)"
        rows.append(row(label, spec.bytes_per_token(L, H, d), codec is not None and spec == codec, spec.name,
                        decode))  # fmt: skip
    return rows


BLOCK_TOKENS = 16  # vLLM's default block size on GPUs (its CPU backend's is 32): the least a tier must hold


def memory_warnings(
    tiers, bytes_per_token: int, host_bytes: int | None, gpu_bytes: int | None, ranks: int = 1
) -> list[str]:
    """Warnings for tiers (a TiersConfig, sizes per rank) larger than the memory they live in: tiers.vram
    against one GPU's memory, tiers.dram × ranks against the host's. None: not known, not checked."""
    from tiercache.units import format_bytes

    def both(n: int) -> str:
        return f"{format_bytes(n)} ({n:,} bytes)"

    def asked(size, n: int) -> str:
        return both(n) if size.tokens is None else f"{size} = {both(n)} with the configured codec"

    out = []
    vram, dram = tiers.vram.to_bytes(bytes_per_token), tiers.dram.to_bytes(bytes_per_token)
    for name, nbytes in (("vram", vram), ("dram", dram)):
        if 0 < nbytes < BLOCK_TOKENS * bytes_per_token:
            out.append(
                f"tiers.{name} = {both(nbytes)} holds {nbytes // bytes_per_token} tokens, not one block of "
                f"{BLOCK_TOKENS} ({both(BLOCK_TOKENS * bytes_per_token)} with the configured codec); the "
                f'engine refuses to start with it: give tiers.{name} a size such as 4GiB or "2M tokens"'
            )
    if gpu_bytes is not None and vram > gpu_bytes:
        out.append(
            f"tiers.vram = {asked(tiers.vram, vram)} per GPU is more than the GPU's {both(gpu_bytes)}; the "
            "engine refuses to start with it: lower tiers.vram"
        )
    if host_bytes is not None and dram * ranks > host_bytes:
        total = "" if ranks == 1 else f" per rank, × {ranks} ranks = {both(dram * ranks)},"
        then = "the engine refuses to start with it" if dram > host_bytes else "the ranks together do not fit"
        out.append(
            f"tiers.dram = {asked(tiers.dram, dram)}{total} is more than the {both(host_bytes)} of host "
            f"memory; {then}: lower tiers.dram"
        )
    return out


def tier_size_lines(tiers, bytes_per_token: int, ranks: int = 1) -> list[str]:
    """'tiers.vram = 4.00 GiB per rank: 123,361 tokens; over 2 ranks: 8.00 GiB, the same 123,361 tokens'
    ('tiers.vram = 100,000 tokens: 4.77 GiB per rank; …' for a size in tokens), for a TiersConfig (sizes
    per rank) and one rank's bytes per token with the configured codec."""
    from tiercache.units import format_bytes

    out = []
    for name, size in (("vram", tiers.vram), ("dram", tiers.dram)):
        nbytes = size.to_bytes(bytes_per_token)
        if nbytes == 0:
            out.append(f"tiers.{name} = 0: the tier is off")
            continue
        tokens = size.tokens if size.tokens is not None else nbytes // bytes_per_token
        if size.tokens is not None:
            line = f"tiers.{name} = {size}: {format_bytes(nbytes)} per rank"
        else:
            line = f"tiers.{name} = {size} per rank: {tokens:,} tokens"
        if ranks > 1:
            line += f"; over {ranks} ranks: {format_bytes(nbytes * ranks)}, the same {tokens:,} tokens"
        out.append(line + " (with the configured codec)")
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="config.json, a model directory, or JSON text")
    parser.add_argument("--config", help="tiers.yaml (default: $TIERCACHE_CONFIG, else built-in defaults)")
    parser.add_argument(
        "--tensor-parallel",
        "--tp",
        type=int,
        default=1,
        help="ranks sharing the KV heads (tier sizes are per rank; totals are printed)",
    )
    parser.add_argument(
        "--host-memory",
        metavar="SIZE",
        help="host memory to check tiers.dram against (default: this machine's)",
    )
    parser.add_argument(
        "--gpu-memory",
        metavar="SIZE",
        help="one GPU's memory, to check tiers.vram against (default: this GPU's)",
    )


def run(args: argparse.Namespace) -> int:
    from tiercache.config import TierCacheConfig, device_memory_bytes, host_memory_bytes
    from tiercache.errors import ConfigError

    try:
        geometry = model_geometry(load_model_config(args.model)).per_rank(args.tensor_parallel)
        config = TierCacheConfig.load(args.config)
        host = _bytes_arg("--host-memory", args.host_memory) or host_memory_bytes()
        gpu = _bytes_arg("--gpu-memory", args.gpu_memory) or device_memory_bytes()
    except (ValueError, ConfigError, json.JSONDecodeError) as exc:
        print(f"tiercache plan: {exc}", file=sys.stderr)
        return 2
    tiers = config.tiers
    rows = plan_rows(geometry, tiers.vram.bytes, tiers.dram.bytes, config.codec)
    per_token = next(r for r in rows if r.configured or r is rows[-1]).bytes_per_token
    source = "built-in defaults" if config.source == "<defaults>" else config.source
    print(
        f"model: {geometry.num_layers} layers, {geometry.num_kv_heads} KV heads per rank "
        f"(tensor parallel {args.tensor_parallel}), head_dim {geometry.head_dim}"
    )
    print(f"tiers per rank: vram {tiers.vram}, dram {tiers.dram}  ({source}); * = configured codec")
    if args.tensor_parallel > 1:
        tp = args.tensor_parallel
        print(f"bytes are per rank; each of the {tp} ranks holds its KV heads' share of the same tokens")
    bf16 = rows[0].bytes_per_token
    print(f"{'format':<24} {'bytes/token':>12} {'vs bf16':>8} {'tokens in VRAM':>15} {'tokens in DRAM':>15}"
          f"  {'ΔPPL':>8}  decode (primary mode, GPU)")  # fmt: skip
    for row in rows:
        print(
            f"{row.name + (' *' if row.configured else ''):<24} {row.bytes_per_token:>12,} "
            f"{bf16 / row.bytes_per_token:>7.2f}x {_tokens(row.tokens_vram, tiers.vram, row):>15} "
            f"{_tokens(row.tokens_dram, tiers.dram, row):>15}  {row.quality:>8}  {row.decode}"
        )
    print("ΔPPL: SmolLM2-135M through vLLM on an H200, each window read back from the cache, against bf16 "
          "(benchmarks/RESULTS.md)")  # fmt: skip
    for line in tier_size_lines(tiers, per_token, args.tensor_parallel):
        print(line)
    if tiers.disk is not None:
        disk = tiers.disk.size
        tokens = disk.tokens if disk.tokens is not None else int(disk.bytes // per_token)
        print(f"tiers.disk per rank: {disk} at {tiers.disk.path}: ~{tokens:,} tokens of the configured codec "
              "(a segment-file slot per block: a 256-byte header, 4 KiB-aligned; a 128-byte index "
              "record)")  # fmt: skip
    for warning in memory_warnings(tiers, per_token, host, gpu, args.tensor_parallel):
        print(f"tiercache plan: warning: {warning}", file=sys.stderr)
    if gpu is None:
        print("tiers.vram not checked against GPU memory: no GPU here (--gpu-memory SIZE checks it)")
    return 0


def _bytes_arg(flag: str, value: str | None) -> int | None:
    from tiercache.units import parse_bytes

    try:
        return parse_bytes(value) if value else None
    except ValueError as exc:
        raise ValueError(f"{flag}: {exc}") from None


def _tokens(count: int | None, size, row: PlanRow) -> str:
    return f"{count:,}" if count is not None else f"({size.tokens:,})"
