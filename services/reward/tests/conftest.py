"""Fixtures: a real reward service in a subprocess and the sandbox test double it calls for
the `code` environment. Helpers live in reward_support.py."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from rlfleet_proto.v1 import reward_pb2_grpc

TESTS_DIR = Path(__file__).resolve().parent
if str(TESTS_DIR) not in sys.path:  # reward_support, sandbox_double, reward_test_envs
    sys.path.insert(0, str(TESTS_DIR))

from reward_support import TEST_ENVS, RewardServer, running_reward_server  # noqa: E402
from sandbox_double import start_sandbox_double  # noqa: E402


@pytest.fixture(scope="session")
def sandbox_port() -> Iterator[int]:
    server, port, _ = start_sandbox_double()
    yield port
    server.stop(0)


@pytest.fixture(scope="session")
def reward_server(
    tmp_path_factory: pytest.TempPathFactory, sandbox_port: int
) -> Iterator[RewardServer]:
    with running_reward_server(
        tmp_path_factory.mktemp("reward"),
        [
            "pool.workers=2",
            "pool.kill_grace_s=0.5",
            f"sandbox.target=127.0.0.1:{sandbox_port}",
            f"extra_environments={TEST_ENVS}",
        ],
    ) as server:
        yield server


@pytest.fixture(scope="session")
def channel(reward_server: RewardServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(reward_server.grpc_target) as ch:
        yield ch


@pytest.fixture(scope="session")
def stub(channel: grpc.Channel) -> reward_pb2_grpc.RewardServiceStub:
    return reward_pb2_grpc.RewardServiceStub(channel)
