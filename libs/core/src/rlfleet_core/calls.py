"""One way to make a unary call to a fleet service, and one classification of its failures.

Every typed client (`rlfleet_contracts.*_client`) calls through an `Endpoint`: the call gets
its deadline and metadata, and a gRPC error becomes one exception whose message names the
service, the method (and what it was about), the target and the status:
"sandbox Execute on 10.0.0.7:50053: DEADLINE_EXCEEDED: Deadline Exceeded".

`classify` sorts a status into the four failures a caller acts on differently (`Failure`);
each client maps those onto its contract's exception classes. `transient` says whether
another try could help. The channel's own retry (`rlfleet_core.client.RetryPolicy`:
UNAVAILABLE before any answer) runs inside each call; `call_with_retry` is the caller's
retry of a whole call, with backoff and jitter, for failures marked transient only.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Its own generator: retries must not move the seeded global RNG that checkpoints restore.
_JITTER = random.Random()

TRANSIENT_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)
"""Call statuses worth another try: the peer was down, slow or shedding load."""


class Failure(enum.Enum):
    """What a failed call means to its caller."""

    UNAVAILABLE = "unavailable"
    """Not reached, too slow, or broken inside: the service's fault, not the request's."""
    BUSY = "busy"
    """RESOURCE_EXHAUSTED: the service is at capacity; later may work."""
    GONE = "gone"
    """NOT_FOUND: what the call names (a session, an episode) does not exist (any more)."""
    REFUSED = "refused"
    """INVALID_ARGUMENT: the request's fault; the service's message names the field."""


_FAILURES = {
    grpc.StatusCode.RESOURCE_EXHAUSTED: Failure.BUSY,
    grpc.StatusCode.NOT_FOUND: Failure.GONE,
    grpc.StatusCode.INVALID_ARGUMENT: Failure.REFUSED,
}


def classify(code: grpc.StatusCode) -> Failure:
    """The one classification of a gRPC status; any status not listed is UNAVAILABLE."""
    return _FAILURES.get(code, Failure.UNAVAILABLE)


@dataclass(frozen=True)
class RpcFailure:
    """A call that ended with a gRPC error status, as the exception raised for it tells it."""

    service: str
    method: str
    target: str
    code: grpc.StatusCode
    details: str
    subject: str = ""
    """What the call was about ("req-7 (math)"), named after the method when given."""

    @property
    def failure(self) -> Failure:
        return classify(self.code)

    @property
    def transient(self) -> bool:
        return self.code in TRANSIENT_CODES

    @property
    def message(self) -> str:
        what = f"{self.method} {self.subject}" if self.subject else self.method
        return f"{self.service} {what} on {self.target}: {self.code.name}: {self.details}"


class CallFailed(RuntimeError):
    """A call failed or its reply cannot be used; `transient` says whether another try
    could help, `rpc` holds the gRPC status when there was one."""

    def __init__(
        self,
        message: str,
        *,
        transient: bool = False,
        failed_samples: int = 0,
        rpc: RpcFailure | None = None,
    ) -> None:
        super().__init__(message)
        self.transient = transient
        self.failed_samples = failed_samples
        """Samples of a group call left without a result (all of them for a failed call)."""
        self.rpc = rpc

    @classmethod
    def of(cls, rpc: RpcFailure) -> CallFailed:
        return cls(rpc.message, transient=rpc.transient, rpc=rpc)


Raise = Callable[[RpcFailure], Exception]
"""What a client raises for a failed call (its contract's exception for `rpc.failure`)."""

Metadata = Sequence[tuple[str, str]]


@dataclass(frozen=True)
class Endpoint:
    """One service as a client calls it: its name in messages, its target, an aio stub
    (made from an `rlfleet_core.client.connect` channel)."""

    service: str
    target: str
    stub: Any

    def failure(self, method: str, exc: grpc.RpcError, subject: str = "") -> RpcFailure:
        # Both aio and blocking errors are grpc.Call too; the base type does not say so.
        call: Any = exc
        return RpcFailure(
            self.service, method, self.target, call.code(), str(call.details()), subject
        )

    async def call(
        self,
        method: str,
        request: Any,
        *,
        timeout_s: float | None,
        metadata: Metadata | None = None,
        subject: str = "",
        failed: Raise = CallFailed.of,
    ) -> Any:
        """`stub.<method>(request)` with deadline `timeout_s` (None: the channel's default);
        a gRPC error raises `failed(RpcFailure)`."""
        try:
            return await getattr(self.stub, method)(request, timeout=timeout_s, metadata=metadata)
        except grpc.RpcError as exc:
            raise failed(self.failure(method, exc, subject)) from None


@dataclass(frozen=True)
class CallRetry:
    attempts: int = 3
    """Tries per call, the first included."""
    backoff_s: float = 1.0
    """Wait before the first retry, doubled for each later one, jittered ±50% so that
    calls failed by one outage do not all come back at the same moment."""

    def delay_s(self, retry: int) -> float:
        return float(self.backoff_s * 2 ** (retry - 1) * _JITTER.uniform(0.5, 1.5))


DEFAULT_RETRY = CallRetry()


async def call_with_retry(
    call: Callable[[int], Awaitable[T]],
    retry: CallRetry,
    what: str,
    on_retry: Callable[[], None],
) -> T:
    """`call(attempt)` until it returns or raises a CallFailed that is not transient, at
    most `retry.attempts` times; `on_retry()` before each retry."""
    for attempt in range(1, retry.attempts + 1):
        try:
            return await call(attempt)
        except CallFailed as exc:
            if not exc.transient or attempt == retry.attempts:
                raise
            delay = retry.delay_s(attempt)
            on_retry()
            logger.warning(
                "%s: %s; try %d of %d in %.2fs", what, exc, attempt + 1, retry.attempts, delay
            )
            await asyncio.sleep(delay)
    raise AssertionError("unreachable: attempts >= 1")
