"""Offload mode served by real vLLM on a GPU: users with long contexts take turns, vLLM's GPU cache holds
about half of one round, and a host tier holds what it can. Compared in one run: prefix caching alone,
vLLM's native CPU offload (kv_offloading_size, bf16) and tiercache's connector with the same host memory
(and, for the pressure case, the same token capacity).

    python -m benchmarks.serve_offload                       # Llama-3.1-8B shapes, dummy weights
    python -m benchmarks.serve_offload --users 4 --context 2048 --layers 4 --cases fits    # quick check
    python -m benchmarks.serve_offload --tp 2 --cases tight,pressure    # tensor parallelism on two GPUs

A turn: the user's fixed context of `--context` random tokens plus 32 tokens new in this round, then
`--max-tokens` greedy tokens; users go one after another (each request alone), every user once a round.
GPU memory is the same for every engine: tiercache's VRAM tier (`--vram-gib`) is taken from vLLM's KV cache.
Engines run as `vllm serve` does by default (torch.compile and CUDA graphs; each engine compiles at start);
`--eager` runs them eagerly instead (quicker to start, each decode step several times slower, so a turn's
decode steps weigh more against its prefill).
Reported per engine: each round's seconds, the steady rounds' mean (rounds 2 on), the share of prompt tokens
not recomputed in steady rounds (vLLM's num_cached_tokens: GPU prefix hits plus tokens loaded from a tier),
and the steady round time against its baseline: native offload with the same host memory, or (checksums)
the connector with checksums off.

With `--tp N` every size is per rank (GPU KV per GPU, host memory per rank: tiercache's tiers.dram is per
rank, vLLM's kv_offloading_size is the sum over ranks, so native gets N times the per-rank figure).

Cases (host memory per engine and rank; bf16 needs 128 KiB per token at 32 layers, k8v4 50 KiB; each rank
holds 1/N of it):
  fits      both tiers hold every context           (native and tiercache with --fits-gib)
  tight     only tiercache's compressed tier holds all (both with --tight-gib)
  pressure  neither holds all: tiercache with --pressure-gib (graph and lru policies) against native with
            the same token capacity (--pressure-gib × bf16/k8v4 bytes)
  checksums what the piece checksums cost (issue 26): tiercache (graph, --fits-gib) as served, against the
            same connector with checksums off (benchmarks/_unchecked_connector.py; not a product setting)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import _child
from benchmarks.warm_start import LLAMA_8B

K8V4_SHRINK = 2.56  # bf16 bytes / k8v4 bytes per token (head_dim 128, norms included)


def child(args: argparse.Namespace) -> None:
    from vllm import LLM, SamplingParams

    kind, host_gib, policy = args.engine.split(":")
    model = Path(tempfile.mkdtemp()) / "llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({**LLAMA_8B, "num_hidden_layers": args.layers}))
    gpu_kv = args.gpu_kv_gib
    options = {}
    if kind == "native":  # vLLM's size is the sum over the ranks
        options = {"kv_offloading_size": float(host_gib) * args.tp, "kv_offloading_backend": "native"}
    elif kind in ("tiercache", "unchecked"):
        gpu_kv -= args.vram_gib  # the VRAM tier comes out of the same GPU memory
        tiers = {"vram": f"{int(args.vram_gib * 1024)}MiB", "dram": f"{int(float(host_gib) * 1024)}MiB"}
        eviction = {"policy": policy, "advisor_interval": f"{args.advisor_ms}ms"}
        extra = {"codec": args.codec, "tiers": tiers, "eviction": eviction,
                 "inspect": {"socket": "off"}}  # fmt: skip
        options = {"kv_transfer_config": {"kv_connector": "TierCacheConnector", "kv_role": "kv_both",
                                          "kv_connector_extra_config": extra}}  # fmt: skip
        if kind == "unchecked":
            options["kv_transfer_config"].update(
                kv_connector="UncheckedTierCacheConnector",
                kv_connector_module_path="benchmarks._unchecked_connector",
            )
    llm = LLM(
        model=str(model), load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16", seed=0,
        max_model_len=args.context + 32 + args.max_tokens + 16, enable_prefix_caching=True,
        enforce_eager=args.eager, kv_cache_memory_bytes=int(gpu_kv * 2**30), tensor_parallel_size=args.tp,
        **options,
    )  # fmt: skip
    rng = random.Random(7)
    contexts = [[rng.randrange(1000, 100_000) for _ in range(args.context)] for _ in range(args.users)]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True, detokenize=False)
    rounds = []
    for _ in range(args.rounds):
        turn = [rng.randrange(1000, 100_000) for _ in range(32)]
        t, cached, prompt_tokens = time.perf_counter(), 0, 0
        for context in contexts:
            (out,) = llm.generate([{"prompt_token_ids": context + turn}], params, use_tqdm=False)
            cached += out.num_cached_tokens or 0
            prompt_tokens += len(out.prompt_token_ids)
        rounds.append({"s": time.perf_counter() - t, "cached": cached / prompt_tokens})
    _child.print_result({"rounds": rounds})


def run_child(engine: str, args: argparse.Namespace) -> dict | str:
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    command = [sys.executable, "-m", "benchmarks.serve_offload", "--child", "--engine", engine]
    names = (
        "users",
        "context",
        "layers",
        "rounds",
        "max_tokens",
        "gpu_kv_gib",
        "vram_gib",
        "codec",
        "advisor_ms",
        "tp",
    )
    for name in names:
        command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    if args.eager:
        command.append("--eager")
    return _child.run_child(command, env, engine)


def engines(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(case, engine, baseline engine) rows; engine = kind:host_gib:policy."""
    rows = [] if args.no_prefix else [("-", "prefix:0:-", "")]
    for case in args.cases.split(","):
        if case == "checksums":
            unchecked = f"unchecked:{args.fits_gib:g}:graph"
            rows += [(case, unchecked, ""), (case, f"tiercache:{args.fits_gib:g}:graph", unchecked)]
            continue
        gib = {"fits": args.fits_gib, "tight": args.tight_gib, "pressure": args.pressure_gib}[case]
        native = f"native:{gib * K8V4_SHRINK if case == 'pressure' else gib:g}:-"
        rows.append((case, native, ""))
        for policy in args.policies.split(",") if case == "pressure" else ("graph",):
            rows.append((case, f"tiercache:{gib:g}:{policy}", native))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=16)
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--gpu-kv-gib", type=float, default=8.0, help="GPU KV memory, every engine, per GPU")
    parser.add_argument("--tp", type=int, default=1, help="tensor_parallel_size; host sizes are per rank")
    parser.add_argument("--vram-gib", type=float, default=0.5, help="tiercache's VRAM tier (from the above)")
    parser.add_argument("--codec", default="k8v4")
    parser.add_argument("--cases", default="fits,tight,pressure", help="any of fits,tight,pressure,checksums")
    parser.add_argument("--fits-gib", type=float, default=20.0)
    parser.add_argument("--tight-gib", type=float, default=8.0)
    parser.add_argument("--pressure-gib", type=float, default=4.0)
    parser.add_argument("--no-prefix", action="store_true", help="leave out the prefix-caching-only engine")
    parser.add_argument("--policies", default="graph,lru", help="tiercache policies, pressure case")
    parser.add_argument(
        "--advisor-ms",
        type=int,
        default=500,
        help="tiercache's eviction.advisor_interval in ms (max_stale: the config's default for it)",
    )
    parser.add_argument(
        "--eager",
        action="store_true",
        help="enforce_eager (no torch.compile, no CUDA graphs): faster to start, slower to decode",
    )
    parser.add_argument("--engine", help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    rows, results = engines(args), {}
    for _, engine, _ in rows:
        if engine not in results:
            results[engine] = run_child(engine, args)
            print(f"{engine}: {results[engine]}", flush=True)

    def steady(engine: str) -> tuple[float, float] | None:
        res = results.get(engine)
        if not isinstance(res, dict) or len(res["rounds"]) < 2:
            return None
        later = res["rounds"][1:]
        return sum(r["s"] for r in later) / len(later), sum(r["cached"] for r in later) / len(later)

    print(f"\n{args.users} users × {args.context} tokens, {args.layers} layers, "
          f"GPU KV {args.gpu_kv_gib:g} GiB per GPU, tensor parallel {args.tp}, {args.rounds} rounds, "
          f"codec {args.codec}, "
          f"{'eager' if args.eager else 'CUDA graphs'}")  # fmt: skip
    print("case | engine | host GiB/rank | round s (each) | steady s | cached % (steady) | against baseline")
    for case, engine, baseline in rows:
        res, mine = results[engine], steady(engine)
        kind, gib, policy = engine.split(":")
        name = kind if policy == "-" else f"{kind} {policy}"
        if mine is None:
            print(f"{case} | {name} | {gib} | failed: {res}")
            continue
        each = ", ".join(f"{r['s']:.2f}" for r in res["rounds"])
        ref = steady(baseline) if baseline else None
        if not ref:
            speed = "-"
        elif case == "checksums":  # the cost of checking, in steady-round time
            speed = f"{100 * (mine[0] / ref[0] - 1):+.1f} % time"
        else:
            speed = f"{ref[0] / mine[0]:.2f}× faster than native"
        print(f"{case} | {name} | {gib} | {each} | {mine[0]:.2f} | {100 * mine[1]:.1f} | {speed}")


if __name__ == "__main__":
    main()
