"""Benchmarks that run each vLLM engine in its own process: the child prints one line `RESULT <json>`.

Provides:
    print_result(value)                    in the child: the line the parent reads
    run_child(command, env, label) -> dict | str   in the parent: the child's result, or, when it failed
                                           (its output tail written to stderr), the last line of its stderr
"""

from __future__ import annotations

import json
import subprocess
import sys

PREFIX = "RESULT "


def print_result(value) -> None:
    print(PREFIX + json.dumps(value), flush=True)


def run_child(command: list[str], env: dict[str, str], label: str) -> dict | str:
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    lines = [line for line in out.stdout.splitlines() if line.startswith(PREFIX)]
    if out.returncode != 0 or not lines:
        sys.stderr.write(f"--- {label} failed ({out.returncode}):\n")
        sys.stderr.write(out.stdout[-3000:] + out.stderr[-5000:] + "\n")
        return ((out.stderr.strip().splitlines() or ["no output"])[-1])[:160]
    return json.loads(lines[-1][len(PREFIX) :])
