"""`pool.backend=ray`: the verifier workers spread over a real 2-node Ray cluster on this
host (two raylets, so two node ids), through a real service and gRPC. One cluster per
module (Ray is slow to start on a 2-core host), always torn down. No assertion is on time."""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cases import math_row, mcqa_row
from pydantic import ValidationError
from reward_support import RewardServer, score_request, start_reward_server, stop_reward_server
from rlfleet_core.testing import ray_actor_pids, ray_cluster
from rlfleet_proto.v1 import reward_pb2, reward_pb2_grpc
from rlfleet_reward.config import RewardServiceConfig

pytestmark = pytest.mark.slow

# (row, response): math and mcqa, both scored in the worker pool here.
REQUESTS: list[tuple[str, dict[str, Any], str]] = [
    ("math", math_row("0.5"), r"\boxed{\frac{1}{2}}"),
    ("math", math_row("7"), r"\boxed{8}"),
    ("math", math_row("(x+1)^2"), r"\boxed{x^2+2x+1}"),
    ("math", math_row(r"\{2,1\}"), r"\boxed{\{1,2\}}"),
    ("mcqa", mcqa_row("C"), r"\boxed{C}"),
    ("mcqa", mcqa_row("C"), r"\boxed{A}"),
] * 4

COMMON = [
    "environments=[math,mcqa]",
    "placement.mcqa=process",
    "pool.workers=1",
    "timeout_s=20",
]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with ray_cluster(nodes=2) as cluster:
        yield cluster


def ray_server(tmp: Path, cluster: Any, name: str, *extra: str) -> RewardServer:
    return start_reward_server(
        tmp,
        [
            *COMMON,
            "pool.backend=ray",
            f"ray.address={cluster.address}",
            "ray.workers=2",
            "ray.strategy=strict_spread",
            "ray.start_timeout_s=150",
            *extra,
        ],
        name=name,
    )


def score_all(target: str) -> list[Any]:
    with grpc.insecure_channel(target) as channel:
        stub = reward_pb2_grpc.RewardServiceStub(channel)
        futures = [
            stub.Score.future(score_request(env, row, text), timeout=60)
            for env, row, text in REQUESTS
        ]
        return [f.result() for f in futures]


def test_workers_run_on_both_nodes_and_score_as_the_process_pool(
    tmp_path: Path, cluster: Any
) -> None:
    nodes = {cluster.head_node.node_id[:12], _worker_node(cluster)[:12]}
    server = ray_server(tmp_path, cluster, "ray")
    try:
        ray_scores = score_all(server.grpc_target)
    finally:
        assert stop_reward_server(server) == 0, server.log()
    local = start_reward_server(tmp_path, [*COMMON, "pool.workers=2"], name="process")
    try:
        local_scores = score_all(local.grpc_target)
    finally:
        assert stop_reward_server(local) == 0, local.log()

    served = Counter(s.info["ray_node"] for s in ray_scores)
    assert set(served) == nodes, (served, nodes)
    assert [(s.reward, s.failure_kind) for s in ray_scores] == [
        (s.reward, s.failure_kind) for s in local_scores
    ]
    assert [s.reward for s in ray_scores[:6]] == [1.0, 0.0, 1.0, 1.0, 1.0, 0.0]
    assert all("ray_node" not in s.info for s in local_scores)


def test_a_lost_node_moves_calls_to_the_other(tmp_path: Path) -> None:
    """The worker node dies (its raylet and the actor on it are killed): every call still
    gets its right verdict, from the head node's worker; none hangs or errors. A cluster
    of its own: this one loses a node."""
    with ray_cluster(nodes=2) as cluster:
        lose_a_node(tmp_path, cluster)


def lose_a_node(tmp_path: Path, cluster: Any) -> None:
    server = ray_server(tmp_path, cluster, "ray-lost")
    try:
        before = score_all(server.grpc_target)
        head_id = cluster.head_node.node_id[:12]
        assert {s.info["ray_node"] for s in before} == {head_id, _worker_node(cluster)[:12]}
        cluster.remove_node(next(iter(cluster.worker_nodes)))
        after = score_all(server.grpc_target)
        assert {s.info["ray_node"] for s in after} == {head_id}
        assert [s.reward for s in after] == [s.reward for s in before]
        assert "lost" in server.log()
    finally:
        assert stop_reward_server(server) == 0, server.log()


def test_no_worker_left_is_a_clear_failure(tmp_path: Path, cluster: Any) -> None:
    """The only actor's process is SIGKILLed: calls answer VERIFIER_ERROR saying no
    worker is left (not a hang, not an error reply), and the service still stops."""
    server = ray_server(tmp_path, cluster, "ray-one", "ray.workers=1", "ray.strategy=spread")
    try:
        assert score_all(server.grpc_target)[0].reward == 1.0
        nodes = [cluster.head_node, *cluster.worker_nodes]
        pids = [pid for node in nodes for pid in ray_actor_pids(node, "VerifierNode")]
        assert len(pids) == 1, pids
        os.kill(pids[0], signal.SIGKILL)
        after = score_all(server.grpc_target)
        assert {s.failure_kind for s in after} == {reward_pb2.FAILURE_KIND_VERIFIER_ERROR}
        assert all("no Ray verifier worker left" in s.failure_reason for s in after[1:])
    finally:
        assert stop_reward_server(server) == 0, server.log()


def test_too_few_nodes_for_strict_spread_fails_start_with_a_clear_error(
    tmp_path: Path, cluster: Any
) -> None:
    with pytest.raises(RuntimeError, match=r"ray.workers=3.*strict_spread"):
        ray_server(tmp_path, cluster, "ray-3", "ray.workers=3", "ray.start_timeout_s=20")


def test_bad_ray_options_name_the_field() -> None:
    with pytest.raises(ValidationError, match=r"pool.backend"):
        RewardServiceConfig.model_validate({"pool": {"backend": "threads"}})
    with pytest.raises(ValidationError, match=r"ray.strategy"):
        RewardServiceConfig.model_validate({"ray": {"strategy": "scatter"}})


def _worker_node(cluster: Any) -> str:
    return str(next(iter(cluster.worker_nodes)).node_id)
