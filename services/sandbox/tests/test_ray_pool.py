"""`pool.backend=ray`: sandboxes on the nodes of a real 2-node Ray cluster on this host
(two raylets, so two node ids), through the real faces and real bubblewrap. One cluster
per module (Ray is slow to start on a 2-core host), always torn down. No assertion is on
time."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from pydantic import ValidationError
from rlfleet_core.raycluster import RayConfig
from rlfleet_core.testing import ray_actor_pids, ray_cluster
from rlfleet_sandbox.config import PoolConfig, SandboxServiceConfig, SessionsConfig
from sandbox_testlib import Harness, make_config, start_harness, stop_harness
from sandbox_testlib import wait_no_sandbox_processes as no_sandbox_left

pytestmark = pytest.mark.slow

# Outside the sandbox: the host's /etc and this checkout; no network but loopback.
ISOLATION_PROBE = (
    "import os, socket\n"
    "s = socket.socket()\n"
    "try:\n"
    "    s.connect(('{host}', {port})); net = 'open'\n"
    "except OSError:\n"
    "    net = 'closed'\n"
    "print(os.path.exists('/etc/hostname'), os.path.exists('{repo}'), net)\n"
)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with ray_cluster(nodes=2) as cluster:
        yield cluster


def ray_config(cluster: Any, **ray: Any) -> SandboxServiceConfig:
    return make_config(
        pool=PoolConfig(size=2, kill_grace_s=1.0, backend="ray"),
        sessions=SessionsConfig(max_sessions=8, reap_interval_s=0.1),
        ray=RayConfig(
            **{
                "address": cluster.address,
                "workers": 2,
                "strategy": "strict_spread",
                "start_timeout_s": 150,
                "call_timeout_s": 20,
                **ray,
            }
        ),
    )


def node_ids(cluster: Any) -> tuple[str, str]:
    """(head, worker) node ids as the service reports them."""
    worker = next(iter(cluster.worker_nodes))
    return cluster.head_node.node_id[:12], worker.node_id[:12]


async def execute(harness: Harness, code: str, session_id: str = "") -> dict[str, Any]:
    body: dict[str, Any] = {"generated_code": code, "language": "python3", "timeout": 10}
    if session_id:
        body |= {"session_id": session_id, "language": "ipython"}
    response = await harness.http.post("/execute", json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


async def test_runs_and_sessions_go_to_both_nodes_isolated(cluster: Any) -> None:
    harness = await start_harness(ray_config(cluster))
    try:
        runs = await asyncio.gather(*(execute(harness, f"print({i} * 7)") for i in range(8)))
        assert [r["stdout"] for r in runs] == [f"{i * 7}\n" for i in range(8)]
        assert {r["ray_node"] for r in runs} == set(node_ids(cluster))

        probe = ISOLATION_PROBE.format(
            host="127.0.0.1", port=harness.running.grpc_port, repo=__file__
        )
        for _ in range(4):  # both warm sandboxes, so both nodes
            seen = await execute(harness, probe)
            assert seen["stdout"] == "False False closed\n", seen

        sessions = [f"s{i}" for i in range(4)]
        for sid in sessions:
            await execute(harness, f"x = {sid[1:]}", sid)
        cells = [await execute(harness, "x += 10; print(x)", sid) for sid in sessions]
        assert [c["stdout"] for c in cells] == ["10\n", "11\n", "12\n", "13\n"]
        again = [await execute(harness, "print(x)", sid) for sid in sessions]
        # Each session's cells stay on the node that holds its interpreter.
        assert [a["ray_node"] for a in again] == [c["ray_node"] for c in cells]
        assert {c["ray_node"] for c in cells} == set(node_ids(cluster))
    finally:
        await stop_harness(harness)
    left = await asyncio.to_thread(no_sandbox_left)
    assert not left, f"sandbox processes outlived the service: {left}"


async def test_a_killed_node_actor_moves_runs_and_resets_its_sessions(cluster: Any) -> None:
    """The worker node's actor process is SIGKILLed (its sandboxes die with it): one-shot
    runs go to the head node and succeed, the session held there resets cleanly (an error
    that says so, then a fresh interpreter on the head node), the other keeps its state."""
    harness = await start_harness(ray_config(cluster))
    head, worker = node_ids(cluster)
    try:
        for sid in ("a", "b"):
            await execute(harness, "x = 1", sid)
        where = {sid: (await execute(harness, "print(x)", sid))["ray_node"] for sid in "ab"}
        assert set(where.values()) == {head, worker}
        on_worker = next(sid for sid, node in where.items() if node == worker)
        on_head = next(sid for sid, node in where.items() if node == head)

        pids = ray_actor_pids(next(iter(cluster.worker_nodes)), "SandboxNode")
        assert len(pids) == 1, pids
        os.kill(pids[0], signal.SIGKILL)

        runs = [await execute(harness, "print(6 * 7)") for _ in range(4)]
        assert [(r["process_status"], r["stdout"]) for r in runs] == [("completed", "42\n")] * 4
        assert {r["ray_node"] for r in runs} == {head}

        # Its actor was found lost by the runs above: the next cell says the state is
        # gone and runs on a fresh interpreter on the head node.
        lost = await execute(harness, "print(x)", on_worker)
        assert lost["session_reset"] is True and "NameError" in lost["stderr"], lost
        assert lost["ray_node"] == head
        fresh = await execute(harness, "x = 5; print(x)", on_worker)
        assert fresh["stdout"] == "5\n" and "session_reset" not in fresh, fresh
        kept = await execute(harness, "print(x)", on_head)
        assert kept["stdout"] == "1\n" and kept["ray_node"] == head
    finally:
        await stop_harness(harness)
    left = await asyncio.to_thread(no_sandbox_left)
    assert not left, f"sandbox processes outlived the service: {left}"


async def test_no_node_left_is_a_clear_refusal(cluster: Any) -> None:
    """The only actor's process is SIGKILLed: a run is refused with UNAVAILABLE saying no
    sandbox can be started (once the replacements gave up), not left waiting."""
    harness = await start_harness(ray_config(cluster, workers=1, strategy="spread"))
    try:
        assert (await execute(harness, "print(1)"))["stdout"] == "1\n"
        nodes = [cluster.head_node, *cluster.worker_nodes]
        pids = [pid for node in nodes for pid in ray_actor_pids(node, "SandboxNode")]
        assert len(pids) == 1, pids
        os.kill(pids[0], signal.SIGKILL)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await harness.run("print(1)")
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "no Ray sandbox node can start a sandbox" in str(info.value.details())
    finally:
        await stop_harness(harness)
    left = await asyncio.to_thread(no_sandbox_left)
    assert not left, f"sandbox processes outlived the service: {left}"


async def test_too_few_nodes_for_strict_spread_fails_start_clearly(cluster: Any) -> None:
    config = ray_config(cluster, workers=3, start_timeout_s=20)
    with pytest.raises(RuntimeError, match=r"ray.workers=3.*strict_spread"):
        await start_harness(config)


def test_bad_ray_options_name_the_field() -> None:
    with pytest.raises(ValidationError, match=r"pool.backend"):
        SandboxServiceConfig.model_validate({"pool": {"backend": "k8s"}})
    with pytest.raises(ValidationError, match=r"ray.workers"):
        SandboxServiceConfig.model_validate({"ray": {"workers": 0}})
