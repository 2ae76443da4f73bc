"""Fixtures of the swe-runner tests: a Docker engine (skip without one, or fail when
RLFLEET_REQUIRE_DOCKER=1 as in CI), the bundled tiny instances' images (built once, cached
by content hash; the base image first when missing), and the service on loopback with small limits, checked for leftovers."""

from __future__ import annotations

import secrets
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from rlfleet_proto.v1 import swe_pb2_grpc
from rlfleet_swe.images import Built

sys.path.insert(0, str(Path(__file__).parent))

from support import require_docker, swe_instance_images  # tests/support.py (pythonpath)
from swe_testlib import runner_overrides, swe_stub


@pytest.fixture(scope="session")
def images() -> list[Built]:
    require_docker()
    return swe_instance_images()  # the base image too, on a machine without it


@pytest.fixture
def runner_label() -> str:
    return f"swe-test-{secrets.token_hex(4)}"


@pytest.fixture
def service_overrides() -> list[str]:
    """Settings of the `stub` fixture's service beside `runner_overrides` (a test module
    that needs others overrides this fixture)."""
    return []


@pytest.fixture
async def stub(
    images: list[Built], runner_label: str, service_overrides: list[str]
) -> AsyncIterator[swe_pb2_grpc.SweRunnerServiceStub]:
    async with swe_stub(runner_overrides(runner_label, *service_overrides), runner_label) as stub:
        yield stub
