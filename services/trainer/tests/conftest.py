"""Shared fixtures: the bundled tiny model (2 layers, hidden 128, vocab 512)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rlfleet_core.models import resolve_model


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    return resolve_model("tiny")
