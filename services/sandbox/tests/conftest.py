"""Fixtures of the sandbox tests: a real service per test, checked for leftovers."""

from __future__ import annotations

import asyncio
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from sandbox_testlib import (
    Harness,
    make_config,
    start_harness,
    stop_harness,
    wait_no_sandbox_processes,
)

if shutil.which("bwrap") is None:  # pragma: no cover - CI installs it
    pytest.skip(
        "bubblewrap is not installed (apt-get install -y bubblewrap)", allow_module_level=True
    )


@pytest.fixture
async def sandbox() -> AsyncIterator[Harness]:
    """A started service (pool of 2); on teardown it must stop with no process left."""
    harness = await start_harness(make_config())
    try:
        yield harness
    finally:
        await stop_harness(harness)
    left = await asyncio.to_thread(wait_no_sandbox_processes)
    assert not left, f"sandbox processes outlived the service: {left}"
