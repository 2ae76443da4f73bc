"""Shared-token authentication for every rlfleet service, gRPC and HTTP alike.

One token per fleet, read from `RLFLEET_AUTH_TOKEN_FILE` (a file holding it; preferred:
it stays out of process listings and `docker inspect`) or `RLFLEET_AUTH_TOKEN`. Servers
check it and clients send it from the same variables, as `authorization: Bearer <token>`
(gRPC metadata or HTTP header), so a service that calls another needs nothing more.

Servers (`server.auth`, see `ServerConfig`):
- `auto` (default): check the token when one is configured; with none, serve openly on a
  loopback address and refuse to start on any other address;
- `token`: refuse to start without a token, whatever the address;
- `off`: never check (logged as a warning when bound beyond loopback).

Open without a token: the standard gRPC health service and HTTP `/healthz`, so that
orchestrators (compose, SLURM, Kubernetes probes) need no secret. Everything else needs it,
`/metrics` and gRPC reflection included: they describe the traffic, the methods and the
failures of a run, and Prometheus can send a bearer token from a file.
Comparison is constant-time (`hmac.compare_digest`); the token is never logged or echoed.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import os
import re
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import grpc
from grpc import aio

from rlfleet_core.errors import InvalidArgument, StartupError
from rlfleet_core.interceptors import Continuation, MethodHandler

logger = logging.getLogger(__name__)

TOKEN_ENV = "RLFLEET_AUTH_TOKEN"
TOKEN_FILE_ENV = "RLFLEET_AUTH_TOKEN_FILE"
TLS_CA_ENV = "RLFLEET_TLS_CA_FILE"
"""Clients: trust roots (PEM) for servers that serve TLS; setting it turns TLS on."""
TLS_CERT_ENV = "RLFLEET_TLS_CERT_FILE"
TLS_KEY_ENV = "RLFLEET_TLS_KEY_FILE"
"""Clients: certificate chain and key (PEM) presented to servers that require mTLS."""
HEADER = "authorization"
MIN_TOKEN_CHARS = 16
"""Shorter tokens are refused: a shared secret must not be guessable by a patient peer."""
OPEN_GRPC_METHODS = frozenset({"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"})
OPEN_HTTP_PATHS = frozenset({"/healthz"})
HOW_TO_SEND = (
    f"send `{HEADER}: Bearer <token>` (rlfleet clients do it when {TOKEN_FILE_ENV} or "
    f"{TOKEN_ENV} is set; `rlfleet up`/`run` write the token to <run dir>/auth_token)"
)


class AuthError(ValueError):
    """The token source is unusable; the message names the variable and the fix."""


def generate_token() -> str:
    """A fresh fleet token: 32 random bytes, URL-safe (43 characters)."""
    return secrets.token_urlsafe(32)


def write_token_file(path: Path, token: str | None = None) -> str:
    """Write `token` (or a fresh one) to `path` readable by its owner only; returns it."""
    token = token or generate_token()
    path.parent.mkdir(parents=True, exist_ok=True)
    # Create with 0600 from the start: no window in which another user can read it.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.chmod(path, 0o600)  # an existing file keeps its mode through O_CREAT
    return token


def _check(token: str, source: str) -> str:
    token = token.strip()
    if len(token) < MIN_TOKEN_CHARS:
        raise AuthError(
            f"{source}: the token has {len(token)} characters, at least {MIN_TOKEN_CHARS} are "
            "needed; make one with `python -c 'import secrets; print(secrets.token_urlsafe(32))'`"
        )
    if not token.isascii() or not token.isprintable() or " " in token:
        raise AuthError(f"{source}: the token must be printable ASCII without spaces")
    return token


def token_from_env(env: MutableMapping[str, str] | None = None) -> str | None:
    """The configured token (RLFLEET_AUTH_TOKEN_FILE wins over RLFLEET_AUTH_TOKEN), or None."""
    env = os.environ if env is None else env
    path = env.get(TOKEN_FILE_ENV, "").strip()
    if path:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise AuthError(
                f"{TOKEN_FILE_ENV}={path}: cannot read the token file ({exc.strerror})"
            ) from None
        return _check(text, f"{TOKEN_FILE_ENV}={path}")
    token = env.get(TOKEN_ENV, "")
    if token.strip():
        return _check(token, TOKEN_ENV)
    return None


def bearer(token: str) -> str:
    return f"Bearer {token}"


def auth_headers(token: str | None = None) -> dict[str, str]:
    """HTTP headers that authenticate to an rlfleet service ({} when no token is set)."""
    token = token if token is not None else token_from_env()
    return {HEADER: bearer(token)} if token else {}


def token_matches(presented: str | None, token: str) -> bool:
    """Whether an `authorization` value carries `token` (constant-time)."""
    if not presented:
        return False
    scheme, _, value = presented.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(value.strip().encode(), token.encode())


def is_loopback(host: str) -> bool:
    """Whether binding `host` exposes the service to this machine only."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def server_token(mode: str, host: str, mtls: bool = False) -> str | None:
    """The token a server bound to `host` must check, or None to serve openly.
    Raises StartupError (saying how to fix it) where serving openly is not allowed;
    `mtls` (client certificates required) counts as authentication beyond loopback."""
    if mode == "off":
        if not is_loopback(host):
            logger.warning(
                "AUTHENTICATION IS OFF on a non-loopback address (server.auth=off): "
                "anyone who can reach this port can call every method",
                extra={"host": host},
            )
        return None
    try:
        token = token_from_env()
    except AuthError as exc:
        raise StartupError(str(exc)) from None
    if token is not None:
        return token
    if mode == "token" or not (is_loopback(host) or mtls):
        reason = "server.auth=token" if mode == "token" else f"server.host={host} is not loopback"
        raise StartupError(
            f"{reason} and no auth token is configured: put a shared token in a file "
            f"readable by this user only and set {TOKEN_FILE_ENV}=<file> (or {TOKEN_ENV}); "
            "`python -c 'import secrets; print(secrets.token_urlsafe(32))' > token && "
            "chmod 600 token` makes one. Or bind 127.0.0.1, or set server.auth=off to "
            "serve unauthenticated on purpose (docs/security.md)"
        )
    return None


def _read(path: str, source: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise AuthError(f"{source}={path}: cannot read ({exc.strerror})") from None


def channel_credentials_from_env() -> grpc.ChannelCredentials | None:
    """TLS credentials for client channels when RLFLEET_TLS_CA_FILE is set (with a client
    certificate for mTLS when RLFLEET_TLS_CERT_FILE and RLFLEET_TLS_KEY_FILE are), else None."""
    ca = os.environ.get(TLS_CA_ENV, "").strip()
    if not ca:
        return None
    cert = os.environ.get(TLS_CERT_ENV, "").strip()
    key = os.environ.get(TLS_KEY_ENV, "").strip()
    if bool(cert) != bool(key):
        raise AuthError(f"{TLS_CERT_ENV} and {TLS_KEY_ENV} go together: set both or neither")
    return grpc.ssl_channel_credentials(
        root_certificates=_read(ca, TLS_CA_ENV),
        private_key=_read(key, TLS_KEY_ENV) if key else None,
        certificate_chain=_read(cert, TLS_CERT_ENV) if cert else None,
    )


def server_credentials(
    cert_file: str, key_file: str, client_ca_file: str | None
) -> grpc.ServerCredentials:
    """TLS for a gRPC server; with `client_ca_file`, clients must present a certificate
    it signed (mTLS)."""
    return grpc.ssl_server_credentials(
        [(_read(key_file, "server.tls_key_file"), _read(cert_file, "server.tls_cert_file"))],
        root_certificates=_read(client_ca_file, "server.tls_client_ca_file")
        if client_ca_file
        else None,
        require_client_auth=client_ca_file is not None,
    )


# --- owners of server-side state -----------------------------------------------------------
# The fleet token says a caller may call; a client key says which caller it is. State a
# caller creates (sandbox sessions, reward episodes) belongs to the hash of its key, and
# another caller's state answers NOT_FOUND, as if it did not exist.

CLIENT_KEY_HEADER = "x-rlfleet-client-key"
"""HTTP header and gRPC metadata key carrying the caller's secret client key."""
_CLIENT_KEY = re.compile(r"^[\x21-\x7e]{16,256}$")
ANONYMOUS = "anonymous"
"""The owner of keyless callers where a service allows them (they all share it)."""


def owner_of(client_key: str | None, allow_keyless: bool) -> str:
    """The owner a client key stands for: a hash, so the key is never kept or logged."""
    if not client_key:
        if allow_keyless:
            return ANONYMOUS
        raise InvalidArgument(
            CLIENT_KEY_HEADER,
            "is required for sessions: send a random secret of 16-256 characters, the same "
            "on every call of one client (sessions belong to the key that created them)",
        )
    if not _CLIENT_KEY.match(client_key):
        raise InvalidArgument(
            CLIENT_KEY_HEADER, "use 16-256 printable ASCII characters without spaces"
        )
    return "k" + hashlib.sha256(client_key.encode()).hexdigest()[:32]


def grpc_client_key(context: aio.ServicerContext[Any, Any]) -> str | None:
    """A gRPC caller's `x-rlfleet-client-key` metadata, if any."""
    for key, value in context.invocation_metadata() or ():
        if key == CLIENT_KEY_HEADER:
            return value if isinstance(value, str) else value.decode(errors="replace")
    return None


# --- gRPC ---------------------------------------------------------------------------------

_REFUSAL = f"missing or wrong auth token: {HOW_TO_SEND}"


def _metadata_value(details: grpc.HandlerCallDetails) -> str | None:
    for key, value in details.invocation_metadata or ():
        if key == HEADER:
            return value if isinstance(value, str) else None
    return None


def _refusing_handler(handler: grpc.RpcMethodHandler[Any, Any]) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of the same shape as `handler` that answers UNAUTHENTICATED."""

    async def refuse(request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, _REFUSAL)

    async def refuse_stream(request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, _REFUSAL)
        yield  # pragma: no cover - makes this an async generator

    kw = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(refuse, **kw)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(refuse, **kw)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(refuse_stream, **kw)
    return grpc.stream_stream_rpc_method_handler(refuse_stream, **kw)


class AuthInterceptor(aio.ServerInterceptor):
    """Answers UNAUTHENTICATED to any call without the token, except the health service.

    Installed inside the bookkeeping interceptor, so refused calls are counted in
    `rlfleet_grpc_requests_total{code="UNAUTHENTICATED"}`."""

    def __init__(self, token: str) -> None:
        self.token = token
        self._refusals: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> MethodHandler | None:
        method = handler_call_details.method
        if method in OPEN_GRPC_METHODS or token_matches(
            _metadata_value(handler_call_details), self.token
        ):
            return await continuation(handler_call_details)
        refusal = self._refusals.get(method)
        if refusal is None:
            handler = await continuation(handler_call_details)
            if handler is None:  # unknown method: UNIMPLEMENTED reveals nothing
                return None
            refusal = self._refusals[method] = _refusing_handler(handler)
        return refusal


# --- HTTP ---------------------------------------------------------------------------------

ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


class HTTPAuthMiddleware:
    """ASGI middleware: 401 for any HTTP request without the token, except /healthz.
    Pure ASGI (not BaseHTTPMiddleware), so streaming responses pass through untouched."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] in OPEN_HTTP_PATHS:
            await self.app(scope, receive, send)
            return
        presented = None
        for key, value in scope.get("headers", ()):
            if key == HEADER.encode():
                presented = value.decode("latin-1")
                break
        if token_matches(presented, self.token):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008, "reason": "unauthenticated"})
            return
        body = json.dumps({"detail": _REFUSAL}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b'Bearer realm="rlfleet"'),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
