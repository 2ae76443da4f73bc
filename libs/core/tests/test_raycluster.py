"""Joining Ray (`rlfleet_core.raycluster.connect`).

- `address=local` starts the service's private Ray in a process of its own
  (`rlfleet_core.rayhead`: a steady CI run saw Ray's daemon start hang inside a service
  process, where a thread cannot be stopped); a head that hangs or fails on one of Ray's own
  fixed waits is killed and started again within `start_timeout_s`, other errors are not
  retried; the service then joins it by address, and `shutdown` stops it.
- `ray.init` (joining) is tried again when Ray's own fixed waits run out ("timed out during
  startup", "Timed out waiting for file ...gcs_server_port").

Stand-ins: a `ray` module that records the calls, and a head script that answers as told.
The last test starts a real private Ray; the real path also runs in the rollout, reward and
sandbox pool tests."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from rlfleet_core import raycluster, rayhead
from rlfleet_core.processes import pid_alive
from rlfleet_core.raycluster import RayConfig, connect


class _FlakyRay:
    def __init__(
        self, failures: int, message: str = "The current node timed out during startup."
    ) -> None:
        self.failures = failures
        self.message = message
        self.calls: list[str] = []
        self.addresses: list[str] = []

    def is_initialized(self) -> bool:
        return False

    def init(self, **kwargs: Any) -> None:
        self.calls.append("init")
        self.addresses.append(kwargs["address"])
        if self.failures:
            self.failures -= 1
            raise Exception(self.message)

    def shutdown(self) -> None:
        self.calls.append("shutdown")


# A stand-in head: its n-th start (counted in a file) does what `plan[n]` says: "ready",
# "hang" (ignores stdin, never answers) or an error message; it records its pid and the
# options it got.
_HEAD = """
import json, os, sys, time
folder = sys.argv[1]
plan = json.loads(open(os.path.join(folder, "plan")).read())
n = len(os.listdir(folder)) - 1
open(os.path.join(folder, "start-" + str(n)), "w").write(json.dumps([os.getpid(), sys.argv[2]]))
step = plan[min(n, len(plan) - 1)]
if step == "hang":
    time.sleep(3600)
elif step == "ready":
    print("some of Ray's chatter", flush=True)
    print(READY + json.dumps({"address": "127.0.0.1:" + str(6000 + n)}), flush=True)
    sys.stdin.read()
else:
    print(FAILED + step, flush=True)
    sys.exit(1)
""".replace("READY", repr(rayhead.READY)).replace("FAILED", repr(rayhead.FAILED))


def _stand_in_head(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *plan: str) -> Path:
    folder = tmp_path / "head"
    folder.mkdir()
    (folder / "plan").write_text(__import__("json").dumps(list(plan)))
    monkeypatch.setattr(raycluster, "HEAD_COMMAND", [sys.executable, "-c", _HEAD, str(folder)])
    monkeypatch.setattr(raycluster, "HEAD_ATTEMPT_MIN_S", 1.0)
    monkeypatch.setattr(raycluster, "RETRY_MIN_LEFT_S", 1.0)
    return folder


def _starts(folder: Path) -> list[tuple[int, str]]:
    import json

    return [tuple(json.loads((folder / f"start-{i}").read_text()))  # type: ignore[misc]
            for i in range(len(list(folder.glob("start-*"))))]  # fmt: skip


def _connect(
    ray: _FlakyRay, start_timeout_s: float, monkeypatch: pytest.MonkeyPatch, **extra: Any
) -> bool:
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # the stand-in has no config to refresh

    async def go() -> bool:
        owned = await connect(RayConfig(address="local", start_timeout_s=start_timeout_s, **extra))
        if owned:
            await raycluster.shutdown(True)
        return owned

    return asyncio.run(go())


def test_the_private_ray_is_a_process_of_its_own_joined_by_address(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _stand_in_head(tmp_path, monkeypatch, "ready")
    ray = _FlakyRay(failures=0)
    assert _connect(ray, 60, monkeypatch, num_cpus=3) is True
    assert ray.addresses == ["127.0.0.1:6000"]  # never address="local" in the service
    ((pid, options),) = _starts(folder)
    assert __import__("json").loads(options)["num_cpus"] == 3
    assert not pid_alive(pid), "shutdown leaves the private head running"


def test_a_head_that_hangs_is_killed_and_started_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _stand_in_head(tmp_path, monkeypatch, "hang", "ready")
    ray = _FlakyRay(failures=0)
    assert _connect(ray, 6, monkeypatch) is True
    (hung, _), (second, _) = _starts(folder)
    assert not pid_alive(hung), "the hung head was left running"
    assert ray.addresses == ["127.0.0.1:6001"]
    assert not pid_alive(second)


def test_a_head_failing_on_rays_own_wait_is_retried_other_errors_are_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _stand_in_head(
        tmp_path, monkeypatch, "Timed out waiting for file /tmp/ray/x/gcs_server_port_ab", "ready"
    )
    assert _connect(_FlakyRay(failures=0), 60, monkeypatch) is True
    assert len(_starts(folder)) == 2
    (tmp_path / "other").mkdir()
    other = _stand_in_head(tmp_path / "other", monkeypatch, "bad num_cpus")
    with pytest.raises(RuntimeError, match=r"cannot start a private Ray.*bad num_cpus"):
        _connect(_FlakyRay(failures=0), 60, monkeypatch)
    assert len(_starts(other)) == 1


def test_init_is_tried_again_after_the_raylet_registration_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _stand_in_head(tmp_path, monkeypatch, "ready")
    ray = _FlakyRay(failures=1)
    assert _connect(ray, 120, monkeypatch) is True
    assert ray.calls == ["init", "shutdown", "init", "shutdown"]


def test_init_is_tried_again_after_the_gcs_port_wait_runs_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ray's words when its GCS server is slow to write its port (a CI run with a busy loop
    # per core): "Timed out", capitalised, was not retried before.
    _stand_in_head(tmp_path, monkeypatch, "ready")
    message = "Timed out waiting for file /tmp/ray/session_x/gcs_server_port_ab12"
    ray = _FlakyRay(failures=1, message=message)
    assert _connect(ray, 120, monkeypatch) is True
    assert ray.calls == ["init", "shutdown", "init", "shutdown"]


def test_other_errors_and_a_spent_deadline_are_not_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _stand_in_head(tmp_path, monkeypatch, "ready")
    other = _FlakyRay(failures=1, message="bad num_cpus")
    with pytest.raises(RuntimeError, match="bad num_cpus"):
        _connect(other, 120, monkeypatch)
    assert other.calls == ["init", "shutdown"]
    assert not any(pid_alive(pid) for pid, _ in _starts(folder)), "a failed join left the head"
    monkeypatch.setattr(raycluster, "RETRY_MIN_LEFT_S", 10.0)
    short = _FlakyRay(failures=5)
    with pytest.raises(RuntimeError, match="timed out during startup"):
        _connect(short, 5, monkeypatch)
    assert short.calls == ["init", "shutdown"]


@pytest.mark.budget(90, "starts and stops a real private Ray head")
def test_a_real_private_ray_starts_and_stops_with_the_service() -> None:
    pytest.importorskip("ray")
    import ray

    async def go() -> tuple[int, str]:
        assert await connect(RayConfig(address="local", num_cpus=1, start_timeout_s=240))
        try:
            head = raycluster._head
            assert head is not None
            assert ray.is_initialized()
            assert ray.cluster_resources().get("CPU") == 1.0
            return head.pid, str(ray.get_runtime_context().gcs_address)
        finally:
            await raycluster.shutdown(True)

    pid, address = asyncio.run(go())
    assert address and not address.startswith("local")
    assert not pid_alive(pid)
    assert not ray.is_initialized()


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
