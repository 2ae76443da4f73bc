"""Finds installed services through the `rlfleet.services` entry-point group, so neither
the CLI nor the pipeline depends on a service package: each service registers itself
when installed, and is started through its own `python -m rlfleet_<service>`."""

from __future__ import annotations

import sys
from importlib.metadata import entry_points

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


def installed_services() -> dict[str, ServiceDefinition]:
    found = {}
    for ep in entry_points(group="rlfleet.services"):
        definition = ep.load()
        if not isinstance(definition, ServiceDefinition):
            raise TypeError(f"entry point {ep.name!r} ({ep.value}) is not a ServiceDefinition")
        found[ep.name] = definition
    return found


def get_service(name: str) -> ServiceDefinition:
    name = SERVICE_INSTANCES.get(name, name)
    services = installed_services()
    if name in services:
        return services[name]
    if name in KNOWN_SERVICES:
        raise ServiceNotFound(
            f"service {name!r} is not installed; install it with `uv sync` in the repository "
            f"or `pip install {KNOWN_SERVICES[name]}`"
        )
    known = ", ".join(sorted(set(KNOWN_SERVICES) | set(services)))
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
