"""Fixtures of the swe-runner tests: a Docker engine (skip without one, or fail when
RLFLEET_REQUIRE_DOCKER=1 as in CI), the bundled tiny instances' images (built once, cached
by content hash; the base image first when missing), and the service on loopback with small limits, checked for leftovers."""

from __future__ import annotations

import secrets
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from rlfleet_core.client import connect
from rlfleet_core.testing import running_service
from rlfleet_proto.v1 import swe_pb2_grpc
from rlfleet_swe.images import Built
from rlfleet_swe.service import SERVICE

sys.path.insert(0, str(Path(__file__).parent))

from support import require_docker, swe_instance_images  # tests/support.py (pythonpath)
from swe_testlib import SMALL, labelled


@pytest.fixture(scope="session")
def images() -> list[Built]:
    require_docker()
    return swe_instance_images()  # the base image too, on a machine without it


@pytest.fixture
def runner_label() -> str:
    return f"swe-test-{secrets.token_hex(4)}"


@pytest.fixture
async def stub(
    images: list[Built], runner_label: str
) -> AsyncIterator[swe_pb2_grpc.SweRunnerServiceStub]:
    async with (
        running_service(SERVICE, [*SMALL, f"eval.runner_label={runner_label}"]) as running,
        connect(f"127.0.0.1:{running.grpc_port}") as channel,
    ):
        yield swe_pb2_grpc.SweRunnerServiceStub(channel)
    assert labelled(runner_label) == [], "containers left behind"
