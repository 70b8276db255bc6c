"""Issue 26, item 4 (and issue 25's stale socket): the client does not trust the server. Malformed replies
raise InspectError (never TypeError/AttributeError), the timeout bounds the whole request, the CLI prints one
line, the `latest` pointer is never written through a symlink, and a server stopped by Ctrl-C (also in a
forked multiprocessing child, as vLLM runs its engine) leaves no socket file behind."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgpack
import pytest

from tiercache.cli import main
from tiercache.inspect import InspectError, connect
from tiercache.inspect import paths as inspect_paths
from tiercache.inspect.protocol import HEADER

STATS = {"pid": 1, "policy": "lru", "codec_id": "c", "blocks": 0, "hits": 0, "hits_by_tier": {}, "misses": 0,
         "hit_rate": None, "stores": 0, "store_failures": 0, "spills": 0, "spill_failures": 0, "warms": 0,
         "warm_failures": 0, "evictions": 0, "evictions_by_policy": {}, "drops": 0, "tokens_loaded": 0,
         "tokens_recomputed": 0, "token_hit_rate": None, "ttft": {}, "tiers": []}  # fmt: skip
DECISION = {"seq": 1, "kind": "eviction", "block_hash": b"\x01" * 32, "reason": "r", "age_s": 1.0,
            "tier_from": "vram", "tier_to": None, "slot": 3, "components": {"idle_s": 1.0}}  # fmt: skip


class FakeServer:
    """Answers each request on `path` with `reply` (any object), or drips `drip` bytes, one per `every` s."""

    def __init__(self, path: Path, reply=None, drip: bytes | None = None, every: float = 0.5) -> None:
        self.reply, self.drip, self.every = reply, drip, every
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(8)
        self.path = path
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                while conn.recv(1 << 16):
                    if self.drip is not None:
                        for i in range(len(self.drip)):
                            conn.send(self.drip[i : i + 1])
                            time.sleep(self.every)
                    else:
                        body = msgpack.packb(self.reply, use_bin_type=True)
                        conn.sendall(HEADER.pack(len(body)) + body)
            except OSError:
                pass

    def close(self) -> None:
        self.sock.close()


def _with(stats=None, **fields) -> dict:
    return {"ok": True, "result": {**(stats or STATS), **fields}}


# (method called, reply the server sends, fragment of the InspectError)
MALFORMED = [
    ("stats", [1, 2], "malformed reply"),
    ("stats", {"ok": True}, "malformed reply"),
    ("stats", {"ok": "yes", "result": 1}, "malformed reply"),
    ("stats", {"ok": False, "error": 7}, "malformed reply"),
    ("stats", {"ok": True, "result": []}, "Stats should be a map"),
    ("stats", {"ok": True, "result": {"pid": 1}}, "Stats.policy is missing"),
    ("stats", _with(pid="one"), "Stats.pid should be int"),
    ("stats", _with(hit_rate="high"), "Stats.hit_rate should be float | None"),
    ("stats", _with(hits_by_tier=[1]), "Stats.hits_by_tier should be Mapping[str, int]"),
    ("stats", _with(ttft=[1]), "Stats.ttft should be a map"),
    ("stats", _with(ttft={"hit": 5}), "TTFTStats should be a map"),
    ("stats", _with(tiers={"vram": 1}), "Stats.tiers should be a list"),
    ("stats", _with(tiers=[None]), "TierStats should be a map"),
    ("stats", _with(tiers=[{"name": "vram"}]), "TierStats.capacity_blocks is missing"),
    ("tiers", {"ok": True, "result": None}, "tiers should be a list"),
    ("tiers", {"ok": True, "result": [{"name": 3}]}, "TierStats.name should be str"),
    ("decisions", {"ok": True, "result": "x"}, "decisions should be a list"),
    ("decisions", {"ok": True, "result": [[1]]}, "Decision should be a map"),
    ("decisions", {"ok": True, "result": [{**DECISION, "block_hash": "ab"}]}, "Decision.block_hash"),
    ("decisions", {"ok": True, "result": [{**DECISION, "components": {"a": "b"}}]}, "Decision.components"),
    ("decisions", {"ok": True, "result": [{**DECISION, "slot": True}]}, "Decision.slot should be int"),
    ("blocks", {"ok": True, "result": [{"block_hash": b"x"}]}, "BlockRecord.tier is missing"),
    ("explain", {"ok": True, "result": {"block_hash": b"x", "block": 3}}, "BlockRecord should be a map"),
    ("explain", {"ok": True, "result": {"block_hash": b"x", "decisions": 3}}, "Explanation.decisions"),
    ("explain", {"ok": True, "result": {"block_hash": b"x", "stored": True, "block": None, "policy": "lru",
                                        "score": None, "components": {}, "decisions": [], "summary": "s",
                                        "graph": {"a": [[[[[[1]]]]]]}}}, "Explanation.graph"),
    ("ping", {"ok": True, "result": 5}, "ping should be a map"),
]  # fmt: skip


def _call(client, method: str):
    if method == "explain":
        return client.explain(b"\x01" * 32)
    return getattr(client, method)()


@pytest.mark.parametrize(
    ("method", "reply", "fragment"), MALFORMED, ids=[f"{i}" for i in range(len(MALFORMED))]
)
def test_malformed_replies_raise_inspect_error(short_dir, method, reply, fragment):
    server = FakeServer(short_dir / "f.sock", reply)
    try:
        with connect(server.path, timeout=2) as client, pytest.raises(InspectError) as info:
            _call(client, method)
    finally:
        server.close()
    message = str(info.value)
    assert fragment in message and len(message) < 600, message


def test_a_good_reply_still_parses(short_dir):
    server = FakeServer(short_dir / "g.sock", _with())
    try:
        with connect(server.path, timeout=2) as client:
            stats = client.stats()
        assert stats.pid == 1 and stats.tiers == () and stats.ttft_hit is None
    finally:
        server.close()


def test_the_timeout_bounds_the_whole_request(short_dir):
    """A server dripping a byte every 0.5 s kept a client with timeout=1 waiting forever (per-recv)."""
    body = msgpack.packb({"ok": True, "result": {}})
    server = FakeServer(short_dir / "d.sock", drip=HEADER.pack(len(body)) + body, every=0.3)
    try:
        start = time.monotonic()
        with connect(server.path, timeout=1.0) as client, pytest.raises(InspectError, match="within 1s"):
            client.ping()
        assert time.monotonic() - start < 1.6
    finally:
        server.close()


def test_the_cli_prints_one_line(short_dir, capsys):
    server = FakeServer(short_dir / "c.sock", _with(tiers=[{"name": 5}]))
    try:
        assert main(["inspect", "--socket", str(server.path), "--timeout", "2"]) == 1
    finally:
        server.close()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tiercache inspect: ") and "Traceback" not in err
    assert "TierStats.name should be str" in err


def test_the_pointer_is_never_written_through_a_symlink(short_dir):
    directory = inspect_paths.private_dir(short_dir / "tiercache")
    victim = short_dir / "victim"
    victim.write_text("precious\n")
    (directory / f".latest.{os.getpid()}").symlink_to(victim)  # the old fixed temporary name
    (directory / "latest").symlink_to(victim)
    sock_path = directory / f"tiercache-{os.getpid()}.sock"
    inspect_paths.write_pointer(sock_path)
    assert victim.read_text() == "precious\n"
    assert not (directory / "latest").is_symlink() and (directory / "latest").read_text().strip() == str(
        sock_path
    )
    (directory / "latest").unlink()
    (directory / "latest").symlink_to(victim)
    inspect_paths.clear_pointer(sock_path)  # reads with O_NOFOLLOW: the link is not followed, nor removed
    assert victim.read_text() == "precious\n" and (directory / "latest").is_symlink()


def test_a_dead_processs_socket_is_swept_at_start(short_dir, monkeypatch):
    directory = inspect_paths.private_dir(short_dir / "tiercache")
    dead = directory / "tiercache-999999999.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(dead))
    s.close()
    (directory / "latest").write_text(str(dead) + "\n")
    monkeypatch.setattr(inspect_paths, "socket_dirs", lambda: [directory])
    assert inspect_paths.auto_socket_path() == directory / f"tiercache-{os.getpid()}.sock"
    assert not dead.exists() and not (directory / "latest").exists()


SERVE = """
import multiprocessing, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # pytest's runner may ignore SIGINT
from tiercache.inspect import InspectionService, InspectionState

def serve(path):
    service = InspectionService(InspectionState(), path)
    print("ready", flush=True)
    while True:
        time.sleep(0.05)

if sys.argv[2] == "main":
    serve(sys.argv[1])
else:  # a forked child, as vLLM runs its engine core: it exits by os._exit, without atexit
    child = multiprocessing.get_context("fork").Process(target=serve, args=(sys.argv[1],))
    child.start()
    child.join()
"""


@pytest.mark.parametrize("where", ["main", "fork"])
def test_ctrl_c_leaves_no_socket_file(short_dir, where):
    path = short_dir / f"{where}.sock"
    proc = subprocess.Popen([sys.executable, "-c", SERVE, str(path), where], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True)  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "ready" and path.exists()
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole process group
        proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert not path.exists()
