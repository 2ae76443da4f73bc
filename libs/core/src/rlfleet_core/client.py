"""Client channels with a deadline on every call and bounded retries with backoff.

A call that passes no `timeout=` gets the channel's default deadline (a client
interceptor adds it; the service-config `timeout` would instead cap every call).

Retries use gRPC's own retry machinery (a service config on the channel), so they apply
to every stub made from the channel: only UNAVAILABLE is retried by default (the server
was not reached or is restarting), since a retried RESOURCE_EXHAUSTED or
DEADLINE_EXCEEDED would add load exactly when the server is saturated. A streaming call
is retried only until its first response arrives.

With RLFLEET_TLS_CA_FILE set, channels use TLS (and present RLFLEET_TLS_CERT_FILE /
RLFLEET_TLS_KEY_FILE to servers that require mTLS). Every call also carries the fleet's auth token (`authorization: Bearer ...` metadata) when
RLFLEET_AUTH_TOKEN_FILE or RLFLEET_AUTH_TOKEN is set (`rlfleet_core.auth`), read when the
channel is made; `auth_token=` overrides it.
"""

from __future__ import annotations

import asyncio
import collections
import json
import time
from dataclasses import dataclass

import grpc
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlfleet_core.auth import HEADER, bearer, channel_credentials_from_env, token_from_env


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 4
    """Total tries including the first (gRPC caps this at 5)."""
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 2.0
    backoff_multiplier: float = 2.0
    retryable_codes: tuple[str, ...] = ("UNAVAILABLE",)

    def __post_init__(self) -> None:
        if not 1 <= self.max_attempts <= 5:
            raise ValueError(f"max_attempts ({self.max_attempts}) must be between 1 and 5")


def service_config(retry: RetryPolicy | None) -> str:
    """The gRPC service config JSON that sets the retry policy for every method."""
    method: dict[str, object] = {"name": [{}]}
    if retry is not None and retry.max_attempts > 1:
        method["retryPolicy"] = {
            "maxAttempts": retry.max_attempts,
            "initialBackoff": f"{retry.initial_backoff_s:.3f}s",
            "maxBackoff": f"{retry.max_backoff_s:.3f}s",
            "backoffMultiplier": retry.backoff_multiplier,
            "retryableStatusCodes": list(retry.retryable_codes),
        }
    return json.dumps({"methodConfig": [method]})


class _DefaultDeadline:
    """Gives every call without a timeout the channel's default one, and the auth token."""

    def __init__(self, timeout_s: float, token: str | None = None) -> None:
        self.timeout_s = timeout_s
        self.auth = (HEADER, bearer(token)) if token else None

    def _details(self, details: aio.ClientCallDetails) -> aio.ClientCallDetails:
        if details.timeout is not None and self.auth is None:
            return details
        metadata = details.metadata
        if self.auth is not None:
            metadata = aio.Metadata(*(metadata or ()), self.auth)
        return aio.ClientCallDetails(
            details.method,
            self.timeout_s if details.timeout is None else details.timeout,
            metadata,
            details.credentials,
            details.wait_for_ready,
        )


# One object per call shape: an aio channel files each interceptor under the first of the
# four interfaces it implements, so one class implementing all four sees unary calls only.
class _UnaryUnary(_DefaultDeadline, aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return await continuation(self._details(details), request)


class _UnaryStream(_DefaultDeadline, aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return await continuation(self._details(details), request)


class _StreamUnary(_DefaultDeadline, aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, details, request_iterator):  # type: ignore[no-untyped-def]
        return await continuation(self._details(details), request_iterator)


class _StreamStream(_DefaultDeadline, aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, details, request_iterator):  # type: ignore[no-untyped-def]
        return await continuation(self._details(details), request_iterator)


def _aio_interceptors(timeout_s: float, token: str | None) -> list[aio.ClientInterceptor]:
    kinds = (_UnaryUnary, _UnaryStream, _StreamUnary, _StreamStream)
    return [kind(timeout_s, token) for kind in kinds]


def _options(retry: RetryPolicy | None, max_message_bytes: int) -> list[tuple[str, object]]:
    return [
        ("grpc.service_config", service_config(retry)),
        ("grpc.enable_retries", 1 if retry is not None else 0),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]


def connect(
    target: str,
    *,
    default_timeout_s: float = 30.0,
    retry: RetryPolicy | None = RetryPolicy(),
    max_message_bytes: int = 64 << 20,
    auth_token: str | None = None,
) -> aio.Channel:
    """An asyncio channel to `target` ("127.0.0.1:50051"): every call gets
    `default_timeout_s` unless it passes its own `timeout=`, and UNAVAILABLE is retried.
    Calls carry `auth_token`, else the token from the environment, if any."""
    token = auth_token or token_from_env()
    options = _options(retry, max_message_bytes)
    interceptors = _aio_interceptors(default_timeout_s, token)
    tls = channel_credentials_from_env()
    if tls is not None:
        return aio.secure_channel(target, tls, options=options, interceptors=interceptors)
    return aio.insecure_channel(target, options=options, interceptors=interceptors)


def connect_sync(
    target: str,
    *,
    default_timeout_s: float = 30.0,
    retry: RetryPolicy | None = RetryPolicy(),
    max_message_bytes: int = 64 << 20,
    auth_token: str | None = None,
) -> grpc.Channel:
    """Blocking twin of `connect`, for scripts and the CLI."""
    token = auth_token or token_from_env()
    tls = channel_credentials_from_env()
    options = _options(retry, max_message_bytes)
    channel = (
        grpc.secure_channel(target, tls, options=options)
        if tls is not None
        else grpc.insecure_channel(target, options=options)
    )
    return grpc.intercept_channel(channel, _SyncDefaultDeadline(default_timeout_s, token))


class _SyncDefaultDeadline(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Blocking-channel twin of _DefaultDeadline."""

    def __init__(self, timeout_s: float, token: str | None = None) -> None:
        self.timeout_s = timeout_s
        self.auth = (HEADER, bearer(token)) if token else None

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        if details.timeout is not None and self.auth is None:
            return details
        metadata = details.metadata
        if self.auth is not None:
            metadata = (*(metadata or ()), self.auth)
        return _CallDetails(
            details.method,
            self.timeout_s if details.timeout is None else details.timeout,
            metadata,
            details.credentials,
            getattr(details, "wait_for_ready", None),
            getattr(details, "compression", None),
        )

    def intercept_unary_unary(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, request_iterator):  # type: ignore[no-untyped-def]
        return continuation(self._details(details), request_iterator)

    def intercept_stream_stream(self, continuation, details, request_iterator):  # type: ignore[no-untyped-def]
        return continuation(self._details(details), request_iterator)


class _CallDetails(
    collections.namedtuple(
        "_CallDetails",
        ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression"),
    ),
    grpc.ClientCallDetails,
):
    pass


def check_health(target: str, service: str = "", timeout_s: float = 5.0) -> str:
    """Standard gRPC health check; returns "SERVING", "NOT_SERVING", ... or raises grpc.RpcError."""
    with connect_sync(target, default_timeout_s=timeout_s, retry=None) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))


async def wait_for_serving(target: str, service: str = "", timeout_s: float = 30.0) -> None:
    """Poll health until SERVING; TimeoutError naming the target otherwise."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    async with connect(target, default_timeout_s=2.0, retry=None) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            try:
                reply = await stub.Check(
                    health_pb2.HealthCheckRequest(service=service), timeout=2.0
                )
                last = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except aio.AioRpcError as exc:
                last = exc.code().name
            await asyncio.sleep(0.1)
    raise TimeoutError(f"{target} not SERVING after {timeout_s:.0f}s (last: {last})")
