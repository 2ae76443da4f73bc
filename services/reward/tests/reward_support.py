"""Helpers for the reward tests: a real reward service in a subprocess (gRPC + HTTP on
loopback) and request builders. A module of its own (not conftest) so that tests import it
by a name no other package's tests use."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from cases import Case
from rlfleet_core.client import check_health
from rlfleet_core.ports import pick_free_port, wait_for_port_file
from rlfleet_proto.v1 import reward_pb2, reward_pb2_grpc
from rlfleet_reward.types import FailureKind

TESTS_DIR = Path(__file__).resolve().parent  # on the workers' PYTHONPATH: reward_test_envs
PARITY_DIR = TESTS_DIR.parent / "parity"
if str(PARITY_DIR) not in sys.path:  # its Responses-object builders (generate.py)
    sys.path.insert(0, str(PARITY_DIR))

import generate  # noqa: E402

TEST_ENVS = (
    "{hang: reward_test_envs:HangEnvironment, crash: reward_test_envs:CrashEnvironment, "
    "big: reward_test_envs:BigEnvironment}"
)


def free_port() -> int:
    """A port nothing listens on a moment ago: for an address that should refuse
    (a service under test binds port 0 itself, see `start_reward_server`)."""
    return pick_free_port()


@dataclass
class RewardServer:
    process: subprocess.Popen[bytes]
    grpc_target: str
    http_url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]


def start_reward_server(tmp: Path, overrides: list[str], name: str = "reward") -> RewardServer:
    log_path = tmp / f"{name}.log"
    port_file = tmp / f"{name}.ports.json"
    port_file.unlink(missing_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")]),
        "PYTHONWARNINGS": "ignore::SyntaxWarning",
    }
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rlfleet_reward",
            "--port",
            "0",
            "--http-port",
            "0",
            "--port-file",
            str(port_file),
            *overrides,
        ],
        stdout=log_path.open("wb"),
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        ports = wait_for_port_file(port_file, process, timeout_s=180)
    except RuntimeError as exc:
        process.kill()
        raise RuntimeError(f"reward server {exc}:\n{log_path.read_text()[-3000:]}") from None
    target, http_port = f"127.0.0.1:{ports.grpc}", ports.http
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"reward server exited with {process.returncode}:\n{log_path.read_text()[-3000:]}"
            )
        try:
            if check_health(target, timeout_s=1.0) == "SERVING":
                return RewardServer(process, target, f"http://127.0.0.1:{http_port}", log_path)
        except grpc.RpcError:
            pass
        time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"reward server not SERVING after 180s:\n{log_path.read_text()[-3000:]}")


def stop_reward_server(server: RewardServer) -> int:
    server.process.send_signal(signal.SIGTERM)
    try:
        return server.process.wait(30)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait(5)
        raise


@contextmanager
def running_reward_server(
    tmp: Path, overrides: list[str], name: str = "reward"
) -> Iterator[RewardServer]:
    """A reward service for the block; it must stop cleanly (exit code 0) after it."""
    server = start_reward_server(tmp, overrides, name)
    try:
        yield server
    finally:
        assert stop_reward_server(server) == 0, server.log()


@contextmanager
def reward_stub(server: RewardServer) -> Iterator[reward_pb2_grpc.RewardServiceStub]:
    with grpc.insecure_channel(server.grpc_target) as channel:
        yield reward_pb2_grpc.RewardServiceStub(channel)


def module_stub() -> Any:
    """A module-scoped `stub` fixture on the module's own `server` fixture (in place of
    conftest's, which talks to the session's service): `stub = module_stub()`."""

    @pytest.fixture(scope="module")
    def stub(server: RewardServer) -> Iterator[reward_pb2_grpc.RewardServiceStub]:
        with reward_stub(server) as module_stub:
            yield module_stub

    return stub


def score_request(
    env: str, row: dict[str, Any] | str, text: str, num_tokens: int = 0, request_id: str = ""
) -> reward_pb2.ScoreRequest:
    row_json = row if isinstance(row, str) else json.dumps(row)
    return reward_pb2.ScoreRequest(
        request_id=request_id,
        env=env,
        row_json=row_json,
        response=reward_pb2.Response(text=text, num_tokens=num_tokens),
    )


def check_case_over_grpc(stub: reward_pb2_grpc.RewardServiceStub, env: str, case: Case) -> None:
    """Score's answer to a table case: the reward, failure kind and info it states, or
    INVALID_ARGUMENT naming its `invalid_field`."""
    request = score_request(
        env, case.row, case.text, case.num_tokens, request_id=f"{env}-{case.id}"
    )
    if case.invalid_field is not None:
        with pytest.raises(grpc.RpcError) as err:
            stub.Score(request, timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details().startswith(case.invalid_field + ":"), err.value.details()
        return
    result = stub.Score(request, timeout=30)
    assert result.request_id == f"{env}-{case.id}" and result.env == env
    assert FailureKind(result.failure_kind) is case.failure, result.failure_reason
    assert result.reward == pytest.approx(case.reward), dict(result.info)
    assert sum(result.reward_components.values()) == pytest.approx(result.reward)
    assert result.reward_components, "a scored result names its components"
    assert not result.mask_sample
    assert result.latency_s > 0
    for key, value in case.info.items():
        assert result.info[key] == value, dict(result.info)


def nemo_response(
    text: str,
    *,
    reasoning: str = "",
    output_tokens: int | None = None,
    function_calls: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """An OpenAI Responses object as NeMo-Gym's model server returns it (the parity
    generator's builders: one shape for both)."""
    output = [generate.reasoning(reasoning)] if reasoning else []
    output += [
        generate.function_call(call["name"], call["arguments"], i)
        for i, call in enumerate(function_calls or [])
    ]
    if text:
        output.append(generate.message(text))
    response = generate.response(output)
    if output_tokens is not None:
        response["usage"] = {
            "input_tokens": 10,
            "output_tokens": output_tokens,
            "total_tokens": 10 + output_tokens,
        }
    return response


def nemo_request(prompt: str, response: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": prompt}]},
        "response": response,
        **fields,
    }
