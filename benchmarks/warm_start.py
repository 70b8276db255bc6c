"""Warm start, end to end with real vLLM on a GPU: the time of a process's first round of requests against
an identical later round, with tiercache's warm start off and on (each in a fresh process with an empty
Triton cache, so every kernel compiles in the process that uses it). Also prints what vLLM's metrics
registry holds of tiercache's counters, and explains one request, so one run checks issue 25's items 1-3
on the GPU's vLLM.

    python benchmarks/warm_start.py                       # Llama-3.1-8B shapes, dummy weights, k8v4
    python benchmarks/warm_start.py --users 2 --context 1024 --layers 4    # smaller

A round: `users` new prompts of `context` random tokens (stored by the connector: encode), then the same
prompts with a few more tokens (vLLM's prefix caching is off, so their prefixes are loaded from the tiers:
decode). Rounds differ only in their random tokens. Reported: each round's seconds and round 1 / round 3.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import _child

LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "num_hidden_layers": 32, "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "torch_dtype": "bfloat16", "tie_word_embeddings": False, "bos_token_id": 128000,
    "eos_token_id": 128001, "hidden_act": "silu",
}  # fmt: skip


def child(args: argparse.Namespace) -> None:
    from vllm import LLM, SamplingParams

    model = Path(tempfile.mkdtemp()) / "llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({**LLAMA_8B, "num_hidden_layers": args.layers}))
    tiers = {"vram": "4GiB", "dram": "8GiB"}
    kv = {
        "kv_connector": "TierCacheConnector", "kv_role": "kv_both",
        "kv_connector_extra_config": {"codec": args.codec, "tiers": tiers, "inspect": {"socket": "off"},
                                      "eviction": {"policy": "lru"}},
    }  # fmt: skip
    started = time.perf_counter()
    llm = LLM(
        model=str(model), load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16",
        max_model_len=args.context + 64, enforce_eager=True, enable_prefix_caching=False,
        gpu_memory_utilization=0.5, kv_transfer_config=kv, disable_log_stats=False, seed=0,
    )  # fmt: skip
    start_s = time.perf_counter() - started
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    warm_s = get_kv_transfer_group().worker.warm_seconds  # single-process engine: the worker is here
    greedy = SamplingParams(temperature=0, max_tokens=1, detokenize=False)
    more = SamplingParams(temperature=0, max_tokens=8, detokenize=False)
    import random

    rounds, last = [], None
    for r in range(args.rounds):
        rng = random.Random(1000 + r)
        prompts = [[rng.randrange(1000, 100_000) for _ in range(args.context)] for _ in range(args.users)]
        t = time.perf_counter()
        llm.generate([{"prompt_token_ids": p} for p in prompts], greedy, use_tqdm=False)
        last = llm.generate([{"prompt_token_ids": p + [7] * 16} for p in prompts], more, use_tqdm=False)
        rounds.append(time.perf_counter() - t)
    loaded = sum(o.num_cached_tokens for o in last)
    metrics = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:tiercache_") and hasattr(m, "value"):
            key = m.name[len("vllm:tiercache_") :] + "".join(
                f"[{v}]" for k, v in sorted(m.labels.items()) if k not in ("model_name", "engine")
            )
            metrics[key] = metrics.get(key, 0) + m.value
    why = None
    try:
        from tiercache.inspect import connect

        core = llm.llm_engine.engine_core.engine_core  # single-process engines only
        with connect(state=core.scheduler.connector.scheduler.inspection) as client:
            why = client.explain_request(last[0].request_id).summary
    except AttributeError:
        why = "(multi-process engine: ask with tiercache inspect --why)"
    result = {"start_s": start_s, "warm_s": warm_s, "rounds": rounds, "loaded_last": loaded}
    _child.print_result({**result, "metrics": metrics, "why": why})


def run_child(warm: bool, args: argparse.Namespace) -> dict:
    env = {**os.environ, "TIERCACHE_WARM_START": "1" if warm else "0", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    env["TRITON_CACHE_DIR"] = tempfile.mkdtemp(
        prefix="triton-cache-"
    )  # every kernel compiles in this process
    command = [sys.executable, "-m", "benchmarks.warm_start", "--child", "--users", str(args.users),
               "--context", str(args.context), "--layers", str(args.layers), "--rounds", str(args.rounds),
               "--codec", args.codec]  # fmt: skip
    label = f"child (warm start {'on' if warm else 'off'})"
    result = _child.run_child(command, env, label)
    if not isinstance(result, dict):
        raise SystemExit(f"{label} failed: {result}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--codec", default="k8v4")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    results = {warm: run_child(warm, args) for warm in (False, True)}
    on = results[True]
    print(f"tiercache metrics in vLLM's registry (warm start on, {args.rounds} rounds):")
    for key, value in sorted(on["metrics"].items()):
        print(f"  {key} = {value:g}")
    print(f"explain_request of the last round's first request: {on['why']}")
    print()
    rounds_header = " | ".join(f"round {i + 1} s" for i in range(args.rounds))
    print(
        f"warm start | engine start s | warm-up s | {rounds_header} | round 1 / last | tokens loaded (last)"
    )
    for warm, res in results.items():
        rounds = res["rounds"]
        cells = " | ".join(f"{t:.3f}" for t in rounds)
        ratio = rounds[0] / rounds[-1]
        head = f"{'on' if warm else 'off':>10} | {res['start_s']:14.1f} | {res['warm_s']:9.2f}"
        row = f"{head} | {cells} | {ratio:14.2f}"
        print(f"{row} | {res['loaded_last']}")


if __name__ == "__main__":
    main()
