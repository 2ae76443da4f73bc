"""Every service says what build it is: BuildService.GetBuildInfo (registered by the shared
bootstrap, listed by reflection), HTTP GET /version, and `remote_build` as the CLI asks.
A real service on loopback; the mixed-version side is tests/test_upgrades.py."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from grpc import aio
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from rlfleet_core import versions
from rlfleet_core.client import connect
from rlfleet_core.server import (
    BaseService,
    RunningServer,
    ServiceConfig,
    ServiceDefinition,
    start_service,
)
from rlfleet_proto.v1 import common_pb2, common_pb2_grpc

HERE = Path(__file__).resolve().parent


class Plain(BaseService):
    """A service with nothing of its own: what it answers is the bootstrap's."""

    def add_to_server(self, server: aio.Server) -> None:
        return None


DEFINITION = ServiceDefinition(
    name="plain",
    package="rlfleet-core",
    grpc_services=(),
    config_model=ServiceConfig,
    factory=lambda config: Plain(),
)


def head_commit() -> str:
    found = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True, text=True, timeout=10
    )
    return found.stdout.strip() if found.returncode == 0 else ""


@pytest.fixture
def fresh_commit() -> Iterator[None]:
    versions.git_commit.cache_clear()
    yield
    versions.git_commit.cache_clear()


@pytest.fixture
async def running(fresh_commit: None) -> AsyncIterator[RunningServer]:
    config = ServiceConfig.model_validate({"server": {"port": 0, "http_port": 0}})
    srv = await start_service(DEFINITION, config)
    yield srv
    srv.stop_event.set()
    await srv.done


async def test_build_service_http_version_and_reflection(running: RunningServer) -> None:
    target = f"127.0.0.1:{running.grpc_port}"
    async with connect(target) as channel:
        info = await common_pb2_grpc.BuildServiceStub(channel).GetBuildInfo(
            common_pb2.GetBuildInfoRequest()
        )
        reflected = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        )
        names = [s.name async for r in reflected for s in r.list_services_response.service]
    expected = {
        "service": "plain",
        "package": "rlfleet-core",
        "version": versions.package_version("rlfleet-core"),
        "proto_version": versions.package_version("rlfleet-proto"),
        "git_commit": head_commit(),  # "" when the tests run outside a git checkout
    }
    assert expected["version"][0].isdigit() and expected["proto_version"][0].isdigit()
    assert {f.name: getattr(info, f.name) for f in info.DESCRIPTOR.fields} == expected
    assert versions.BUILD_SERVICE == "rlfleet.v1.BuildService" and versions.BUILD_SERVICE in names
    async with httpx.AsyncClient(timeout=5) as http:
        reply = await http.get(f"http://127.0.0.1:{running.http_port}/version")
    assert (reply.status_code, reply.json()) == (200, expected)
    # what `rlfleet version <target>` asks (a blocking client: off the server's loop)
    assert await asyncio.to_thread(versions.remote_build, target, 5.0) == info


def test_commit_from_the_environment_wins(
    fresh_commit: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(versions.GIT_COMMIT_ENV, "  0123abcd\n")
    assert versions.git_commit() == "0123abcd"
    assert versions.build_info("x", "rlfleet-core").git_commit == "0123abcd"


def test_commit_is_empty_outside_a_checkout(
    fresh_commit: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A copy of the code without .git (a wheel, `git archive`) reports "" rather than a
    commit of whatever repository it happens to sit in (a venv inside a user's project)."""
    monkeypatch.delenv(versions.GIT_COMMIT_ENV, raising=False)
    monkeypatch.setattr(versions, "__file__", str(tmp_path / "site" / "versions.py"))
    (tmp_path / "site").mkdir()
    assert versions.git_commit() == ""
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], cwd=tmp_path, check=True, timeout=30)
    subprocess.run(
        [*git, "commit", "-q", "--allow-empty", "-m", "x"], cwd=tmp_path, check=True, timeout=30
    )
    versions.git_commit.cache_clear()
    assert versions.git_commit() == ""
