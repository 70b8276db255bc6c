"""Fixtures of the primary-mode tests: the tiny Llama (tests/connector/tiny_llama.py) and its reference."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "connector"))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    pytest.importorskip("vllm")
    from tiny_llama import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("tiny_llama"))
