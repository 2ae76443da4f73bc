"""Joining Ray (`rlfleet_core.raycluster.connect`): `ray.init` is tried again when Ray's own
fixed 30 s raylet registration wait runs out (seen on a loaded 2-core CI box: "The
current node timed out during startup"), within `start_timeout_s`, and not for other
errors. A stand-in `ray` module records the calls; the real path runs in the rollout,
reward and sandbox pool tests."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

import pytest
from rlfleet_core.raycluster import RayConfig, connect


class _FlakyRay:
    def __init__(
        self, failures: int, message: str = "The current node timed out during startup."
    ) -> None:
        self.failures = failures
        self.message = message
        self.calls: list[str] = []

    def is_initialized(self) -> bool:
        return False

    def init(self, **kwargs: Any) -> None:
        self.calls.append("init")
        if self.failures:
            self.failures -= 1
            raise Exception(self.message)

    def shutdown(self) -> None:
        self.calls.append("shutdown")


def _connect(ray: _FlakyRay, start_timeout_s: float, monkeypatch: pytest.MonkeyPatch) -> bool:
    monkeypatch.setitem(sys.modules, "ray", ray)
    return asyncio.run(connect(RayConfig(address="local", start_timeout_s=start_timeout_s)))


def test_init_is_tried_again_after_the_raylet_registration_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ray = _FlakyRay(failures=1)
    assert _connect(ray, 120, monkeypatch) is True
    assert ray.calls == ["init", "shutdown", "init"]


def test_init_is_tried_again_after_the_gcs_port_wait_runs_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Ray's words when its GCS server is slow to write its port (a CI run with a busy loop
    # per core): "Timed out", capitalised, was not retried before.
    message = "Timed out waiting for file /tmp/ray/session_x/gcs_server_port_ab12"
    ray = _FlakyRay(failures=1, message=message)
    assert _connect(ray, 120, monkeypatch) is True
    assert ray.calls == ["init", "shutdown", "init"]


def test_other_errors_and_a_spent_deadline_are_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    other = _FlakyRay(failures=1, message="bad num_cpus")
    with pytest.raises(RuntimeError, match="bad num_cpus"):
        _connect(other, 120, monkeypatch)
    assert other.calls == ["init", "shutdown"]
    short = _FlakyRay(failures=5)
    with pytest.raises(RuntimeError, match="timed out during startup"):
        _connect(short, 5, monkeypatch)
    assert short.calls == ["init", "shutdown"]


def test_a_private_ray_is_started_outright(monkeypatch: pytest.MonkeyPatch) -> None:
    """`address=local` is passed to ray.init as `local`: with no address, Ray joins the
    cluster this machine's last `ray start` recorded (another test's or job's) and then
    refuses num_cpus (CI saw the rollout's pool fail so)."""
    ray = _FlakyRay(failures=0)
    seen: dict[str, Any] = {}
    ray.init = lambda **kwargs: seen.update(kwargs)  # type: ignore[method-assign]
    assert _connect(ray, 60, monkeypatch) is True
    assert seen["address"] == "local"


def test_the_test_cluster_waits_longer_for_the_gcs_and_tries_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # `rlfleet_core.testing.ray_cluster` starts Ray through `ray.cluster_utils.Cluster`, not
    # `connect`: a steady run (no hog) lost test_ray_pool's module to the GCS port wait.
    import types

    from rlfleet_core import testing

    events: list[str] = []

    class Cluster:
        failures = 1

        def add_node(self, **kwargs: Any) -> None:
            events.append(f"add wait={os.environ.get('RAY_gcs_server_port_wait_time_s')}")  # noqa: SIM112 Ray's name
            if Cluster.failures:
                Cluster.failures -= 1
                raise RuntimeError("Timed out waiting for file /tmp/ray/x/gcs_server_port_ab")

        def shutdown(self) -> None:
            events.append("shutdown")

    utils = types.ModuleType("ray.cluster_utils")
    utils.Cluster = Cluster  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ray", types.ModuleType("ray"))
    monkeypatch.setitem(sys.modules, "ray.cluster_utils", utils)
    monkeypatch.delenv("RAY_gcs_server_port_wait_time_s", raising=False)
    monkeypatch.setattr("rlfleet_core.raycluster.no_uv_runtime_env", lambda: None)
    with testing.ray_cluster(nodes=1):
        events.append("yield")
    assert events == ["add wait=120", "shutdown", "add wait=120", "yield", "shutdown"]
