"""Shared-token authentication in the bootstrap: a real loopback gRPC + HTTP server with a
test servicer, real clients (`rlfleet_core.client`, httpx)."""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import httpx
import pytest
from fastapi import FastAPI
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from rlfleet_core.auth import (
    TOKEN_ENV,
    TOKEN_FILE_ENV,
    auth_headers,
    is_loopback,
    token_from_env,
    write_token_file,
)
from rlfleet_core.client import connect, connect_sync
from rlfleet_core.errors import StartupError
from rlfleet_core.metrics import REGISTRY
from rlfleet_core.server import (
    BaseService,
    RunningServer,
    ServerConfig,
    ServiceConfig,
    ServiceDefinition,
    start_service,
)
from rlfleet_core.testing import add_bytes_methods, count_up_to

SERVICE_NAME = "rlfleet.test.Guarded"
TOKEN = "tok-" + "x" * 40


class GuardedService(BaseService):
    def __init__(self, config: ServiceConfig) -> None:
        pass

    def add_to_server(self, server: aio.Server) -> None:
        async def echo(request: bytes, context: aio.ServicerContext) -> bytes:
            return request

        async def trickle(request: bytes, context: aio.ServicerContext) -> AsyncIterator[bytes]:
            for _ in range(100):
                await asyncio.sleep(0.1)
                yield b"."

        add_bytes_methods(
            server, SERVICE_NAME, {"Echo": echo}, {"Count": count_up_to, "Trickle": trickle}
        )

    def http_routes(self, app: FastAPI) -> None:
        @app.get("/hello")
        async def hello() -> dict[str, str]:
            return {"hello": "world"}


DEFINITION = ServiceDefinition(
    name="guarded",
    package="rlfleet-core",
    grpc_services=(SERVICE_NAME,),
    config_model=ServiceConfig,
    factory=GuardedService,
)


def config(**server: object) -> ServiceConfig:
    return ServiceConfig(server=ServerConfig(**{"http_port": 0, **server}))  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def no_token_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.delenv(TOKEN_FILE_ENV, raising=False)


@pytest.fixture
def token_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "auth_token"
    write_token_file(path, TOKEN)
    monkeypatch.setenv(TOKEN_FILE_ENV, str(path))
    return path


@pytest.fixture
async def guarded(token_file: Path) -> AsyncIterator[RunningServer]:
    srv = await start_service(DEFINITION, config())
    yield srv
    srv.stop_event.set()
    await srv.done


def raw_channel(port: int) -> aio.Channel:
    """A plain grpc channel: sends exactly the metadata given, nothing from the env."""
    return aio.insecure_channel(f"127.0.0.1:{port}")


def metadata(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


async def test_grpc_refuses_calls_without_the_right_token(guarded: RunningServer) -> None:
    async with raw_channel(guarded.grpc_port) as channel:
        echo = channel.unary_unary(f"/{SERVICE_NAME}/Echo")
        count = channel.unary_stream(f"/{SERVICE_NAME}/Count")
        cases = [
            lambda: echo(b"hi", timeout=5),
            lambda: echo(b"hi", timeout=5, metadata=metadata("wrong-" + "y" * 30)),
            lambda: echo(b"hi", timeout=5, metadata=(("authorization", TOKEN),)),  # no scheme
            lambda: echo(b"hi", timeout=5, metadata=(("authorization", f"Basic {TOKEN}"),)),
        ]
        for make in cases:
            with pytest.raises(aio.AioRpcError) as err:
                await make()
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert TOKEN_FILE_ENV in (err.value.details() or "")
            assert TOKEN not in (err.value.details() or "")
        with pytest.raises(aio.AioRpcError) as err:
            _ = [x async for x in count(b"3", timeout=5)]
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # Reflection describes the service: closed too.
        refl = reflection_pb2_grpc.ServerReflectionStub(channel)
        with pytest.raises(aio.AioRpcError) as err:
            _ = [
                r
                async for r in refl.ServerReflectionInfo(
                    iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
                )
            ]
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # Health stays open, for orchestrators.
        health = health_pb2_grpc.HealthStub(channel)
        reply = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        # The right token, sent by hand, passes.
        assert await echo(b"hi", timeout=5, metadata=metadata(TOKEN)) == b"hi"
    refused = REGISTRY.get_sample_value(
        "rlfleet_grpc_requests_total",
        {"service": "guarded", "method": f"/{SERVICE_NAME}/Echo", "code": "UNAUTHENTICATED"},
    )
    assert refused is not None and refused >= 4


async def test_rlfleet_clients_send_the_token_from_the_env(guarded: RunningServer) -> None:
    target = f"127.0.0.1:{guarded.grpc_port}"
    async with connect(target) as channel:
        assert await channel.unary_unary(f"/{SERVICE_NAME}/Echo")(b"a") == b"a"
        items = [x async for x in channel.unary_stream(f"/{SERVICE_NAME}/Count")(b"2")]
        assert items == [b"0", b"1"]
        # A caller's own metadata and timeout survive next to the token.
        echo = channel.unary_unary(f"/{SERVICE_NAME}/Echo")
        assert await echo(b"b", timeout=5, metadata=(("x-request-id", "r1"),)) == b"b"

    def blocking_call() -> bytes:
        with connect_sync(target) as channel:
            return channel.unary_unary(f"/{SERVICE_NAME}/Echo")(b"c", timeout=5)  # type: ignore[no-any-return]

    # In a thread: the server runs on this test's event loop.
    assert await asyncio.to_thread(blocking_call) == b"c"
    async with connect(target, auth_token="wrong-" + "z" * 30) as channel:
        with pytest.raises(aio.AioRpcError) as err:
            await channel.unary_unary(f"/{SERVICE_NAME}/Echo")(b"d")
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_async_channel_gives_streams_the_default_deadline_too(
    guarded: RunningServer,
) -> None:
    """An aio channel files an interceptor under the first call shape it implements: the
    default deadline (and the token) used to reach unary-unary calls only."""
    async with connect(f"127.0.0.1:{guarded.grpc_port}", default_timeout_s=0.5) as channel:
        with pytest.raises(aio.AioRpcError) as err:
            _ = [x async for x in channel.unary_stream(f"/{SERVICE_NAME}/Trickle")(b"")]
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_http_refuses_requests_without_the_right_token(guarded: RunningServer) -> None:
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{guarded.http_port}", timeout=5
    ) as http:
        health = await http.get("/healthz")
        assert (health.status_code, health.text) == (200, "SERVING")
        for path in ("/hello", "/metrics", "/openapi.json", "/no-such-route"):
            for headers in ({}, {"authorization": "Bearer wrong-" + "q" * 30}):
                reply = await http.get(path, headers=headers)
                assert reply.status_code == 401, (path, headers)
                assert reply.headers["www-authenticate"].startswith("Bearer")
                assert TOKEN_FILE_ENV in reply.json()["detail"]
                assert TOKEN not in reply.text
        reply = await http.get("/hello", headers=auth_headers())
        assert reply.json() == {"hello": "world"}
        metrics = await http.get("/metrics", headers=auth_headers())
        assert "rlfleet_grpc_requests_total" in metrics.text


async def test_refuses_to_start_beyond_loopback_without_a_token() -> None:
    for host in ("0.0.0.0", "::", "example.org"):
        with pytest.raises(StartupError) as err:
            await start_service(DEFINITION, config(host=host, port=0))
        message = str(err.value)
        assert f"server.host={host}" in message
        assert TOKEN_FILE_ENV in message and "server.auth=off" in message
    with pytest.raises(StartupError, match=r"server\.auth=token"):
        await start_service(DEFINITION, config(auth="token"))


async def test_auth_off_is_an_explicit_loud_opt_out(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="rlfleet_core.auth"):
        srv = await start_service(DEFINITION, config(host="0.0.0.0", auth="off"))
    try:
        assert "AUTHENTICATION IS OFF" in caplog.text
        async with raw_channel(srv.grpc_port) as channel:
            assert await channel.unary_unary(f"/{SERVICE_NAME}/Echo")(b"x", timeout=5) == b"x"
    finally:
        srv.stop_event.set()
        await srv.done


async def test_loopback_without_a_token_stays_open() -> None:
    srv = await start_service(DEFINITION, config())
    try:
        async with raw_channel(srv.grpc_port) as channel:
            assert await channel.unary_unary(f"/{SERVICE_NAME}/Echo")(b"x", timeout=5) == b"x"
    finally:
        srv.stop_event.set()
        await srv.done


def test_token_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert token_from_env() is None
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    assert token_from_env() == TOKEN
    path = tmp_path / "sub" / "token"
    written = write_token_file(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert len(written) >= 40
    monkeypatch.setenv(TOKEN_FILE_ENV, str(path))
    assert token_from_env() == written  # the file wins over the variable
    monkeypatch.setenv(TOKEN_FILE_ENV, str(tmp_path / "missing"))
    with pytest.raises(ValueError, match=f"{TOKEN_FILE_ENV}=.*cannot read"):
        token_from_env()
    monkeypatch.delenv(TOKEN_FILE_ENV)
    monkeypatch.setenv(TOKEN_ENV, "short")
    with pytest.raises(ValueError, match="at least 16"):
        token_from_env()


async def test_unreadable_token_file_is_a_startup_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_FILE_ENV, str(tmp_path / "missing"))
    with pytest.raises(StartupError, match="cannot read the token file"):
        await start_service(DEFINITION, config())


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("node17", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


# --- mTLS ---------------------------------------------------------------------------------


def _make_pki(folder: Path) -> dict[str, Path]:
    """A throwaway CA, a server certificate for 127.0.0.1 and a client certificate."""
    import shutil
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", "1", "-subj", "/CN=rlfleet-test-ca")  # fmt: skip
    for name, ext in (
        ("server", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth"),
        ("client", "extendedKeyUsage=clientAuth"),
    ):
        (folder / f"{name}.ext").write_text(ext + "\n")
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
            f"{name}.csr", "-subj", f"/CN=rlfleet-{name}")  # fmt: skip
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "1", "-out", f"{name}.pem", "-extfile", f"{name}.ext")  # fmt: skip
    return {
        n: folder / n for n in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")
    }


async def test_mtls_beyond_loopback_without_a_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Client certificates required: the service may bind beyond loopback with no token;
    plain-text clients and TLS clients without a certificate are refused."""
    from rlfleet_core.auth import TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV

    pki = _make_pki(tmp_path)
    srv = await start_service(
        DEFINITION,
        config(
            host="0.0.0.0",
            tls_cert_file=str(pki["server.pem"]),
            tls_key_file=str(pki["server.key"]),
            tls_client_ca_file=str(pki["ca.pem"]),
        ),
    )
    target = f"127.0.0.1:{srv.grpc_port}"
    try:
        async with raw_channel(srv.grpc_port) as channel:  # plain text
            with pytest.raises(aio.AioRpcError) as err:
                await channel.unary_unary(f"/{SERVICE_NAME}/Echo")(b"x", timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        monkeypatch.setenv(TLS_CA_ENV, str(pki["ca.pem"]))
        async with connect(target, retry=None) as channel:  # TLS, no client certificate
            with pytest.raises(aio.AioRpcError) as err:
                await channel.unary_unary(f"/{SERVICE_NAME}/Echo")(b"x", timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        monkeypatch.setenv(TLS_CERT_ENV, str(pki["client.pem"]))
        monkeypatch.setenv(TLS_KEY_ENV, str(pki["client.key"]))
        async with connect(target) as channel:
            assert await channel.unary_unary(f"/{SERVICE_NAME}/Echo")(b"ok", timeout=5) == b"ok"
        with_cert = ssl.create_default_context(cafile=str(pki["ca.pem"]))
        with_cert.load_cert_chain(str(pki["client.pem"]), str(pki["client.key"]))
        base = f"https://127.0.0.1:{srv.http_port}"
        async with httpx.AsyncClient(base_url=base, verify=with_cert, timeout=5) as http:
            assert (await http.get("/hello")).json() == {"hello": "world"}
        without_cert = ssl.create_default_context(cafile=str(pki["ca.pem"]))
        async with httpx.AsyncClient(base_url=base, verify=without_cert, timeout=5) as http:
            with pytest.raises(httpx.HTTPError):
                await http.get("/hello")
    finally:
        srv.stop_event.set()
        await srv.done


def test_tls_settings_go_together() -> None:
    with pytest.raises(ValueError, match="tls_key_file go together"):
        ServerConfig(tls_cert_file="a.pem")
    with pytest.raises(ValueError, match="tls_client_ca_file needs"):
        ServerConfig(tls_client_ca_file="ca.pem")
