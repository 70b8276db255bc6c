"""Shared test setup: Triton kernels run under the interpreter on machines without CUDA; a real Redis
(`redis_server`, one per test module that asks for it) for the remote tier's tests; a line naming a test
that has run for HEARTBEAT_S seconds, and again every HEARTBEAT_S, so a quiet run shows where it is."""

import os
import threading
import time

import pytest
import torch
from redis_server import RedisServer, require_remote  # tests/ is on sys.path (pytest: rootdir conftest)

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    # Must be set before any @triton.jit function is created; kernel modules are imported by test modules.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    require_remote()
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


HEARTBEAT_S = float(os.environ.get("TIERCACHE_TEST_HEARTBEAT_S", "30"))  # 0: no heartbeat lines


def _terminal_fd(config) -> int | None:
    """The terminal's own stdout while pytest captures fd 1 (its saved duplicate), else fd 1; None where
    that pytest keeps it elsewhere (then no heartbeat)."""
    capman = config.pluginmanager.get_plugin("capturemanager")
    capturing = getattr(capman, "_global_capturing", None)
    if capturing is None:
        return 1
    return getattr(getattr(capturing, "out", None), "targetfd_save", None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    fd = _terminal_fd(item.config) if HEARTBEAT_S > 0 else None
    done = threading.Event()

    def beat() -> None:
        started, lead = time.monotonic(), "\n"  # the first line leaves the row of dots
        while not done.wait(HEARTBEAT_S):
            line = f"{lead}  … still running {item.nodeid} ({time.monotonic() - started:.0f} s)\n"
            os.write(fd, line.encode())
            lead = ""

    thread = None
    if fd is not None:
        thread = threading.Thread(target=beat, name="test-heartbeat", daemon=True)
        thread.start()
    try:
        yield
    finally:
        done.set()
        if thread is not None:
            thread.join()
