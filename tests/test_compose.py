"""The service images as a compose stack (deploy/compose/compose.yaml).

Brings up sandbox + reward + swe-runner with `docker compose up -d --wait` under a
unique project name and free loopback ports, checks every service's gRPC health through
its published port, scores a `code` row end to end (reward container → sandbox container
over the compose network, `sandbox.target=sandbox:50051`), then `docker compose down`
and checks that no container or network of the project is left.

rollout and trainer (torch, vLLM images) are not started yet: SERVICES lists the
services brought up. Missing images are built first (deploy/docker/build-images.sh).
Without Docker (and compose v2) the tests skip, or fail when RLFLEET_REQUIRE_DOCKER=1.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import grpc
import httpx
import pytest
from rlfleet_core.client import check_health
from rlfleet_proto.v1 import reward_pb2, reward_pb2_grpc
from support import REPO, ensure_images, free_port, require_docker

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(1800)]

COMPOSE_FILE = REPO / "deploy/compose/compose.yaml"
SERVICES = ("sandbox", "reward", "swe-runner")
"""Services this test brings up; rollout and trainer join once their images build."""
# compose.yaml's published-port variables, per service: (gRPC, HTTP or None).
PORT_VARS = {
    "sandbox": ("SANDBOX_PORT", "SANDBOX_HTTP_PORT"),
    "reward": ("REWARD_PORT", "REWARD_HTTP_PORT"),
    "rollout": ("ROLLOUT_PORT", "ROLLOUT_HTTP_PORT"),
    "swe-runner": ("SWE_PORT", None),
    "trainer": ("TRAINER_PORT", None),
}


@dataclass
class Stack:
    project: str
    env: dict[str, str]
    grpc: dict[str, str]  # service -> 127.0.0.1:port
    http: dict[str, str]  # service -> http://127.0.0.1:port

    def compose(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["docker", "compose", "-p", self.project, "-f", str(COMPOSE_FILE), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def leftovers(self) -> list[str]:
        """Containers and networks still labelled with this project."""
        label = f"label=com.docker.compose.project={self.project}"
        found = []
        for listing in (["ps", "-a"], ["network", "ls"]):
            ids = subprocess.run(
                ["docker", *listing, "-q", "--filter", label],
                capture_output=True,
                text=True,
                timeout=60,
            ).stdout.split()
            found += [f"{listing[0]} {id_}" for id_ in ids]
        return found


def _ports() -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    env, grpc_targets, http_urls = {}, {}, {}
    for service, (grpc_var, http_var) in PORT_VARS.items():
        env[grpc_var] = str(free_port())
        grpc_targets[service] = f"127.0.0.1:{env[grpc_var]}"
        if http_var:
            env[http_var] = str(free_port())
            http_urls[service] = f"http://127.0.0.1:{env[http_var]}"
    return env, grpc_targets, http_urls


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    require_docker(compose=True)
    ensure_images(*SERVICES)
    ports, grpc_targets, http_urls = _ports()
    project = f"rlfleet-test-{uuid.uuid4().hex[:8]}"
    stack = Stack(project, {**os.environ, **ports}, grpc_targets, http_urls)
    try:
        up = stack.compose("up", "-d", "--wait", "--wait-timeout", "240", *SERVICES)
        if up.returncode != 0:
            logs = stack.compose("logs", "--no-color", "--tail", "60").stdout
            pytest.fail(
                f"docker compose up failed (exit {up.returncode}):\n{up.stderr[-2000:]}\n"
                f"--- logs ---\n{logs[-4000:]}",
                pytrace=False,
            )
        yield stack
    finally:
        down = stack.compose("down", "--timeout", "10", "--volumes", "--remove-orphans")
        assert down.returncode == 0, down.stderr
        assert stack.leftovers() == [], f"left behind by project {project}"


def test_every_service_is_healthy_and_loopback_only(stack: Stack) -> None:
    ps = stack.compose("ps", "--format", "json")
    assert ps.returncode == 0, ps.stderr
    rows = [json.loads(line) for line in ps.stdout.splitlines() if line.strip()]
    assert sorted(row["Service"] for row in rows) == sorted(SERVICES)
    for row in rows:
        assert row["State"] == "running" and row["Health"] == "healthy", row
        published = [p for p in row["Publishers"] if p.get("PublishedPort")]
        assert published and all(p["URL"] == "127.0.0.1" for p in published), row["Publishers"]
    for service in SERVICES:
        assert check_health(stack.grpc[service], timeout_s=5.0) == "SERVING", service


def _score(target: str, row: Mapping[str, object], code: str) -> reward_pb2.ScoreResult:
    with grpc.insecure_channel(target) as channel:
        stub = reward_pb2_grpc.RewardServiceStub(channel)
        request = reward_pb2.ScoreRequest(
            env="code",
            row_json=json.dumps(row),
            response=reward_pb2.Response(text=f"```python\n{code}```"),
        )
        return stub.Score(request, timeout=90)


def _sandbox_runs(stack: Stack) -> float:
    """rlfleet_sandbox_executions_total summed, from the sandbox's own /metrics."""
    text = httpx.get(f"{stack.http['sandbox']}/metrics", timeout=10).text
    return sum(
        float(m)
        for m in re.findall(r"^rlfleet_sandbox_executions_total\{[^}]*\} ([0-9.e+]+)$", text, re.M)
    )


CODE_ROW = {
    "prompt": 'def add(a: int, b: int) -> int:\n    """Return a + b."""\n',
    "entry_point": "add",
    "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n",
}


def test_reward_scores_code_in_the_sandbox_container(stack: Stack) -> None:
    runs_before = _sandbox_runs(stack)
    good = _score(stack.grpc["reward"], CODE_ROW, "def add(a, b):\n    return a + b\n")
    assert good.failure_kind == reward_pb2.FAILURE_KIND_NONE, good.failure_reason
    assert good.reward == 1.0, dict(good.info)
    bad = _score(stack.grpc["reward"], CODE_ROW, "def add(a, b):\n    return a - b\n")
    assert bad.failure_kind == reward_pb2.FAILURE_KIND_NONE, bad.failure_reason
    assert bad.reward == 0.0, dict(bad.info)
    stdin_row = {
        "test_cases": [{"input": "3 4\n", "output": "7\n"}, {"input": "10 -2\n", "output": "8\n"}]
    }
    io = _score(stack.grpc["reward"], stdin_row, "a, b = map(int, input().split())\nprint(a + b)\n")
    assert io.failure_kind == reward_pb2.FAILURE_KIND_NONE and io.reward == 1.0, dict(io.info)
    # The programs ran in the sandbox container, not somewhere else.
    assert _sandbox_runs(stack) >= runs_before + 3
