"""The one bootstrap every rlfleet service runs under.

Order matters and is the same for every service:
1. bind the gRPC port (health NOT_SERVING) and the HTTP port *before* heavy start-up, so
   a port clash fails in milliseconds and orchestrators can watch health from the start;
2. `service.start()` (load a model, warm a pool, ...), then health turns SERVING;
3. while running, the bootstrap asks `service.not_serving_reason()` every
   `server.health_poll_s`: a reason turns health NOT_SERVING (gRPC, for "" and each of
   the service's names; /healthz answers 503 `NOT_SERVING: <reason>`), None turns it
   back to SERVING (`rlfleet_core.health`). A service that can stop being able to serve
   (a model left broken by a failed weight load) overrides it; `BaseService` says None;
4. on SIGTERM/SIGINT: health NOT_SERVING for good, stop taking new calls, let calls in
   flight finish within `grace_s`, then `service.stop()`.

A service is a `ServiceDefinition` (name, config model, factory) whose factory builds an
object implementing `Service`. `rlfleet serve <name>` and each package's own
`rlfleet-<name>` entry point both end in `serve(...)`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import socket
import ssl
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import uvicorn
from fastapi import FastAPI, Response
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import Field, field_validator, model_validator
from rlfleet_proto.v1 import common_pb2_grpc

from rlfleet_core.auth import (
    AuthError,
    AuthInterceptor,
    HTTPAuthMiddleware,
    server_credentials,
    server_token,
)
from rlfleet_core.config import ConfigError, ConfigModel, load_service_config
from rlfleet_core.errors import StartupError
from rlfleet_core.health import ServiceHealth
from rlfleet_core.interceptors import ServerInterceptor
from rlfleet_core.logs import setup_logging
from rlfleet_core.metrics import REGISTRY
from rlfleet_core.ports import write_port_file
from rlfleet_core.versions import (
    BUILD_SERVICE,
    BuildServicer,
    build_dict,
    git_commit,
    package_version,
)

logger = logging.getLogger(__name__)


class ServerConfig(ConfigModel):
    """Network and lifecycle settings shared by every service (`server.*` keys)."""

    host: str = "127.0.0.1"
    """Address to bind. Loopback by default: expose a service only on purpose."""
    port: int = Field(0, ge=0, le=65535)
    """gRPC port; 0 picks a free one (logged at start)."""
    http_port: int | None = Field(None, ge=0, le=65535)
    """Port of the HTTP face (health, /metrics and the service's own routes); None = off."""
    port_file: str | None = None
    """Once both ports are bound (before the heavy start-up), write the bound ports here
    as JSON `{"grpc", "http", "pid"}`, atomically: how launchers learn the ports a
    service picked with port 0 (`rlfleet_core.ports`)."""
    grace_s: float = Field(3.0, ge=0)
    """On SIGTERM, calls in flight get this long to finish before they are cancelled."""
    max_message_bytes: int = Field(64 << 20, ge=1 << 20)
    """Largest gRPC message sent or received (weights go in buckets below this)."""
    default_timeout_s: float = Field(60.0, gt=0)
    """Deadline for a unary call whose client set none."""
    max_timeout_s: float = Field(3600.0, gt=0)
    """Cap on any call's deadline, streams included."""
    health_poll_s: float = Field(1.0, gt=0)
    """How often health asks the service whether it can serve (`not_serving_reason`)."""
    max_concurrent_rpcs: int | None = Field(None, ge=1)
    """Calls handled at once; more are refused with RESOURCE_EXHAUSTED. None = no cap."""
    auth: Literal["auto", "token", "off"] = "auto"
    """Shared-token authentication (token from RLFLEET_AUTH_TOKEN_FILE or RLFLEET_AUTH_TOKEN;
    `rlfleet_core.auth`, docs/security.md). auto: check it when set; without one, serve
    openly on loopback and refuse to start on any other address. token: refuse to start
    without one. off: never check (loud warning beyond loopback). Health stays open."""
    tls_cert_file: str | None = None
    """PEM certificate chain: serve gRPC and HTTP over TLS (with `tls_key_file`)."""
    tls_key_file: str | None = None
    """PEM private key of `tls_cert_file`."""
    tls_client_ca_file: str | None = None
    """PEM CA: require client certificates it signed (mTLS; counts as authentication
    beyond loopback). Health checks then need a client certificate too."""

    @model_validator(mode="after")
    def _tls_files_together(self) -> ServerConfig:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("server.tls_cert_file and server.tls_key_file go together")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError("server.tls_client_ca_file needs server.tls_cert_file/tls_key_file")
        return self

    @field_validator("host")
    @classmethod
    def _host_not_empty(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must be an address such as 127.0.0.1")
        return value


class ServiceConfig(ConfigModel):
    """Base of each service's config; the service adds its own sections."""

    server: ServerConfig = ServerConfig()


class Service(Protocol):
    """What a service implements; the bootstrap owns everything else."""

    def add_to_server(self, server: aio.Server) -> None:
        """Register the gRPC servicers (called before the server starts)."""

    def http_routes(self, app: FastAPI) -> None:
        """Add the service's HTTP routes (only called when an HTTP port is set)."""

    async def start(self) -> None:
        """Heavy start-up after the ports are bound; health is SERVING once it returns."""

    async def stop(self) -> None:
        """Release resources after the servers stopped."""

    def not_serving_reason(self) -> str | None:
        """None while the service can serve; otherwise why it cannot (health then says
        NOT_SERVING). Polled every `server.health_poll_s` once `start` returned: must be
        cheap and must not block."""


class BaseService:
    """Convenience base: no HTTP routes, nothing to start or stop. Subclasses register
    their servicers in `add_to_server` and override the rest as they grow."""

    def add_to_server(self, server: aio.Server) -> None:
        raise NotImplementedError

    def http_routes(self, app: FastAPI) -> None:
        return None

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def not_serving_reason(self) -> str | None:
        return None


@dataclass(frozen=True)
class ServiceDefinition:
    name: str
    """Short name, as in `rlfleet serve <name>`."""
    package: str
    """Distribution that ships the service (for versions)."""
    grpc_services: tuple[str, ...]
    """Full gRPC service names, for health and reflection."""
    config_model: type[ServiceConfig]
    factory: Callable[[Any], Service]
    """Builds the service from a validated `config_model` instance."""
    description: str = ""
    http_face: str = ""
    """What the HTTP face offers beyond /healthz and /metrics (for --help)."""
    check_row: Callable[[dict[str, Any]], list[str]] | None = None
    """Checks one data row as this service would when asked to use it ('field: problem'
    strings, empty if fine). The reward service checks the row against its environment;
    `rlfleet data prep` calls this in its own process, so it needs no running service."""


@dataclass
class RunningServer:
    """Handles of a started service, for tests and embedding."""

    grpc_port: int
    http_port: int | None
    stop_event: asyncio.Event
    done: asyncio.Task[None] = field(repr=False)
    http_listener: socket.socket | None = field(default=None, repr=False)


def _health_app(definition: ServiceDefinition, health: ServiceHealth) -> FastAPI:
    app = FastAPI(title=f"rlfleet {definition.name}", version=package_version(definition.package))

    @app.get("/healthz")
    async def healthz() -> Response:
        serving, text = await health.serving_text()
        return Response(content=text, status_code=200 if serving else 503, media_type="text/plain")

    @app.get("/version")
    async def build() -> dict[str, str]:
        return build_dict(definition.name, definition.package)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(content=generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    return app


class _UvicornServer(uvicorn.Server):
    """uvicorn without its own signal handling: the bootstrap owns SIGTERM/SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def start_service(definition: ServiceDefinition, config: ServiceConfig) -> RunningServer:
    """Start `definition` with `config` in the running event loop; returns once SERVING."""
    cfg = config.server
    # Before anything heavy: a refusal is instant.
    token = server_token(cfg.auth, cfg.host, mtls=cfg.tls_client_ca_file is not None)
    try:
        tls = (
            server_credentials(cfg.tls_cert_file, cfg.tls_key_file, cfg.tls_client_ca_file)
            if cfg.tls_cert_file and cfg.tls_key_file
            else None
        )
    except AuthError as exc:
        raise StartupError(str(exc)) from None
    service = definition.factory(config)
    interceptors: list[aio.ServerInterceptor] = [
        ServerInterceptor(definition.name, cfg.default_timeout_s, cfg.max_timeout_s)
    ]
    if token is not None:
        interceptors.append(AuthInterceptor(token))
    server = aio.server(
        interceptors=interceptors,
        options=[
            ("grpc.max_send_message_length", cfg.max_message_bytes),
            ("grpc.max_receive_message_length", cfg.max_message_bytes),
            ("grpc.so_reuseport", 0),
        ],
        maximum_concurrent_rpcs=cfg.max_concurrent_rpcs,
    )
    health = ServiceHealth(definition.grpc_services)
    health_pb2_grpc.add_HealthServicer_to_server(health.servicer, server)
    service.add_to_server(server)
    common_pb2_grpc.add_BuildServiceServicer_to_server(
        BuildServicer(definition.name, definition.package), server
    )
    reflection.enable_server_reflection(
        (
            *definition.grpc_services,
            BUILD_SERVICE,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ),
        server,
    )
    try:
        address = f"{cfg.host}:{cfg.port}"
        grpc_port = (
            server.add_secure_port(address, tls) if tls else server.add_insecure_port(address)
        )
    except RuntimeError as exc:
        raise OSError(
            f"cannot bind gRPC to {cfg.host}:{cfg.port} ({exc}); is the port in use?"
        ) from None
    await health.set("starting")
    await server.start()

    http: _UvicornServer | None = None
    http_task: asyncio.Task[None] | None = None
    http_port: int | None = None
    http_listener: socket.socket | None = None
    if cfg.http_port is not None:
        # Bind here rather than in uvicorn, so a port clash is an OSError we report, not a
        # SystemExit from inside uvicorn.
        sock = socket.socket(socket.AF_INET6 if ":" in cfg.host else socket.AF_INET)
        # uvicorn sets no TCP_NODELAY on connections from a socket it is handed; accepted
        # sockets inherit it from the listener. Without it a response written as headers
        # then body waits for the client's delayed ACK: +40 ms per request.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # restart despite TIME_WAIT
        try:
            sock.bind((cfg.host, cfg.http_port))
        except OSError as exc:
            sock.close()
            await server.stop(0)
            raise OSError(
                f"cannot bind HTTP to {cfg.host}:{cfg.http_port} ({exc.strerror}); "
                "is the port in use?"
            ) from None
        http_port = int(sock.getsockname()[1])
        http_listener = sock
        app = _health_app(definition, health)
        service.http_routes(app)
        if token is not None:
            app.add_middleware(HTTPAuthMiddleware, token=token)
        http = _UvicornServer(
            uvicorn.Config(
                app,
                log_level="warning",
                access_log=False,
                lifespan="off",
                ssl_certfile=cfg.tls_cert_file,
                ssl_keyfile=cfg.tls_key_file,
                ssl_ca_certs=cfg.tls_client_ca_file,
                ssl_cert_reqs=ssl.CERT_REQUIRED if cfg.tls_client_ca_file else ssl.CERT_NONE,
            )
        )
        http_task = asyncio.create_task(http.serve(sockets=[sock]))

    try:
        if cfg.port_file:
            write_port_file(cfg.port_file, grpc_port, http_port)
        await service.start()
    except BaseException:
        # Leave nothing half-started behind (ports, server tasks) before reporting.
        if http is not None and http_task is not None:
            http.should_exit = True
            await http_task
        await server.stop(0)
        raise
    await health.check(service.not_serving_reason)  # SERVING unless the service says not
    follow = asyncio.create_task(health.follow(service.not_serving_reason, cfg.health_poll_s))
    logger.info(
        "serving",
        extra={
            "grpc": f"{cfg.host}:{grpc_port}",
            "http": f"{cfg.host}:{http_port}" if http_port else "off",
            "version": package_version(definition.package),
            "commit": git_commit()[:12] or "unknown",
            "auth": "token" if token is not None else "off",
            "tls": "mtls" if cfg.tls_client_ca_file else "on" if tls else "off",
        },
    )

    stop_event = asyncio.Event()

    async def run_until_stopped() -> None:
        await stop_event.wait()
        logger.info("stopping", extra={"grace_s": cfg.grace_s})
        follow.cancel()
        await health.shut_down()
        if http is not None:
            http.should_exit = True
        await server.stop(cfg.grace_s)
        if http_task is not None:
            await http_task
        await service.stop()
        logger.info("stopped")

    done = asyncio.create_task(run_until_stopped())
    return RunningServer(
        grpc_port=grpc_port,
        http_port=http_port,
        stop_event=stop_event,
        done=done,
        http_listener=http_listener,
    )


async def serve(definition: ServiceDefinition, config: ServiceConfig) -> None:
    """Run until SIGTERM or SIGINT, then shut down gracefully."""
    running = await start_service(definition, config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, running.stop_event.set)
    await running.done


def run_service_blocking(definition: ServiceDefinition, config: ServiceConfig) -> int:
    """Run the service in this process; returns an exit code."""
    setup_logging(definition.name)
    try:
        asyncio.run(serve(definition, config))
    except (OSError, StartupError) as exc:
        print(f"rlfleet {definition.name}: {exc}", file=sys.stderr)
        return 1
    return 0


def service_main(definition: ServiceDefinition, argv: Sequence[str] | None = None) -> None:
    """Entry point of `rlfleet-<service>`: the same options as `rlfleet serve <service>`."""
    parser = argparse.ArgumentParser(
        prog=f"rlfleet-{definition.name}",
        description=f"{definition.description} Serves gRPC (with health and reflection) "
        f"and optionally HTTP.",
    )
    parser.add_argument("--port", type=int, help="gRPC port (default: server.port from config)")
    parser.add_argument("--http-port", type=int, help="HTTP port (default: off)")
    parser.add_argument("--host", help="bind address (default 127.0.0.1)")
    parser.add_argument(
        "--port-file", help="write the bound ports here as JSON once bound (use with --port 0)"
    )
    parser.add_argument("-c", "--config", help="YAML config file")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides")
    args = parser.parse_args(argv)
    try:
        config = load_service_config(
            definition,
            args.config,
            args.overrides,
            args.port,
            args.http_port,
            args.host,
            args.port_file,
        )
    except ConfigError as exc:
        for line in exc.lines:
            print(f"rlfleet-{definition.name}: config error: {line}", file=sys.stderr)
        sys.exit(2)
    sys.exit(run_service_blocking(definition, config))
