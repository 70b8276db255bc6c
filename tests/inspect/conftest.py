"""Fixtures of the inspection tests: a real TierManager driven into evictions, a service on a short path
(the plain helpers are in inspect_helpers.py)."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from inspect_helpers import Workload

from tiercache.inspect import InspectionService
from tiercache.inspect.limits import ServiceLimits


@pytest.fixture
def short_dir():
    path = Path(tempfile.mkdtemp(prefix="tci", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def lru_run():
    w = Workload("lru").run()
    yield w
    w.close()


@pytest.fixture
def graph_run():
    w = Workload("graph").run()
    yield w
    w.close()


@pytest.fixture
def served(lru_run, short_dir):
    limits = ServiceLimits(request_timeout=0.5)
    service = InspectionService(lru_run.state, short_dir / "s.sock", limits=limits)
    yield lru_run, service
    service.close()
