"""Shared fixtures: the bundled tiny model (2 layers, hidden 128, vocab 512)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rlfleet_core.models import resolve_model


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    return resolve_model("tiny")


@pytest.fixture(scope="session", params=["tiny", "tiny-nemotron-h"])
def tiny_models(request: pytest.FixtureRequest) -> Path:
    """Each bundled tiny model: dense Qwen2, and hybrid Mamba-2 / attention / MoE."""
    return resolve_model(request.param)
