"""A real Redis for the remote-tier tests: redis-server bound to 127.0.0.1 on a free port, no persistence.
The `redis_server` fixture (tests/conftest.py) starts one per test module and stops it after.

Provides:
    RedisServer(workdir)   .url, .port, start(), stop(), command(*args) -> raw RESP reply,
                           keys(pattern) -> list[bytes]
    require_remote()       fail loudly when redis-server or LMCache is missing
"""

from __future__ import annotations

import importlib.util
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest


class RedisServer:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = _free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"redis-server did not answer on port {self.port} within 10 s")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None

    def command(self, *args: bytes) -> bytes:
        """One RESP command from outside tiercache (to corrupt or inspect values); the raw reply."""
        payload = b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            s.sendall(payload)
            reply = b""
            while not reply.endswith(b"\r\n") or (reply.startswith(b"$") and _bulk_short(reply)):
                reply += s.recv(1 << 20)
            return reply

    def keys(self, pattern: bytes) -> list[bytes]:
        """The keys matching a glob pattern (KEYS: fine for a test server)."""
        reply = self.command(b"KEYS", pattern)
        return [line for line in reply.split(b"\r\n") if line and line[:1] not in b"*$"]


def require_remote() -> None:
    if shutil.which("redis-server") is None:
        pytest.fail(
            "redis-server is not installed: apt-get install -y redis-server (scripts/setup.sh --with-remote)"
        )
    if importlib.util.find_spec("lmcache") is None:
        pytest.fail(
            'LMCache is not installed: pip install "tiercache[remote]" (scripts/setup.sh --with-remote)'
        )


def _bulk_short(reply: bytes) -> bool:
    head, _, rest = reply.partition(b"\r\n")
    n = int(head[1:])
    return n >= 0 and len(rest) < n + 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
