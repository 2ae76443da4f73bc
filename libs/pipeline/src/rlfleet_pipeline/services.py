"""Finds installed services through the `rlfleet.services` entry-point group, so neither
the CLI nor the pipeline depends on a service package: each service registers itself
when installed, and is started through its own `python -m rlfleet_<service>`."""

from __future__ import annotations

import sys
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the server module (uvicorn, fastapi: ~0.7 s) only once a service loads
    from rlfleet_core.server import ServiceDefinition

# The services of rlfleet, in pipeline order; a name here that is not installed is
# reported with the package to install.
KNOWN_SERVICES = {
    "trainer": "rlfleet-trainer",
    "rollout": "rlfleet-rollout",
    "reward": "rlfleet-reward",
    "sandbox": "rlfleet-sandbox",
    "swe-runner": "rlfleet-swe",
}


SERVICE_INSTANCES = {"judge": "rollout"}
"""Fleet names that run another service's program: `judge` is a second rollout service
serving a stage's judge model (the recipe's `judge.model`); its HTTP face is the reward
gateway's `judge.base_url`."""


class ServiceNotFound(LookupError):
    pass


def _load(ep: EntryPoint) -> ServiceDefinition:
    from rlfleet_core.server import ServiceDefinition

    definition = ep.load()
    if not isinstance(definition, ServiceDefinition):
        raise TypeError(f"entry point {ep.name!r} ({ep.value}) is not a ServiceDefinition")
    return definition


def installed_services() -> dict[str, ServiceDefinition]:
    """Every installed service's definition: imports every service package (the trainer's
    brings torch); `get_service` imports only the one asked for."""
    return {ep.name: _load(ep) for ep in entry_points(group="rlfleet.services")}


def get_service(name: str) -> ServiceDefinition:
    name = SERVICE_INSTANCES.get(name, name)
    # Only the named entry point is loaded: a launch's preflight checks each service's
    # overrides, and loading them all imported the trainer, hence torch, into every
    # `rlfleet rl` / `rlfleet run` (~3 s of CPU before anything started).
    for ep in entry_points(group="rlfleet.services", name=name):
        return _load(ep)
    if name in KNOWN_SERVICES:
        raise ServiceNotFound(
            f"service {name!r} is not installed; install it with `uv sync` in the repository "
            f"or `pip install {KNOWN_SERVICES[name]}`"
        )
    installed = {ep.name for ep in entry_points(group="rlfleet.services")}
    known = ", ".join(sorted(set(KNOWN_SERVICES) | installed))
    raise ServiceNotFound(f"unknown service {name!r}; choose one of: {known}")


def service_command(name: str) -> list[str]:
    """The command that serves `name` in the foreground: the service's own
    `python -m <package>`, which takes the flags of `rlfleet serve` (--port, --http-port,
    --host, -c, key=value overrides). The package comes from the entry point when the
    service is installed, else from its distribution name (for launch plans)."""
    name = SERVICE_INSTANCES.get(name, name)
    for ep in entry_points(group="rlfleet.services", name=name):
        return [sys.executable, "-m", ep.module.partition(".")[0]]
    if name in KNOWN_SERVICES:
        return [sys.executable, "-m", KNOWN_SERVICES[name].replace("-", "_")]
    raise ServiceNotFound(f"unknown service {name!r}; choose one of: {', '.join(KNOWN_SERVICES)}")
