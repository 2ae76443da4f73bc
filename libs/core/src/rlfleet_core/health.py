"""Health of a running service: the gRPC health servicer, kept in step with the service.

The bootstrap (`rlfleet_core.server`) owns one `ServiceHealth` per service. It says
NOT_SERVING ("starting") until `start()` returned, then follows the service's
`not_serving_reason()` (polled every `server.health_poll_s`): a reason means
NOT_SERVING for "" and each of the service's gRPC names, and /healthz answers 503
`NOT_SERVING: <reason>`; None means SERVING. Shutdown turns it NOT_SERVING for good.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from grpc_health.v1 import health_pb2
from grpc_health.v1._async import HealthServicer

logger = logging.getLogger(__name__)


class ServiceHealth:
    """The gRPC health servicer plus the reason /healthz gives while not serving."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.servicer = HealthServicer()
        self.names = ("", *names)
        self.reason: str | None = "starting"
        """Why the service is not serving, or None while it is."""

    async def set(self, reason: str | None) -> None:
        self.reason = reason
        status = health_pb2.HealthCheckResponse.SERVING
        if reason is not None:
            status = health_pb2.HealthCheckResponse.NOT_SERVING
        for name in self.names:
            await self.servicer.set(name, status)

    async def shut_down(self) -> None:
        """NOT_SERVING for good: later `set` calls change nothing."""
        self.reason = "shutting down"
        await self.servicer.enter_graceful_shutdown()

    async def serving_text(self) -> tuple[bool, str]:
        """What /healthz answers: SERVING, or NOT_SERVING with the reason."""
        request = health_pb2.HealthCheckRequest(service="")
        status = (await self.servicer.Check(request, None)).status
        text = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
        serving = status == health_pb2.HealthCheckResponse.SERVING
        if not serving and self.reason:
            text = f"{text}: {self.reason}"
        return serving, text

    async def check(self, probe: Callable[[], str | None]) -> None:
        """Set health from `probe()` (the service's `not_serving_reason`)."""
        reason = _ask(probe)
        if reason != self.reason:
            if reason is None:
                logger.info("serving")
            else:
                logger.warning("not serving", extra={"reason": reason})
            await self.set(reason)

    async def follow(self, probe: Callable[[], str | None], every_s: float) -> None:
        """`check` every `every_s`, until cancelled."""
        while True:
            await asyncio.sleep(every_s)
            await self.check(probe)


def _ask(probe: Callable[[], str | None]) -> str | None:
    try:
        return probe()
    except Exception as exc:  # a broken probe must not kill health: report it instead
        return f"health probe failed: {type(exc).__name__}: {exc}"
