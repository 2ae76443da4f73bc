"""The preamble every engine runs before a weight update touches the model.

Checks come first and nothing is paused until they pass. A refused update that comes by
broadcast still has its buckets on the wire: the receiver consumes them (drains the
group) before raising, so the sender, blocked in its broadcast, is released and sees the
refusal in the UpdateWeights reply rather than hanging.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import grpc
from rlfleet_core.errors import FailedPrecondition, InvalidArgument, ServiceError

from rlfleet_rollout.types import WeightUpdate


class UpdateAborted(ServiceError):
    """An update that failed midway and was rolled back (or never applied): the engine
    still serves the version it had. ABORTED, not UNAVAILABLE: clients retry UNAVAILABLE
    by themselves, and a replayed update would find the group gone."""

    code = grpc.StatusCode.ABORTED


def check_newer(new: int, current: int, max_jump: int) -> None:
    """Versions only go up: an update that is not newer would roll the policy back. And
    by at most `max_jump` at once: a version far ahead (2^63 - 1) would make every later
    publish of the trainer stale."""
    if new <= current:
        raise FailedPrecondition(
            f"weight_version {new} is not newer than the current version {current}; "
            "versions must increase"
        )
    if new - current > max_jump:
        raise InvalidArgument(
            "weight_version",
            f"{new} is more than max_weight_version_jump={max_jump} ahead of the current "
            f"version {current}",
        )


async def check_or_drain(
    update: WeightUpdate,
    current: int,
    max_jump: int,
    drain: Callable[[], Awaitable[object]],
    *checks: Callable[[], None],
) -> None:
    """`check_newer`, then each of `checks`; when one raises and the update comes by
    broadcast (`update.plan`), `drain()` before re-raising."""
    try:
        check_newer(update.version, current, max_jump)
        for check in checks:
            check()
    except Exception:
        if update.plan is not None:
            await drain()
        raise
