"""The shared bootstrap against a real loopback gRPC server with a test servicer."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import httpx
import pytest
from fastapi import FastAPI
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from rlfleet_core.client import RetryPolicy, connect
from rlfleet_core.errors import InvalidArgument, ResourceExhausted
from rlfleet_core.metrics import REGISTRY
from rlfleet_core.ports import pick_free_port, read_port_file
from rlfleet_core.server import (
    BaseService,
    RunningServer,
    ServerConfig,
    ServiceConfig,
    ServiceDefinition,
    start_service,
)
from rlfleet_core.testing import add_bytes_methods, count_up_to

SERVICE_NAME = "rlfleet.test.Echo"


class EchoService(BaseService):
    """Raw-bytes methods that exercise every path of the interceptor."""

    def __init__(self, config: ServiceConfig) -> None:
        self.started = asyncio.Event()
        self.release_start = asyncio.Event()
        self.release_start.set()
        self.flaky_calls = 0
        self.stopped = False

    def add_to_server(self, server: aio.Server) -> None:
        async def echo(request: bytes, context: aio.ServicerContext) -> bytes:
            return request

        async def invalid(request: bytes, context: aio.ServicerContext) -> bytes:
            raise InvalidArgument("payload", "must not be empty")

        async def busy(request: bytes, context: aio.ServicerContext) -> bytes:
            raise ResourceExhausted("queue full (64 waiting); retry later")

        async def boom(request: bytes, context: aio.ServicerContext) -> bytes:
            raise RuntimeError("kaput")

        async def slow(request: bytes, context: aio.ServicerContext) -> bytes:
            await asyncio.sleep(float(request.decode()))
            return b"done"

        async def flaky(request: bytes, context: aio.ServicerContext) -> bytes:
            self.flaky_calls += 1
            if self.flaky_calls <= int(request.decode()):
                await context.abort(grpc.StatusCode.UNAVAILABLE, "warming up")
            return str(self.flaky_calls).encode()

        async def count_then_fail(
            request: bytes, context: aio.ServicerContext
        ) -> AsyncIterator[bytes]:
            yield b"0"
            raise InvalidArgument("n", "too large")

        unary = {
            "Echo": echo,
            "Invalid": invalid,
            "Busy": busy,
            "Boom": boom,
            "Slow": slow,
            "Flaky": flaky,
        }
        streams = {"Count": count_up_to, "CountThenFail": count_then_fail}
        add_bytes_methods(server, SERVICE_NAME, unary, streams)

    def http_routes(self, app: FastAPI) -> None:
        @app.get("/hello")
        async def hello() -> dict[str, str]:
            return {"hello": "world"}

    async def start(self) -> None:
        await self.release_start.wait()
        self.started.set()

    async def stop(self) -> None:
        self.stopped = True


instances: list[EchoService] = []


def make_service(config: ServiceConfig) -> EchoService:
    instances.append(EchoService(config))
    return instances[-1]


DEFINITION = ServiceDefinition(
    name="echo",
    package="rlfleet-core",
    grpc_services=(SERVICE_NAME,),
    config_model=ServiceConfig,
    factory=make_service,
)


def config(**server: object) -> ServiceConfig:
    return ServiceConfig(server=ServerConfig(**{"default_timeout_s": 2.0, **server}))  # type: ignore[arg-type]


@pytest.fixture
async def running() -> AsyncIterator[RunningServer]:
    srv = await start_service(DEFINITION, config(http_port=0, max_message_bytes=1 << 20))
    yield srv
    srv.stop_event.set()
    await srv.done


def call(channel: aio.Channel, method: str, payload: bytes, **kw: object) -> aio.UnaryUnaryCall:
    return channel.unary_unary(f"/{SERVICE_NAME}/{method}")(payload, **kw)


async def test_health_reflection_and_echo(running: RunningServer) -> None:
    target = f"127.0.0.1:{running.grpc_port}"
    async with connect(target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for name in ("", SERVICE_NAME):
            reply = await health.Check(health_pb2.HealthCheckRequest(service=name))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        refl = reflection_pb2_grpc.ServerReflectionStub(channel)
        responses = refl.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        )
        names = {s.name async for r in responses for s in r.list_services_response.service}
        assert {SERVICE_NAME, "grpc.health.v1.Health"} <= names
        assert await call(channel, "Echo", b"hi") == b"hi"


async def test_errors_map_to_status_codes_with_messages(running: RunningServer) -> None:
    async with connect(f"127.0.0.1:{running.grpc_port}") as channel:
        cases = [
            ("Invalid", grpc.StatusCode.INVALID_ARGUMENT, "payload: must not be empty"),
            ("Busy", grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full"),
            ("Boom", grpc.StatusCode.INTERNAL, "RuntimeError: kaput"),
        ]
        for method, code, text in cases:
            with pytest.raises(aio.AioRpcError) as info:
                await call(channel, method, b"x")
            assert info.value.code() == code
            assert text in (info.value.details() or "")
        stream = channel.unary_stream(f"/{SERVICE_NAME}/CountThenFail")(b"")
        got = []
        with pytest.raises(aio.AioRpcError) as info:
            async for item in stream:
                got.append(item)
        assert got == [b"0"]
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_server_applies_its_default_deadline(running: RunningServer) -> None:
    # A bare channel sets no deadline: the server's 2 s default ends the call.
    async with aio.insecure_channel(f"127.0.0.1:{running.grpc_port}") as channel:
        with pytest.raises(aio.AioRpcError) as info:
            await call(channel, "Slow", b"10")
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_client_deadline_is_honoured(running: RunningServer) -> None:
    async with connect(f"127.0.0.1:{running.grpc_port}", default_timeout_s=0.3) as channel:
        with pytest.raises(aio.AioRpcError) as info:
            await call(channel, "Slow", b"1.5")
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert await call(channel, "Slow", b"0.01", timeout=5) == b"done"


async def test_client_retries_unavailable_with_backoff(running: RunningServer) -> None:
    service = instances[-1]
    async with connect(
        f"127.0.0.1:{running.grpc_port}", retry=RetryPolicy(max_attempts=4, initial_backoff_s=0.01)
    ) as channel:
        assert await call(channel, "Flaky", b"2") == b"3"  # two failures, third try succeeds
    service.flaky_calls = 0
    async with connect(
        f"127.0.0.1:{running.grpc_port}", retry=RetryPolicy(max_attempts=2, initial_backoff_s=0.01)
    ) as channel:
        with pytest.raises(aio.AioRpcError) as info:
            await call(channel, "Flaky", b"5")
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert service.flaky_calls == 2  # bounded: exactly max_attempts tries


async def test_invalid_argument_is_not_retried(running: RunningServer) -> None:
    before = (
        REGISTRY.get_sample_value(
            "rlfleet_grpc_requests_total",
            {"service": "echo", "method": f"/{SERVICE_NAME}/Invalid", "code": "INVALID_ARGUMENT"},
        )
        or 0
    )
    async with connect(f"127.0.0.1:{running.grpc_port}") as channel:
        with pytest.raises(aio.AioRpcError):
            await call(channel, "Invalid", b"")
    after = REGISTRY.get_sample_value(
        "rlfleet_grpc_requests_total",
        {"service": "echo", "method": f"/{SERVICE_NAME}/Invalid", "code": "INVALID_ARGUMENT"},
    )
    assert after == before + 1


async def test_message_size_limit(running: RunningServer) -> None:
    async with connect(f"127.0.0.1:{running.grpc_port}", max_message_bytes=8 << 20) as channel:
        with pytest.raises(aio.AioRpcError) as info:
            await call(channel, "Echo", b"x" * (2 << 20))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_streaming_and_metrics(running: RunningServer) -> None:
    async with connect(f"127.0.0.1:{running.grpc_port}") as channel:
        items = [x async for x in channel.unary_stream(f"/{SERVICE_NAME}/Count")(b"5")]
        assert items == [b"0", b"1", b"2", b"3", b"4"]
    value = REGISTRY.get_sample_value(
        "rlfleet_grpc_requests_total",
        {"service": "echo", "method": f"/{SERVICE_NAME}/Count", "code": "OK"},
    )
    assert value is not None and value >= 1


async def test_http_face_health_metrics_and_service_routes(running: RunningServer) -> None:
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{running.http_port}", timeout=5
    ) as http:
        health = await http.get("/healthz")
        assert (health.status_code, health.text) == (200, "SERVING")
        assert (await http.get("/hello")).json() == {"hello": "world"}
        metrics = (await http.get("/metrics")).text
        assert "rlfleet_grpc_request_seconds_bucket" in metrics


async def test_not_serving_until_started_then_graceful_stop(tmp_path: Path) -> None:
    instances.clear()
    port_file = tmp_path / "ports.json"
    start = asyncio.create_task(
        start_service(DEFINITION, config(port=0, http_port=0, grace_s=5, port_file=str(port_file)))
    )
    while not instances:
        await asyncio.sleep(0.01)
    service = instances[-1]
    service.release_start.clear()
    # The ports are reported once bound, before the (still blocked) heavy start-up.
    while (ports := read_port_file(port_file)) is None:
        await asyncio.sleep(0.01)
    assert ports.pid == os.getpid() and ports.http is not None
    port = ports.grpc
    target = f"127.0.0.1:{port}"
    async with connect(target, retry=None) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        # start() is blocked: the port answers, but not SERVING yet.
        if not service.started.is_set():
            reply = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
            assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
        service.release_start.set()
        running = await asyncio.wait_for(start, 10)
        assert (running.grpc_port, running.http_port) == (ports.grpc, ports.http)
        reply = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING

        in_flight = asyncio.ensure_future(call(channel, "Slow", b"0.5", timeout=5))
        await asyncio.sleep(0.1)
        running.stop_event.set()
        assert await in_flight == b"done"  # a call in flight finishes within the grace period
        await asyncio.wait_for(running.done, 10)
        assert service.stopped
    async with connect(target, retry=None) as channel:
        with pytest.raises(aio.AioRpcError) as info:
            await call(channel, "Echo", b"x", timeout=1)
        assert info.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


async def test_port_in_use_is_a_clear_error(running: RunningServer) -> None:
    with pytest.raises(OSError, match=f"cannot bind gRPC to 127.0.0.1:{running.grpc_port}"):
        await start_service(DEFINITION, config(port=running.grpc_port))
    with pytest.raises(OSError, match=f"cannot bind HTTP to 127.0.0.1:{running.http_port}"):
        await start_service(DEFINITION, config(http_port=running.http_port))


class _FailingService(EchoService):
    async def start(self) -> None:
        from rlfleet_core.errors import StartupError

        raise StartupError("bwrap not found: apt-get install bubblewrap")


async def test_failed_start_releases_ports_and_reports() -> None:
    from rlfleet_core.errors import StartupError

    definition = ServiceDefinition(
        name="failing",
        package="rlfleet-core",
        grpc_services=(SERVICE_NAME,),
        config_model=ServiceConfig,
        factory=_FailingService,
    )
    # Numbers needed in advance: the test reuses them after the failed start.
    port, http_port = pick_free_port(), pick_free_port()
    with pytest.raises(StartupError, match="apt-get install bubblewrap"):
        await start_service(definition, config(port=port, http_port=http_port))
    # Both ports are free again: a fixed service can start on them at once.
    running = await start_service(DEFINITION, config(port=port, http_port=http_port))
    running.stop_event.set()
    await running.done


async def test_http_listener_has_tcp_nodelay(running: RunningServer) -> None:
    import socket as _socket

    # Connections accepted from the listener inherit TCP_NODELAY: no 40 ms Nagle stalls.
    reader, writer = await asyncio.open_connection("127.0.0.1", running.http_port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert b"200 OK" in await asyncio.wait_for(reader.read(1024), 5)
    writer.close()
    assert running.http_listener is not None
    assert running.http_listener.getsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY) == 1


class _FlippingService(EchoService):
    """Says it cannot serve while `broken` is set (a model a failed load left broken)."""

    broken: str | None = None

    def not_serving_reason(self) -> str | None:
        return self.broken


async def _health_until(
    http: httpx.AsyncClient, health: health_pb2_grpc.HealthStub, want: int, text: str
) -> None:
    """Poll (bounded) until gRPC health for "" and the service's name say `want` and
    /healthz answers `text`."""
    code = 200 if want == health_pb2.HealthCheckResponse.SERVING else 503
    seen: list[object] = []
    for _ in range(100):
        statuses = [
            (await health.Check(health_pb2.HealthCheckRequest(service=name), timeout=2)).status
            for name in ("", SERVICE_NAME)
        ]
        reply = await http.get("/healthz")
        seen = [statuses, reply.status_code, reply.text]
        if seen == [[want, want], code, text]:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"health never became {want}/{code} {text!r}; last seen {seen}")


async def _container_probe(url: str) -> tuple[int, str]:
    """The containers' health probe (`python -m rlfleet_core.healthz URL`), as Docker runs it."""
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "rlfleet_core.healthz", url],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return done.returncode, done.stdout.strip()


async def test_container_probe_names_what_it_could_not_reach() -> None:
    code, text = await _container_probe(f"http://127.0.0.1:{pick_free_port()}/healthz")
    assert code == 1 and text.startswith("cannot reach http://127.0.0.1:"), text
    assert await _container_probe("localhost:8000") == (1, "not an http(s) URL: 'localhost:8000'")


async def test_health_follows_the_service_while_running() -> None:
    built: list[_FlippingService] = []

    def factory(config: ServiceConfig) -> _FlippingService:
        built.append(_FlippingService(config))
        return built[-1]

    definition = ServiceDefinition(
        name="flipping",
        package="rlfleet-core",
        grpc_services=(SERVICE_NAME,),
        config_model=ServiceConfig,
        factory=factory,
    )
    running = await start_service(definition, config(http_port=0, health_poll_s=0.05))
    (service,) = built
    serving = health_pb2.HealthCheckResponse.SERVING
    not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
    try:
        async with (
            connect(f"127.0.0.1:{running.grpc_port}", retry=None) as channel,
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{running.http_port}", timeout=5) as http,
        ):
            health = health_pb2_grpc.HealthStub(channel)
            await _health_until(http, health, serving, "SERVING")
            url = f"http://127.0.0.1:{running.http_port}/healthz"
            assert await _container_probe(url) == (0, "200 SERVING")
            service.broken = "weights half loaded"
            await _health_until(http, health, not_serving, "NOT_SERVING: weights half loaded")
            assert await _container_probe(url) == (1, "503 NOT_SERVING: weights half loaded")
            assert await call(channel, "Echo", b"hi") == b"hi"  # health reports; it blocks nothing
            service.broken = None
            await _health_until(http, health, serving, "SERVING")
    finally:
        running.stop_event.set()
        await running.done


def test_env_overrides_come_before_the_command_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    """RLFLEET_<SERVICE>_OVERRIDES: how compose hands a stage's settings to a container
    whose `command:` is fixed; the command line's own overrides still win."""
    from rlfleet_core.config import ConfigError, load_service_config, overrides_variable

    definition = ServiceDefinition(
        name="swe-runner", package="rlfleet-core", grpc_services=(), config_model=ServiceConfig,
        factory=make_service,
    )  # fmt: skip
    assert overrides_variable("swe-runner") == "RLFLEET_SWE_RUNNER_OVERRIDES"
    monkeypatch.setenv(
        "RLFLEET_SWE_RUNNER_OVERRIDES",
        '["server.default_timeout_s=7", "server.max_timeout_s=90"]',
    )
    cfg = load_service_config(definition, None, ["server.max_timeout_s=80"])
    assert (cfg.server.default_timeout_s, cfg.server.max_timeout_s) == (7, 80)
    monkeypatch.setenv("RLFLEET_SWE_RUNNER_OVERRIDES", "")
    assert load_service_config(definition, None, []).server.default_timeout_s != 7
    for bad, why in [("[server.port=1", "not JSON"), ('{"a": 1}', "a JSON list")]:
        monkeypatch.setenv("RLFLEET_SWE_RUNNER_OVERRIDES", bad)
        with pytest.raises(ConfigError) as info:
            load_service_config(definition, None, [])
        (line,) = info.value.lines
        assert line.startswith("RLFLEET_SWE_RUNNER_OVERRIDES: ") and why in line
    monkeypatch.setenv("RLFLEET_SWE_RUNNER_OVERRIDES", '["server.nope=1"]')
    with pytest.raises(ConfigError) as info:
        load_service_config(definition, None, [])
    assert "server.nope" in info.value.lines[0]
