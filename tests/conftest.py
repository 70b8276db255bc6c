"""Shared test setup: Triton kernels run under the interpreter on machines without CUDA; a real Redis
(`redis_server`, one per test module that asks for it) for the remote tier's tests."""

import os

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
