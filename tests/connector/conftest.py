"""Fixtures of the connector tests (helpers.py has the engines and prompts)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")
sys.path.insert(0, str(Path(__file__).parent))
from helpers import ALL_PROMPTS, engine, generate, tokens
from tiny_llama import build_tiny_llama


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture(scope="session")
def baseline(tiny_model) -> dict[str, list[int]]:
    """Greedy tokens of every prompt the end-to-end tests use, from an engine without the connector."""
    with engine(tiny_model, None) as llm:
        return dict(zip(ALL_PROMPTS, tokens(generate(llm, ALL_PROMPTS)), strict=True))
