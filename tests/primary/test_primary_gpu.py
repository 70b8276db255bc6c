"""Primary mode on a GPU (skipped without CUDA): the tiny Llama at head_dim 128 served with
--attention-backend CUSTOM on vLLM's CUDA path (on vLLM 0.26 the page comes from --kv-cache-dtype), float32
so that greedy tokens compare exactly with the plain-PyTorch reference of the same quantization; and with
layers 0 and 3 of a 4-layer one kept exact (codec.exact_layers, vLLM's --kv-cache-dtype-skip-layers); and
with tensor parallelism on two GPUs (skipped with one)."""

from __future__ import annotations

import pytest
import reference
import torch
from helpers import connector_config, engine
from tiny_llama import build_tiny_llama, words_prompt

MAX_TOKENS = 12
PROMPTS = [words_prompt(100 * i, n) for i, n in enumerate((10, 33, 70, 150, 300))]


def _two_gpus() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() >= 2


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("preset", "legacy_dtype", "eager"),
    [("tq4", "int4_per_token_head", True), ("k8v4", "fp8", True), ("tq4", "int4_per_token_head", False)],
    ids=["tq4", "k8v4", "tq4-cuda-graphs"],
)
def test_gpu_greedy_tokens_equal_the_reference(tmp_path, monkeypatch, preset, legacy_dtype, eager):
    """eager=False: vLLM's default compilation: decode steps replay full CUDA graphs; the five prompts go
    together, so the batch of five is padded to a captured size (padded rows: no query, sequence length 0)."""
    from tiercache.connectors.attention.cache_dtypes import sizes_pages

    model = build_tiny_llama(tmp_path / "tiny128", head_dim=128)
    (tmp_path / "tc.yaml").write_text(f"codec: {preset}\n")
    monkeypatch.setenv("TIERCACHE_CONFIG", str(tmp_path / "tc.yaml"))
    kv_cache_dtype = "auto" if sizes_pages() else legacy_dtype
    options = dict(
        attention_config={"backend": "CUSTOM"},
        kv_cache_dtype=kv_cache_dtype,
        gpu_memory_utilization=0.3,
        enforce_eager=eager,
    )
    with engine(model, None, **options) as llm:
        from vllm import SamplingParams

        params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
        if eager:
            outs = [llm.generate([p], params, use_tqdm=False)[0] for p in PROMPTS]
        else:
            outs = llm.generate(PROMPTS, params, use_tqdm=False)
    ref = reference.load(model, preset)
    expect = [reference.greedy(ref, list(o.prompt_token_ids), MAX_TOKENS) for o in outs]
    assert [list(o.outputs[0].token_ids) for o in outs] == expect


@pytest.mark.gpu
@pytest.mark.parametrize("eager", [True, False], ids=["eager", "cuda-graphs"])
def test_gpu_exact_boundary_layers_equal_the_reference(tmp_path, monkeypatch, eager):
    """Layers 0 and 3 in float32 pages (exact), 1 and 2 in K4V4 pages; with CUDA graphs the exact layers'
    writes and decodes are captured too (the five prompts decode as one padded batch)."""
    import torch

    from tiercache.config import TierCacheConfig
    from tiercache.connectors.attention.exact_layers import cache_args

    model = build_tiny_llama(tmp_path / "tiny128x4", head_dim=128, num_layers=4)
    (tmp_path / "tc.yaml").write_text("codec: {keys: 4, values: 4, exact_layers: [0, -1]}\n")
    monkeypatch.setenv("TIERCACHE_CONFIG", str(tmp_path / "tc.yaml"))
    cache = cache_args(TierCacheConfig.load().codec, 4, 128, torch.float32)
    options = dict(attention_config={"backend": "CUSTOM"}, gpu_memory_utilization=0.3, enforce_eager=eager)
    with engine(model, None, **options, **cache) as llm:
        from vllm import SamplingParams

        params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
        outs = llm.generate(PROMPTS, params, use_tqdm=False)
    ref = reference.load(model, "tq4", (0, 3))
    expect = [reference.greedy(ref, list(o.prompt_token_ids), MAX_TOKENS) for o in outs]
    assert [list(o.outputs[0].token_ids) for o in outs] == expect


@pytest.mark.gpu
@pytest.mark.skipif(not _two_gpus(), reason="tensor_parallel_size=2 needs two GPUs")
def test_gpu_tensor_parallel_prefix_and_tier_hits_equal_the_reference(tmp_path, monkeypatch):
    """tensor_parallel_size=2 with CUDA graphs: a Llama of 8 KV heads at head_dim 128 (4 per rank, the shape
    of Llama-3.1-8B's attention at TP=2) in K4V4 pages. Prompts sharing a 3-block prefix are served twice:
    by an engine whose prefix cache reuses the GPU pages, and by one with prefix caching off whose
    connector stores every rank's pages to its tiers and loads them back. Both give the greedy tokens of the
    plain-PyTorch reference, which recomputes every token."""
    from vllm import SamplingParams

    from tiercache.connectors.attention.cache_dtypes import sizes_pages

    model = build_tiny_llama(tmp_path / "tiny128kv8", head_dim=128, num_kv_heads=8)
    (tmp_path / "tc.yaml").write_text("codec: tq4\n")
    monkeypatch.setenv("TIERCACHE_CONFIG", str(tmp_path / "tc.yaml"))
    shared = words_prompt(7, 96)  # three full blocks
    prompts = [shared + " " + words_prompt(900, 20), shared + " " + words_prompt(950, 25), PROMPTS[3]]
    options = dict(
        attention_config={"backend": "CUSTOM"}, tensor_parallel_size=2, gpu_memory_utilization=0.2,
        kv_cache_dtype="auto" if sizes_pages() else "int4_per_token_head", enforce_eager=False,
    )  # fmt: skip
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    runs = {}
    engines = {"prefix cache": (None, True), "tiers": (connector_config("tq4"), False)}
    for name, (connector, prefix_caching) in engines.items():
        with engine(model, connector, enable_prefix_caching=prefix_caching, **options) as llm:
            runs[name] = [llm.generate([p], params, use_tqdm=False)[0] for p in prompts]
    ref = reference.load(model, "tq4")
    expect = [reference.greedy(ref, list(o.prompt_token_ids), MAX_TOKENS) for o in runs["tiers"]]
    for name, outs in runs.items():
        assert [o.num_cached_tokens for o in outs[:2]] == [0, 96], name  # the shared blocks were reused
        assert [list(o.outputs[0].token_ids) for o in outs] == expect, name


@pytest.mark.gpu
def test_gpu_preset_dtype_names_the_codec(tmp_path, monkeypatch):
    """vLLM ≥ 0.33: --kv-cache-dtype tiercache_tq4 with no tiercache config serves K4V4 pages (the default
    codec gives way to the flag) with the reference's greedy tokens; a config naming another codec stops
    the engine with both named."""
    from tiercache.connectors.preset_dtypes import registers_dtypes

    if not registers_dtypes():
        pytest.skip("this vLLM has no register_kv_cache_dtype (vLLM >= 0.33)")
    model = build_tiny_llama(tmp_path / "tiny128", head_dim=128)
    monkeypatch.delenv("TIERCACHE_CONFIG", raising=False)
    options = dict(attention_config={"backend": "CUSTOM"}, gpu_memory_utilization=0.3, enforce_eager=True)
    with engine(model, None, kv_cache_dtype="tiercache_tq4", **options) as llm:
        from vllm import SamplingParams

        outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=MAX_TOKENS), use_tqdm=False)
    ref = reference.load(model, "tq4")
    expect = [reference.greedy(ref, list(o.prompt_token_ids), MAX_TOKENS) for o in outs]
    assert [list(o.outputs[0].token_ids) for o in outs] == expect
    (tmp_path / "tc.yaml").write_text("codec: k3v4\n")
    monkeypatch.setenv("TIERCACHE_CONFIG", str(tmp_path / "tc.yaml"))
    refused = pytest.raises(Exception, match="tiercache_tq4 names codec tq4, but the tiercache config")
    with refused, engine(model, None, kv_cache_dtype="tiercache_tq4", **options):
        pass
