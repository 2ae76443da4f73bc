"""Server interceptors installed on every rlfleet gRPC server.

One interceptor does the per-call bookkeeping so that the order is explicit: request id
(from `x-request-id` metadata or a fresh one) → deadline (the client's, capped at the
server's maximum, or the server default when the client set none) → handler → status
code (ServiceError subclasses map to their code; anything else is INTERNAL with the
exception named, and logged with its traceback) → log line and Prometheus metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias

import grpc
from grpc import aio

from rlfleet_core.errors import ServiceError
from rlfleet_core.logs import request_id_var
from rlfleet_core.metrics import GRPC_IN_FLIGHT, GRPC_LATENCY, GRPC_REQUESTS

logger = logging.getLogger(__name__)

# Quoted: grpc's classes are generic only to its type stubs.
MethodHandler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"
Continuation: TypeAlias = "Callable[[grpc.HandlerCallDetails], Awaitable[MethodHandler | None]]"
"""What a server interceptor is handed: the next step's lookup of a method's handler."""

# Health checks and reflection are polled often; keep them out of the logs.
_QUIET_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")


class _MethodMetrics:
    """Prometheus children of one method, resolved once (label lookups take a lock)."""

    def __init__(self, service: str, method: str) -> None:
        self.service = service
        self.method = method
        self.in_flight = GRPC_IN_FLIGHT.labels(service)
        self.latency = GRPC_LATENCY.labels(service, method)
        self._requests: dict[grpc.StatusCode, Any] = {}
        self.quiet = method.startswith(_QUIET_PREFIXES)

    def requests(self, code: grpc.StatusCode) -> Any:
        child = self._requests.get(code)
        if child is None:
            child = self._requests[code] = GRPC_REQUESTS.labels(
                self.service, self.method, code.name
            )
        return child


class _Call:
    """Bookkeeping for one RPC."""

    def __init__(self, metrics: _MethodMetrics, context: aio.ServicerContext[Any, Any]) -> None:
        self.metrics = metrics
        self.method = metrics.method
        self.start = time.perf_counter()
        request_id = ""
        for key, value in context.invocation_metadata() or ():
            if key == "x-request-id":
                request_id = str(value)
                break
        self.token = request_id_var.set(request_id or os.urandom(8).hex())
        self.finished = False
        metrics.in_flight.inc()

    def finish(self, code: grpc.StatusCode) -> None:
        """Count the call once. An error is counted before its status is sent (`abort`
        sends it at once): a client that has seen the error then finds it counted."""
        if self.finished:
            return
        self.finished = True
        elapsed = time.perf_counter() - self.start
        metrics = self.metrics
        metrics.in_flight.dec()
        metrics.requests(code).inc()
        metrics.latency.observe(elapsed)
        level = logging.DEBUG if code == grpc.StatusCode.OK else logging.INFO
        if not metrics.quiet and logger.isEnabledFor(level):
            logger.log(
                level,
                "rpc done",
                extra={"method": self.method, "code": code.name, "ms": round(elapsed * 1e3, 2)},
            )
        request_id_var.reset(self.token)


class ServerInterceptor(aio.ServerInterceptor):
    """Request ids, deadlines, error mapping, logging and metrics for every RPC.

    default_timeout_s: deadline applied when the client sent none.
    max_timeout_s: cap on any deadline (a client cannot hold a handler forever).
    Streaming-response calls are bounded by max_timeout_s only, since a long stream
    (e.g. Generate with many samples) is legitimate.
    """

    def __init__(self, service: str, default_timeout_s: float, max_timeout_s: float) -> None:
        self.service = service
        self.default_timeout_s = default_timeout_s
        self.max_timeout_s = max_timeout_s
        self._wrapped: dict[str, tuple[Any, grpc.RpcMethodHandler[Any, Any]]] = {}
        self._metrics: dict[str, _MethodMetrics] = {}

    def _method_metrics(self, method: str) -> _MethodMetrics:
        metrics = self._metrics.get(method)
        if metrics is None:
            metrics = self._metrics[method] = _MethodMetrics(self.service, method)
        return metrics

    def _budget(self, context: aio.ServicerContext[Any, Any], streaming: bool) -> float:
        remaining = context.time_remaining()
        if remaining is None:
            remaining = self.max_timeout_s if streaming else self.default_timeout_s
        return max(0.0, min(remaining, self.max_timeout_s))

    def _status_for(self, call: _Call, exc: BaseException) -> tuple[grpc.StatusCode, str]:
        """The status code and message that `exc` stands for."""
        if isinstance(exc, ServiceError):
            code, message = exc.code, exc.message
        elif isinstance(exc, NotImplementedError):
            code, message = grpc.StatusCode.UNIMPLEMENTED, f"{call.method} is not implemented yet"
        elif isinstance(exc, TimeoutError):
            code, message = grpc.StatusCode.DEADLINE_EXCEEDED, f"{call.method}: deadline exceeded"
        else:
            logger.error("unhandled error in %s", call.method, exc_info=exc)
            code = grpc.StatusCode.INTERNAL
            message = f"internal error in {call.method}: {type(exc).__name__}: {exc}"
        return code, message

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> MethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        # Servicers register fixed handlers, so wrap each once instead of on every call.
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self._wrap(method, handler)
        self._wrapped[method] = (handler, wrapped)
        return wrapped

    def _wrap(
        self, method: str, handler: grpc.RpcMethodHandler[Any, Any]
    ) -> grpc.RpcMethodHandler[Any, Any]:
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                self._wrap_unary(method, handler.unary_unary, streaming_in=False),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(
                self._wrap_unary(method, handler.stream_unary, streaming_in=True),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                self._wrap_stream(method, handler.unary_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return grpc.stream_stream_rpc_method_handler(
            self._wrap_stream(method, handler.stream_stream),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    @contextlib.asynccontextmanager
    async def _accounted(
        self, method: str, context: aio.ServicerContext[Any, Any], streaming: bool
    ) -> AsyncIterator[None]:
        """One call's deadline budget, status and metrics around the handler's body: an
        error the handler raises becomes its gRPC status (aborted here), a cancelled or
        closed call counts as CANCELLED, and the status is counted once, before it leaves."""
        call = _Call(self._method_metrics(method), context)
        code = grpc.StatusCode.OK
        try:
            async with asyncio.timeout(self._budget(context, streaming=streaming)):
                yield
        except aio.AbortError:
            code = context.code() or grpc.StatusCode.UNKNOWN
            raise
        except (asyncio.CancelledError, GeneratorExit):
            code = grpc.StatusCode.CANCELLED
            raise
        except Exception as exc:
            code, message = self._status_for(call, exc)
            call.finish(code)
            await context.abort(code, message)
        finally:
            if code == grpc.StatusCode.OK and context.code() not in (None, grpc.StatusCode.OK):
                code = context.code()
            call.finish(code)

    def _wrap_unary(self, method: str, behavior: Any, streaming_in: bool) -> Any:
        async def wrapper(request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
            async with self._accounted(method, context, streaming=streaming_in):
                result = behavior(request, context)
                if asyncio.iscoroutine(result):
                    result = await result
                return result

        return wrapper

    def _wrap_stream(self, method: str, behavior: Any) -> Any:
        async def wrapper(
            request: Any, context: aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            async with self._accounted(method, context, streaming=True):
                async for item in behavior(request, context):
                    yield item

        return wrapper
