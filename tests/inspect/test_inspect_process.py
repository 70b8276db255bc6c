"""The service process's life (server.py, process.py): it ends with the engine, however the engine ends; its
crash never reaches the engine, which logs it and starts another, and gives up (saying so) on one that keeps
crashing; a point read the engine does not answer in time is an error reply, not a hang."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from inspect_helpers import h

from tiercache.inspect import InspectError, InspectionService, ServiceLimits, connect
from tiercache.inspect import reads as reads_module
from tiercache.inspect import server as server_module

pytestmark = pytest.mark.skipif(not Path("/proc/self").exists(), reason="reads process states from /proc")


def _gone(pid: int) -> bool:
    """Exited: no such process, or a zombie its new parent has not reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def _wait(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_close_ends_the_service_process(lru_run, short_dir):
    service = InspectionService(lru_run.state, short_dir / "c.sock")
    pid = service.pid
    assert pid is not None and pid != os.getpid() and not _gone(pid)
    with connect(service.path) as client:
        assert client.ping()["service_pid"] == pid
    service.close()
    assert _gone(pid) and service.pid is None and not service.running
    assert not service.path.exists()


ENGINE = """
import os, sys, time
sys.path.insert(0, {helpers!r})
from inspect_helpers import Workload
from tiercache.inspect import InspectionService
w = Workload("lru").run()
service = InspectionService(w.state, {path!r})
if {fork}:  # a process forked after the service started holds the feed's end too
    if os.fork() == 0:
        time.sleep(30)
        os._exit(0)
print(service.pid, flush=True)
while True:
    w.step([0])
    time.sleep(0.01)
"""


@pytest.mark.parametrize("fork", [False, True], ids=["alone", "with a forked child"])
def test_an_engine_killed_leaves_no_service_process(short_dir, fork):
    path = short_dir / "k.sock"
    code = ENGINE.format(helpers=str(Path(__file__).parent), path=str(path), fork=fork)
    cmd = [sys.executable, "-c", code]
    engine = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        pid = int(engine.stdout.readline())
        with connect(path, timeout=5) as client:
            assert client.ping()["service_pid"] == pid
        os.kill(engine.pid, signal.SIGKILL)
        engine.wait()
        assert _wait(lambda: _gone(pid), 3.0), "the service process outlived its engine"
    finally:
        os.killpg(engine.pid, signal.SIGKILL)  # the forked sleeper too
        engine.wait()


def test_a_crashed_service_process_is_logged_and_started_again(lru_run, short_dir, caplog):
    caplog.set_level(logging.WARNING, logger="tiercache.inspect.server")
    with InspectionService(lru_run.state, short_dir / "r.sock") as service:
        first = service.pid
        os.kill(first, signal.SIGKILL)
        for turn in range(20):  # the engine steps on meanwhile: nothing reaches it
            lru_run.step([30_000 + turn])
            time.sleep(0.01)
        assert _wait(lambda: service.pid not in (None, first), 3.0)
        assert service.restarts == 1 and service.running
        with connect(service.path, timeout=5) as client:  # the new one has the engine's state, all of it
            assert client.stats().version == lru_run.state.snapshot.version
            lru_run.state.publish(lru_run.manager.view(), force=True)  # and is fed from then on
            assert client.stats().stores == lru_run.state.counters["stores"] and client.decisions(limit=5)
            assert client.explain(h(0)).block_hash == h(0)
    assert f"inspection service process {first} exited (killed by signal 9); starting another" in caplog.text


def test_a_service_process_that_keeps_crashing_is_given_up(lru_run, short_dir, caplog, monkeypatch):
    caplog.set_level(logging.WARNING, logger="tiercache.inspect.server")
    monkeypatch.setattr(server_module, "MAX_RESTARTS", 1)
    service = InspectionService(lru_run.state, short_dir / "g.sock")
    try:
        first = service.pid
        os.kill(first, signal.SIGKILL)
        assert _wait(lambda: service.pid not in (None, first), 3.0)  # started again, once
        os.kill(service.pid, signal.SIGKILL)  # a second exit within the window: given up
        assert _wait(lambda: not service.path.exists(), 3.0)
        assert not service.running and service.pid is None
        lru_run.step([40_000])  # the engine publishes on, into nothing
        assert "not started again" in caplog.text and "the engine runs on without it" in caplog.text
        with pytest.raises(InspectError, match="does not exist"):
            connect(service.path)
    finally:
        service.close()


def test_a_point_read_the_engine_does_not_answer_is_an_error_reply(lru_run, short_dir, monkeypatch):
    def stuck(view, hashes):
        time.sleep(1.0)
        return {}

    monkeypatch.setattr(reads_module, "read_points", stuck)  # the engine's thread, in this process
    limits = ServiceLimits(request_timeout=0.3)
    late = r"did not answer its point read within 0.3s \(busy\); ask again"
    service = InspectionService(lru_run.state, short_dir / "p.sock", limits=limits)
    with service, connect(service.path, timeout=5) as client:
        start = time.monotonic()
        with pytest.raises(InspectError, match=late):
            client.explain(h(0))
        assert time.monotonic() - start < 1.0
        assert client.stats().stores > 0  # the rest is answered meanwhile: nothing else waits for it
