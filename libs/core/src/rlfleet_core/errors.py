"""Errors that cross a service boundary, each tied to one gRPC status code.

Service code raises these; the server interceptor turns them into the status code with
the message, so a client sees INVALID_ARGUMENT "row.expected_answer: missing" rather
than INTERNAL and a stack trace.
"""

from __future__ import annotations

import grpc


class ServiceError(Exception):
    """Base class: an error a client should see with a specific status code."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(ServiceError):
    """Bad input. Name the field: InvalidArgument("sampling.max_tokens: must be > 0, got 0")."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


class NotFound(ServiceError):
    code = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(ServiceError):
    """The request is well-formed but the service's state refuses it (e.g. a stale version)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhausted(ServiceError):
    """Back-pressure: the service is at capacity; the client should retry later."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(ServiceError):
    """The service (or something it needs) is not ready; retrying may succeed."""

    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(ServiceError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class StartupError(RuntimeError):
    """A service cannot start for a reason the operator can fix (missing tool, model,
    permission). The bootstrap prints the message, without a traceback, and exits 1."""
