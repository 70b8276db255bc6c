"""Primary mode served by real vLLM on a GPU, against vLLM's bf16 FLASH_ATTN and its fp8 cache (and, when
FlashAttention 2 is packed, vLLM's own TURBOQUANT cache dtypes): tokens held in the same KV memory, prefill
tokens/s, decode step time and output tokens/s.

    python -m benchmarks.serve          # bf16, fp8 and the presets; 16 layers of Llama-3.1-8B shape
    python -m benchmarks.serve --configs bf16,fp8,vllm-tq-k8v4,vllm-tq-4bit   # vLLM's own caches
    python -m benchmarks.serve --configs bf16,tq4 --sets 2x1024 --layers 2     # a quick check
    python -m benchmarks.serve --configs bf16,tq4,tq4-exact2,k8v4-exact2         # boundary layers exact
    python -m benchmarks.serve --tp 2 --layers 32    # tensor parallelism: 4 KV heads and --kv-gib per GPU

Each configuration runs in its own process with the same `--kv-gib` of KV cache memory
(kv_cache_memory_bytes), dummy weights and vLLM's default compilation (CUDA graphs where the backend allows;
tiercache's backend runs attention eagerly between vLLM's piecewise graphs). For each set N × L (N sequences
of L random tokens, all resident at once):
  prefill   generate(max_tokens=1) over fresh prompts, after one pass over other prompts of the same shape
            (so no configuration pays its first compiles here): N·L / seconds
  decode    the same prompts again (prefix-cache hits), stepped through the engine: the wall time of the K
            engine steps after every request has its first token, divided by K (every one of those steps
            decodes all N sequences); the median of three passes after a warm-up pass
The layer count is a flag because bf16 must hold 16 × 32K tokens on one H100 next to the weights; capacity
ratios do not depend on it where every layer's page is the same. The `-exact2` configs keep the first two and
the last two layers exact (codec.exact_layers [0, 1, -2, -1], vLLM's --kv-cache-dtype-skip-layers): 4 of the
`--layers` layers hold bf16 pages, so their ratio does depend on it (4 of 16 here, 4 of 32 in Llama-3.1-8B:
run `--layers 32 --sets 16x16384` for the real model's). vLLM's own TURBOQUANT dtypes keep the same four
layers exact (its arg_utils adds them). A vLLM that cannot keep layers exact fails that config, and the table
says so.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import _child
from benchmarks.warm_start import LLAMA_8B

BOUNDARY = [0, 1, -2, -1]  # the first two and last two layers
# name -> (attention backend or None for vLLM's default, tiercache codec (its YAML value) or None,
#          vLLM's cache dtype where tiercache does not choose it: its configs take exact_layers.cache_args')
CONFIGS = {
    "bf16": (None, None, "auto"),
    "fp8": (None, None, "fp8"),
    "balanced": ("CUSTOM", "balanced", None),
    "capacity": ("CUSTOM", "capacity", None),
    "tq4": ("CUSTOM", "tq4", None),
    "k8v4": ("CUSTOM", "k8v4", None),
    "tq4-exact2": ("CUSTOM", {"keys": 4, "values": 4, "exact_layers": BOUNDARY}, None),
    "k8v4-exact2": ("CUSTOM", {"keys": 8, "values": 4, "exact_layers": BOUNDARY}, None),
    "vllm-tq-k8v4": (None, None, "turboquant_k8v4"),
    "vllm-tq-4bit": (None, None, "turboquant_4bit_nc"),
}


def child(args: argparse.Namespace) -> None:
    import torch
    from vllm import LLM

    from tiercache.config import TierCacheConfig
    from tiercache.connectors.attention.exact_layers import cache_args

    backend, codec, dtype = CONFIGS[args.config]
    model = Path(tempfile.mkdtemp()) / "llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({**LLAMA_8B, "num_hidden_layers": args.layers}))
    options = {"attention_config": {"backend": backend}} if backend else {}
    if codec:
        (model.parent / "tiercache.yaml").write_text(json.dumps({"codec": codec}) + "\n")  # JSON is YAML
        os.environ["TIERCACHE_CONFIG"] = str(model.parent / "tiercache.yaml")
        spec = TierCacheConfig.load().codec
        cache = cache_args(spec, args.layers, LLAMA_8B["head_dim"], torch.bfloat16)  # the page on this vLLM
        dtype = cache["kv_cache_dtype"]
        if cache["kv_cache_dtype_skip_layers"]:
            options["kv_cache_dtype_skip_layers"] = cache["kv_cache_dtype_skip_layers"]
    sets = [tuple(int(x) for x in s.split("x")) for s in args.sets.split(",")]
    started = time.perf_counter()
    llm = LLM(
        model=str(model), load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16", seed=0,
        max_model_len=max(length for _, length in sets) + 2 * args.steps, enable_prefix_caching=True,
        kv_cache_memory_bytes=int(args.kv_gib * 2**30), max_num_seqs=max(n for n, _ in sets),
        kv_cache_dtype=dtype, enforce_eager=args.eager, tensor_parallel_size=args.tp, **options,
    )  # fmt: skip
    start_s = time.perf_counter() - started
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler  # single-process engine
    tokens = scheduler.kv_cache_config.num_blocks * scheduler.cache_config.block_size
    rows = []
    for n, length in sets:
        prompts = _random_prompts(n, length, seed=n * 100_003 + length)
        _timed(llm, _random_prompts(n, length, seed=-1 - n), 1)  # compiles this shape's prefill
        prefill_s = _timed(llm, prompts, 1)
        _decode_step_s(llm, prompts, args.steps)  # compiles what is new to this process
        step_s = statistics.median(_decode_step_s(llm, prompts, args.steps) for _ in range(3))
        rows.append({"n": n, "length": length, "prefill_tok_s": n * length / prefill_s,
                     "step_ms": 1e3 * step_s, "out_tok_s": n / step_s})  # fmt: skip
    _child.print_result({"tokens": tokens, "start_s": start_s, "sets": rows})


def _random_prompts(n: int, length: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"prompt_token_ids": [rng.randrange(1000, 100_000) for _ in range(length)]} for _ in range(n)]


def _decode_step_s(llm, prompts: list[dict], steps: int) -> float:
    """Seconds per decode step of all `prompts` together: from the engine step that gives the last of them
    its first token until every one has `steps` more, divided by `steps` (a step that overlaps the next
    one's scheduling is so counted once). The requests are then aborted."""
    from vllm import SamplingParams

    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=2 + 2 * steps, ignore_eos=True, detokenize=False)
    tag = time.monotonic_ns()
    ids = [f"decode-{tag}-{i}" for i in range(len(prompts))]
    for request_id, prompt in zip(ids, prompts, strict=True):
        engine.add_request(request_id, prompt, params)
    counts: dict[str, int] = {}
    while len(counts) < len(ids):
        counts.update((out.request_id, len(out.outputs[0].token_ids)) for out in engine.step())
    first, t = dict(counts), time.perf_counter()
    while min(counts[i] - first[i] for i in first) < steps:
        outs = engine.step()
        counts.update((out.request_id, len(out.outputs[0].token_ids)) for out in outs)
        assert all(not out.finished for out in outs), "a request finished inside the timed steps"
    elapsed = time.perf_counter() - t
    engine.abort_request(ids)
    while engine.has_unfinished_requests():
        engine.step()
    return elapsed / steps


def _timed(llm, prompts: list[dict], max_tokens: int) -> float:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
    t = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == max_tokens for o in outs)
    return time.perf_counter() - t


def run_child(config: str, args: argparse.Namespace) -> dict | str:
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    command = [sys.executable, "-m", "benchmarks.serve", "--child", "--config", config,
               "--layers", str(args.layers), "--kv-gib", str(args.kv_gib), "--sets", args.sets,
               "--steps", str(args.steps), "--tp", str(args.tp)]  # fmt: skip
    if args.eager:
        command.append("--eager")
    return _child.run_child(command, env, config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default="bf16,fp8,balanced,capacity,tq4,k8v4")
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--kv-gib", type=float, default=36.0)
    parser.add_argument("--sets", default="16x32768,64x8192", help="N x L sets, comma separated")
    parser.add_argument("--steps", type=int, default=64, help="decode steps timed per set")
    parser.add_argument("--eager", action="store_true", help="enforce_eager for every configuration")
    parser.add_argument("--tp", type=int, default=1, help="tensor_parallel_size (--kv-gib is per GPU)")
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    results = {}
    for config in args.configs.split(","):
        results[config] = run_child(config, args)
        print(f"{config}: {results[config]}", flush=True)
    base = results.get("bf16")
    base = base if isinstance(base, dict) else None
    print(f"\n{args.layers} layers of Llama-3.1-8B shape, {args.kv_gib:g} GiB of KV cache per GPU, "
          f"tensor parallel {args.tp}, {'eager' if args.eager else 'default compilation'}")  # fmt: skip
    print("config | tokens held | × bf16 | set | prefill tok/s | × bf16 | decode step ms | × bf16 | "
          "out tok/s")  # fmt: skip
    for config, res in results.items():
        if not isinstance(res, dict):
            print(f"{config} | failed: {res}")
            continue
        times = f"{res['tokens'] / base['tokens']:.2f}" if base else "-"
        held = f"{res['tokens']:,} | {times}"
        for i, row in enumerate(res["sets"]):
            ref = base["sets"][i] if base else None
            pre = f"{row['prefill_tok_s'] / ref['prefill_tok_s']:.2f}" if ref else "-"
            step = f"{row['step_ms'] / ref['step_ms']:.2f}" if ref else "-"
            print(f"{config} | {held} | {row['n']}×{row['length']} | {row['prefill_tok_s']:,.0f} | {pre} | "
                  f"{row['step_ms']:.2f} | {step} | {row['out_tok_s']:,.0f}")  # fmt: skip


if __name__ == "__main__":
    main()
