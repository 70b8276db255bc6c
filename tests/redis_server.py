"""A real Redis for the remote-tier tests: redis-server bound to 127.0.0.1 on a free port, no automatic
persistence (a SAVE command writes a snapshot into workdir, which the next start loads).
The `redis_server` fixture (tests/conftest.py) starts one per test module and stops it after.

Also used by benchmarks/remote_store.py and benchmarks/serve_remote.py (run from the repository root, or
from a copy holding benchmarks/ and tests/redis_server.py): this module imports only the standard library
(pytest only inside require_remote).

Provides:
    RedisServer(workdir, executable="redis-server", library_path=None)
                           .url, .port, start(), stop(), command(*args) -> raw RESP reply,
                           keys(pattern) -> list[bytes], kill() (SIGKILL: no shutdown of its own);
                           stop() or kill(), then start(), comes back on the same port (with the data of
                           the last SAVE: its snapshot is in workdir)
    RedisServer.unpacked(root, workdir)   the server of Debian packages unpacked with `dpkg -x DEB root`
                           (redis-tools and the libraries it needs; for machines where nothing can be
                           installed): root/usr/bin/redis-server, or redis-tools' redis-check-rdb (the
                           same binary, run under the name redis-server), its libraries found through
                           LD_LIBRARY_PATH set for the server process only
    require_remote()       fail loudly when redis-server or LMCache is missing
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

_LIB_DIRS = ("usr/lib/x86_64-linux-gnu", "lib/x86_64-linux-gnu")  # where Debian's amd64 packages put them


class RedisServer:
    def __init__(
        self, workdir: Path, executable: str = "redis-server", library_path: str | None = None
    ) -> None:
        self.workdir = workdir
        self.executable = executable
        self.library_path = library_path
        self.port = _free_port()
        self.proc: subprocess.Popen | None = None

    @classmethod
    def unpacked(cls, root: Path, workdir: Path) -> RedisServer:
        executable = root / "usr/bin/redis-server"
        if not executable.exists():  # Debian's redis-server package only links redis-tools' one binary
            executable = root / "usr/bin/redis-check-rdb"
        if not executable.exists():
            raise FileNotFoundError(
                f"{root}/usr/bin/redis-check-rdb not found: unpack redis-tools and its libraries there first "
                f"(for f in DIR/*.deb; do dpkg -x $f {root}; done)"
            )
        return cls(workdir, str(executable), os.pathsep.join(str(root / d) for d in _LIB_DIRS))

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = None
        if self.library_path:
            env = {**os.environ, "LD_LIBRARY_PATH": self.library_path}
        log = self.workdir / "redis-server.log"
        with log.open("ab") as out:
            self.proc = subprocess.Popen(  # argv[0] "redis-server": redis's one binary acts by its name
                ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
                 "--appendonly", "no", "--dir", str(self.workdir)],
                executable=self.executable, stdout=out, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):  # not -LOADING (a snapshot being read)
                        return
            except OSError:
                if self.proc.poll() is not None:
                    break
            time.sleep(0.02)
        code = self.proc.poll()
        self.stop()
        what = f"exited with code {code}" if code is not None else "did not answer within 10 s"
        raise RuntimeError(f"{self.executable} on port {self.port} {what}; its log: {log}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
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
    import pytest

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
