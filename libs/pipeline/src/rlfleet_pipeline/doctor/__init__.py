"""`rlfleet doctor`: is this machine ready to run rlfleet, and how to fix what is not.

Every check returns one `Check` (ok / warn / fail, what was found, and for a miss the
exact command that fixes it). `fail` is kept for what a run needs (Python, bubblewrap,
torch, vLLM when the engine is vllm, a loopback port, disk space); what only some paths
need (docker for the container launchers, the compose ports, GPUs) is at most `warn`.
`rlfleet run` calls `require_ready` before it writes anything or starts a service.

Checks run real things: bwrap starts a sandbox as the sandbox service does, torch and
vLLM are imported in child processes (with deadlines: an import that hangs is a miss,
not a hung doctor), ports are bound.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rlfleet_pipeline.doctor import builds, system, wheels
from rlfleet_pipeline.doctor.check import Check, Status

__all__ = ["Check", "NotReady", "Status", "require_ready", "run_checks", "to_json"]


class NotReady(Exception):
    """A required check failed; `checks` holds every check (the failed ones among them)."""

    def __init__(self, checks: Sequence[Check]) -> None:
        self.checks = list(checks)
        self.failed = [c for c in checks if c.status == "fail"]
        super().__init__("\n".join(c.line() for c in self.failed))


def run_checks(*, engine: str = "vllm", out: Path = Path("runs"), fix: bool = False) -> list[Check]:
    """Every check, in a fixed order. The slow ones (child processes importing torch and
    vLLM, the bwrap sandbox) run side by side. `fix` rewrites mismatched WHEEL tags (the
    only change the doctor makes)."""
    probes: list[Callable[[], list[Check]]] = [
        lambda: [system.check_python()],
        lambda: [system.check_uv()],
        lambda: [system.check_bwrap()],
        lambda: [system.check_docker()],
        builds.check_torch_and_gpus,
        lambda: [builds.check_vllm(required=engine == "vllm")],
        lambda: builds.check_vllm_cpu_needs(required=engine == "vllm"),
        system.check_ports,
        lambda: system.check_disk(out),
        lambda: [wheels.check_wheel_tags(fix=fix)],
    ]
    with ThreadPoolExecutor(max_workers=len(probes)) as pool:
        return [check for found in pool.map(lambda probe: probe(), probes) for check in found]


def require_ready(*, engine: str, out: Path) -> list[Check]:
    """The checks, or NotReady when a required one failed."""
    checks = run_checks(engine=engine, out=out)
    if any(c.status == "fail" for c in checks):
        raise NotReady(checks)
    return checks


def to_json(checks: Sequence[Check]) -> str:
    return json.dumps([c.to_json() for c in checks], indent=2)
