"""Test helpers: a real sandbox service on loopback (gRPC + HTTP, real bubblewrap) and
the check that nothing of it outlives it. (A module of its own because conftest.py is
not importable under --import-mode=importlib; conftest puts this folder on sys.path.)"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from grpc import aio
from rlfleet_core.server import RunningServer, ServerConfig, start_service
from rlfleet_proto.v1 import sandbox_pb2, sandbox_pb2_grpc
from rlfleet_sandbox.config import (
    IsolationConfig,
    PoolConfig,
    SandboxServiceConfig,
    SessionsConfig,
)
from rlfleet_sandbox.service import SERVICE
from rlfleet_sandbox.sessions import CLIENT_KEY_HEADER

TEST_UID = 64987 + int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
"""A host uid nothing else on this machine uses, so every process running under it is a
sandbox of these tests (see `sandbox_processes`). One per pytest-xdist worker: a worker
must not count the other worker's sandboxes as its own leftovers."""
TMPFS_BYTES = 8 << 20
ROOT_ONLY = pytest.mark.skipif(
    os.geteuid() != 0,
    reason="checks the drop from root to TEST_UID (CI runs as root); as another user the "
    "sandboxes run under that user's uid",
)


def new_client_key() -> str:
    """A fresh random client key, as a caller's client makes one
    (rlfleet_contracts.sandbox_client derives one per session from its own)."""
    return secrets.token_urlsafe(32)


class ClientKeyInterceptor(aio.UnaryUnaryClientInterceptor):
    """Adds `x-rlfleet-client-key` to every unary call of a channel."""

    def __init__(self, client_key: str) -> None:
        self._entry = (CLIENT_KEY_HEADER, client_key)

    async def intercept_unary_unary(
        self, continuation: Callable[..., Any], client_call_details: Any, request: Any
    ) -> Any:
        metadata = aio.Metadata(*(client_call_details.metadata or ()), self._entry)
        return await continuation(client_call_details._replace(metadata=metadata), request)


def attempted(result: sandbox_pb2.ExecuteResult) -> None:
    """A hostile program ran up to its attack: it prints ATTEMPT before trying, so that a
    program that died of a typo first does not pass for a contained attack."""
    assert "ATTEMPT" in result.stdout, (result.stdout, result.stderr)


def sandbox_processes(uid: int = TEST_UID) -> list[tuple[int, str]]:
    """(pid, cmdline) of every host process whose real uid is `uid`, zombies included.
    (The real uid from /proc/<pid>/status: /proc/<pid> itself belongs to root for
    non-dumpable processes such as bwrap and the runner.)"""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as fh:
                uids = next(line for line in fh if line.startswith("Uid:")).split()
            if int(uids[1]) != uid:
                continue
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ")[:80].decode(errors="replace")
        except (OSError, StopIteration):
            continue
        found.append((int(name), cmd))
    return found


def wait_no_sandbox_processes(timeout_s: float = 3.0) -> list[tuple[int, str]]:
    deadline = time.monotonic() + timeout_s
    while (left := sandbox_processes()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def make_config(**sections: Any) -> SandboxServiceConfig:
    base: dict[str, Any] = {
        "server": ServerConfig(port=0, http_port=0, default_timeout_s=30.0),
        "isolation": IsolationConfig(
            sandbox_uid=TEST_UID, sandbox_gid=TEST_UID, tmpfs_bytes=TMPFS_BYTES
        ),
        "pool": PoolConfig(size=2, kill_grace_s=1.0),
        "sessions": SessionsConfig(max_sessions=3, reap_interval_s=0.1),
    }
    base.update(sections)
    return SandboxServiceConfig(**base)


@dataclass
class Harness:
    running: RunningServer
    stub: sandbox_pb2_grpc.SandboxServiceStub
    http: httpx.AsyncClient
    config: SandboxServiceConfig
    client_key: str
    """The key every call of `stub` and `http` carries (one client)."""

    async def run(
        self,
        code: str,
        language: str = "python",
        stdin: str = "",
        files: tuple[sandbox_pb2.File, ...] = (),
        session_id: str = "",
        **limits: Any,
    ) -> sandbox_pb2.ExecuteResult:
        lang = sandbox_pb2.LANGUAGE_BASH if language == "bash" else sandbox_pb2.LANGUAGE_PYTHON
        request = sandbox_pb2.ExecuteRequest(
            language=lang,
            code=code,
            stdin=stdin,
            files=files,
            limits=sandbox_pb2.Limits(**limits),
            session_id=session_id,
        )
        result: sandbox_pb2.ExecuteResult = await self.stub.Execute(request, timeout=60)
        return result

    async def attack(self, code: str, **run: Any) -> sandbox_pb2.ExecuteResult:
        """`run` a hostile program, checking that it got as far as its attack."""
        result = await self.run(code, **run)
        attempted(result)
        return result

    async def assert_healthy(self) -> None:
        """The service still runs programs and says it is healthy."""
        result = await self.run("print(6 * 7)")
        assert result.status == sandbox_pb2.EXEC_STATUS_OK, result
        assert result.stdout == "42\n"
        response = await self.http.get("/healthz")
        assert response.status_code == 200, response.text


def client_stub(running: RunningServer, key: str | None) -> sandbox_pb2_grpc.SandboxServiceStub:
    """A stub whose calls carry `key` (none if None)."""
    interceptors = [ClientKeyInterceptor(key)] if key else []
    channel = aio.insecure_channel(f"127.0.0.1:{running.grpc_port}", interceptors=interceptors)
    return sandbox_pb2_grpc.SandboxServiceStub(channel)


def client_http(running: RunningServer, key: str | None) -> httpx.AsyncClient:
    headers = {CLIENT_KEY_HEADER: key} if key else {}
    return httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{running.http_port}", timeout=60, headers=headers
    )


async def start_harness(config: SandboxServiceConfig) -> Harness:
    running = await start_service(SERVICE, config)
    key = new_client_key()
    return Harness(running, client_stub(running, key), client_http(running, key), config, key)


async def stop_harness(harness: Harness) -> None:
    await harness.http.aclose()
    harness.running.stop_event.set()
    await asyncio.wait_for(harness.running.done, 30)


@asynccontextmanager
async def serving(config: SandboxServiceConfig) -> AsyncIterator[Harness]:
    """A service of the test's own, with `config` (the `sandbox` fixture's is
    `make_config()`); stopped on exit."""
    harness = await start_harness(config)
    try:
        yield harness
    finally:
        await stop_harness(harness)
