"""What a new user meets first (issue 25): `tiercache demo` refuses bad input before vLLM starts, in one line
with exit status 2; scripts/setup.sh says what it is doing at every step; the README's demo sample is of the
default workload and exercises both tiers."""

import argparse
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()

# A vllm that raises on import: the demo must have refused the input before it imports vLLM.
NO_VLLM = 'raise RuntimeError("vLLM was imported: the demo checked its input too late")\n'


@pytest.fixture(scope="module")
def no_vllm(tmp_path_factory) -> dict:
    fake = tmp_path_factory.mktemp("no_vllm")
    (fake / "vllm").mkdir()
    (fake / "vllm" / "__init__.py").write_text(NO_VLLM)
    typo = fake / "typo.yaml"
    typo.write_text("codec: k8v4\ntiers:\n  vrma: 4GiB\n")
    env = {k: v for k, v in os.environ.items() if k != "TIERCACHE_CONFIG"}
    return {**env, "PYTHONPATH": str(fake), "TYPO": str(typo)}


def demo(args: list[str], env: dict) -> tuple[subprocess.CompletedProcess, float, float]:
    """Run `tiercache demo ARGS`; returns (result, wall seconds, CPU seconds of the child)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    run = subprocess.run(
        [sys.executable, "-m", "tiercache.cli", "demo", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return run, wall, cpu


# (arguments, what the one line must name): the key, the bad value, where it came from. The wording is the
# config module's; these are only the facts a user needs to fix it.
BAD_INPUT = [
    (["--codec", "bogus"], ("codec", "'bogus'", "--codec", "k8v4")),
    (["--vram", "4 gigs"], ("tiers.vram", "'4 gigs'", "--vram", "GiB")),
    (["--dram", "4TiB"], ("tiers.dram", "4.00 TiB", "host memory")),
    (["--turns", "7"], ("--turns must be 1..3",)),
    (["--model", "/no/such/model"], ("--model /no/such/model", "config.json")),
    (["--config", "{TYPO}"], ("tiers.vrma", "typo.yaml", "tiers.vram")),
    ([], ("tiers.vrma", "typo.yaml", "tiers.vram")),  # with TIERCACHE_CONFIG=typo.yaml
]


@pytest.mark.parametrize(("args", "names"), BAD_INPUT)
def test_demo_refuses_bad_input_before_vllm_starts(no_vllm, args, names):
    env = dict(no_vllm)
    if not args:
        env["TIERCACHE_CONFIG"] = env["TYPO"]
    run, wall, cpu = demo([a.format(TYPO=env["TYPO"]) for a in args], env)
    assert run.returncode == 2, run.stderr[-2000:]
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tiercache demo: "), run.stderr[-2000:]
    assert all(name in lines[0] for name in names), lines[0]
    assert run.stdout == ""
    # A few seconds of work at most (Python start and the torch import are most of it: 1.6-2.1 s of CPU on
    # the 2-core CI machine, more while other tests run beside it). CPU time, not wall-clock, so a busy
    # machine does not fail the test; both bounds are far below vLLM's ~10 s start-up.
    assert cpu < 3.0 and wall < 8.0, (cpu, wall)


# ---------------------------------------------------------------- scripts/setup.sh says what it does
# Reports each call on fd 3, which the tests point at the script's stdout: setup.sh shows pip's own output
# only when pip fails, so the order of announcements and calls is read from one stream.
FAKE_PIP = '#!/bin/sh\necho "PIP $*" >&3\n'
FAKE_PYTHON = '#!/bin/sh\n[ "$1" = -c ] && exit 1\nexit 0\n'  # `python -c "import torch"`: not installed


def test_setup_prints_a_progress_line_before_every_step(tmp_path):
    """Three silent minutes were the complaint: every install step is announced before it starts (numbered),
    and its time printed when it ends. Runs the real script on a fake .venv whose pip only echoes."""
    script = fake_setup(tmp_path, FAKE_PIP)
    env = {**os.environ, "PATH": f"{tmp_path / '.venv' / 'bin'}:/usr/bin:/bin"}
    command = ["bash", "-c", 'exec 3>&1; exec bash "$0" --with-vllm --with-model', str(script)]
    run = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    pips = [i for i, line in enumerate(lines) if line.startswith("PIP ")]
    assert len(pips) >= 4  # torch, vLLM, the model package, tiercache
    first = {}  # step number → the line that announces it (its first line)
    for i, line in enumerate(lines):
        if m := re.match(r"setup \[(\d)/5\] ", line):
            first.setdefault(int(m[1]), i)
    assert list(first) == [1, 2, 3, 4, 5] and sorted(first.values()) == list(first.values())
    for pip in pips:  # the step that runs this pip was announced, and nothing else ran since
        announced = max(i for i in first.values() if i < pip)
        assert all(lines[j].startswith(("setup [", "PIP ")) for j in range(announced, pip)), lines
    assert sum(bool(re.match(r"setup \[\d/5\] done in \d+ s$", line)) for line in lines) == 4
    assert lines[-1].startswith("setup: .venv ready in ")


def fake_setup(tmp_path: Path, pip: str) -> Path:
    """A copy of setup.sh beside a fake .venv whose pip is `pip` (a shell script)."""
    (tmp_path / "scripts").mkdir()
    script = tmp_path / "scripts" / "setup.sh"
    script.write_text((ROOT / "scripts" / "setup.sh").read_text())
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name, text in (("pip", pip), ("python", FAKE_PYTHON)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (bin_dir / "activate").write_text(f'PATH="{bin_dir}:$PATH"\n')
    return script


CONFLICTS = """ERROR: pip's dependency resolver does not currently take into account all the packages \
that are installed. This behaviour is the source of the following dependency conflicts.
lmcache 0.5.6 requires nvidia-cuda-runtime, which is not installed.
lmcache 0.5.6 requires cupy-cuda12x, which is not installed.
lmcache 0.5.6 has requirement numpy<=2.2.6, but you have numpy 2.3.5.
"""


def test_setup_turns_pips_expected_conflict_report_into_one_note_and_shows_a_failure_whole(tmp_path):
    """LMCache goes in without its declared requirements, so pip lists them as conflicts in lines starting
    with ERROR although the install worked: that becomes one note. A pip that fails is shown in full."""
    fail = "[ \"$FAIL\" = 1 ] && echo 'no matching distribution' >&2 && exit 1"
    pip = f"#!/bin/sh\ncat <<'EOF'\n{CONFLICTS}EOF\n{fail}\nexit 0\n"
    script = fake_setup(tmp_path, pip)
    env = {**os.environ, "PATH": f"{tmp_path / '.venv' / 'bin'}:/usr/bin:/bin"}
    run = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "ERROR" not in run.stdout + run.stderr and "lmcache 0.5.6 requires" not in run.stdout
    notes = [line for line in run.stdout.splitlines() if "note: pip reports 3 declared requirements" in line]
    assert len(notes) == 2, run.stdout  # torch and tiercache steps, both through the fake pip
    failed = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, env={**env, "FAIL": "1"}, timeout=60
    )
    assert failed.returncode != 0
    assert "no matching distribution" in failed.stderr and "lmcache 0.5.6 requires" in failed.stderr


# ---------------------------------------------------------------- the README's demo sample is real
def readme_sample() -> str:
    body = README.split("\n## Two commands\n", 1)[1].split("\n## ", 1)[0]
    return next(text for lang, text in re.findall(r"```(\w*)\n(.*?)```", body, re.S) if not lang)


def test_readme_demo_sample_is_the_default_workload_and_uses_both_tiers():
    """The sample must be a run of the defaults (3 tenants × 2 users × 3 turns), and its numbers must agree
    with each other: hits per tier sum to the lookups line, and DRAM blocks were both hit and warmed."""
    from tiercache.cli.demo import TENANTS, add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    defaults = parser.parse_args([])
    sample = readme_sample()
    requests = len(TENANTS) * defaults.users * defaults.turns
    assert re.search(rf"^requests: {requests}; prompt tokens", sample, re.M), sample[:300]
    tiers = {
        m[1]: int(m[2]) for m in re.finditer(r"^(vram|dram) +\d+ +\d+ +\d+ +[\d.]+ % +(\d+)", sample, re.M)
    }
    hits = re.search(r"lookups: +(\d+) block hits \(vram (\d+), dram (\d+)\)", sample)
    assert (
        hits
        and int(hits[1]) == int(hits[2]) + int(hits[3])
        and tiers
        == {
            "vram": int(hits[2]),
            "dram": int(hits[3]),
        }
    )
    warms = re.search(r"moves: +(\d+) spills and (\d+) warms done", sample)
    assert warms and int(warms[1]) > 0 and int(warms[2]) > 0 and tiers["dram"] > 0
    assert "warm dram→vram" in sample and "spill vram→dram" in sample
    vram_blocks = int(defaults.vram.removesuffix(" tokens")) // 32  # the demo's block size on CPU
    assert re.search(rf"^vram +\d+ +{vram_blocks} ", sample, re.M), (
        "the sample's VRAM tier is not the default"
    )
