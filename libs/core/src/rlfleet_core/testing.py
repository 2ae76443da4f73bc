"""Test helpers for services: run a service in-process on a free loopback port."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence

from rlfleet_core.config import load_config
from rlfleet_core.server import RunningServer, ServiceDefinition, start_service


@contextlib.asynccontextmanager
async def running_service(
    definition: ServiceDefinition, overrides: Sequence[str] = (), http: bool = False
) -> AsyncIterator[RunningServer]:
    """Start `definition` (with dotted `overrides`) on free ports; stop it on exit."""
    flags = ["server.port=0", *(["server.http_port=0"] if http else [])]
    config = load_config(definition.config_model, overrides=[*flags, *overrides])
    running = await start_service(definition, config)
    try:
        yield running
    finally:
        running.stop_event.set()
        await running.done
