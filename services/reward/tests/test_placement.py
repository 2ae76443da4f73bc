"""Where verification runs (placement.py): per-environment defaults and config overrides,
and every guarantee of the worker pool kept by checks placed on the event loop or in a
thread (budgets and deadlines, failures with a reason, back-pressure, a live /healthz),
through a real service. The `probe` environments (reward_test_envs.py) report which
process and thread scored them. No assertion is on time."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import TypeVar

import grpc
import httpx
import pytest
from grpc import aio
from pydantic import ValidationError
from reward_support import RewardServer, module_stub, running_reward_server, score_request
from rlfleet_proto.v1 import reward_pb2, reward_pb2_grpc
from rlfleet_reward.config import RewardServiceConfig
from rlfleet_reward.environments import get_environment
from rlfleet_reward.types import FailureKind

T = TypeVar("T")

PROBES = (
    "{probe: reward_test_envs:ProbeEnvironment, "
    "thread_probe: reward_test_envs:ThreadProbeEnvironment, "
    "process_probe: reward_test_envs:ProcessProbeEnvironment}"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RewardServer]:
    with running_reward_server(
        tmp_path_factory.mktemp("placement"),
        [
            "environments=[math,structured_outputs]",
            f"extra_environments={PROBES}",
            "placement.thread_probe=thread",
            "placement.process_probe=process",
            "pool.workers=1",
            "pool.kill_grace_s=0.5",
            "pool.threads=1",
            "pool.max_queue=2",
            "timeout_s=3",
        ],
    ) as server:
        yield server


stub = module_stub()


def _score(
    stub: reward_pb2_grpc.RewardServiceStub, env: str, text: str, timeout: float = 30
) -> reward_pb2.ScoreResult:
    result: reward_pb2.ScoreResult = stub.Score(score_request(env, {}, text), timeout=timeout)
    return result


def _where_scored(stub: reward_pb2_grpc.RewardServiceStub, env: str) -> tuple[str, str]:
    """The process id and thread name that scored a probe's `ok` (which must not fail)."""
    result = _score(stub, env, "ok")
    assert result.failure_kind == FailureKind.NONE.value, result.failure_reason
    return result.info["pid"], result.info["thread"]


def _assert_raise_is_a_verifier_error(stub: reward_pb2_grpc.RewardServiceStub, env: str) -> None:
    result = _score(stub, env, "raise")
    assert FailureKind(result.failure_kind) is FailureKind.VERIFIER_ERROR
    assert result.failure_reason == f"{env} verifier raised ValueError: probe failure"


def _metrics(server: RewardServer) -> str:
    return httpx.get(f"{server.http_url}/metrics", timeout=10).text


# --- choosing a placement ------------------------------------------------------------------


def test_defaults_follow_measured_cost() -> None:
    for env in ("structured_outputs", "mcqa", "instruction_following", "tool_use"):
        assert get_environment(env).placement == "loop", env
    for env in ("math", "reasoning_gym"):
        assert get_environment(env).placement == "process", env


@pytest.mark.parametrize(
    ("placement", "message"),
    [
        ({"nope": "loop"}, "placement.nope: unknown or not served environment"),
        ({"math": "gpu"}, "placement.math: must be one of loop, thread, process, got 'gpu'"),
        ({"structured_outputs": "thread"}, "placement.structured_outputs: cannot be thread"),
    ],
)
def test_bad_placement_is_a_config_error(placement: dict[str, str], message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        RewardServiceConfig(placement=placement)


def test_placement_of_an_environment_not_served_is_refused() -> None:
    with pytest.raises(ValidationError, match=re.escape("placement.mcqa: unknown or not served")):
        RewardServiceConfig(environments=["math"], placement={"mcqa": "loop"})
    assert RewardServiceConfig(placement={"math": "thread"}).placement == {"math": "thread"}


def test_bad_placement_on_the_command_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "rlfleet_reward", "placement.math=gpu"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode != 0
    assert "placement.math: must be one of loop, thread, process" in done.stderr + done.stdout


# --- loop ----------------------------------------------------------------------------------


def test_inline_check_runs_on_the_event_loop(
    server: RewardServer, stub: reward_pb2_grpc.RewardServiceStub
) -> None:
    assert _where_scored(stub, "probe") == (str(server.process.pid), "MainThread")
    assert 'rlfleet_reward_verify_seconds_count{env="probe",placement="loop"}' in _metrics(server)


def test_inline_exception_is_a_verifier_error(stub: reward_pb2_grpc.RewardServiceStub) -> None:
    _assert_raise_is_a_verifier_error(stub, "probe")


def test_inline_overrun_is_scored_again_in_a_worker(
    server: RewardServer, stub: reward_pb2_grpc.RewardServiceStub
) -> None:
    # 0.3 s of CPU: over pool.inline_budget_s (0.05), well within timeout_s (3).
    result = _score(stub, "probe", "spin 0.3")
    assert result.failure_kind == FailureKind.NONE.value, result.failure_reason
    assert result.reward == 1.0
    assert result.info["pid"] != str(server.process.pid)  # the verdict came from a worker
    assert 'rlfleet_reward_inline_overruns_total{env="probe"}' in _metrics(server)


def test_an_overrun_swallowed_by_a_finalizer_still_stops_the_check(
    server: RewardServer, stub: reward_pb2_grpc.RewardServiceStub
) -> None:
    """The guard's alarm lands inside a `__del__`, which swallows its exception (Python
    prints "Exception ignored in ..."); the next alarm stops the check, and the service's
    log shows no traceback for it. (A CI run's log once had three.)"""
    result = _score(stub, "probe", "finalizer 0.3")
    assert result.failure_kind == FailureKind.NONE.value, result.failure_reason
    assert result.reward == 1.0
    assert result.info["pid"] != str(server.process.pid)  # stopped inline, scored in a worker
    assert "Exception ignored" not in server.log() and "_Overrun" not in server.log()


def test_inline_check_honours_the_call_deadline(stub: reward_pb2_grpc.RewardServiceStub) -> None:
    result = _score(stub, "probe", "spin 600", timeout=2.0)
    assert FailureKind(result.failure_kind) is FailureKind.TIMEOUT, result.failure_reason


def _nested_any_of(depth: int) -> tuple[str, str]:
    """A schema whose check is exponential in the answer's depth (jsonschema tries both
    branches of every anyOf: depth 14 took ~4.6 s, each level doubles it) and an answer
    that fails only at the bottom."""
    branch = {"type": "array", "items": {"$ref": "#/$defs/node"}}
    schema = {
        "$defs": {"node": {"anyOf": [branch, {**branch, "minItems": 0}]}},
        "$ref": "#/$defs/node",
    }
    answer: object = "x"
    for _ in range(depth):
        answer = [answer]
    return json.dumps(schema), json.dumps(answer)


async def _await_polling_healthz(
    server: RewardServer, call: Awaitable[T], probe_timeout_s: float
) -> tuple[T, int]:
    """`call`'s answer, and how many times /healthz (asked every 50 ms, each a 200)
    answered while it was pending."""
    pending = asyncio.ensure_future(call)
    healthy = 0
    async with httpx.AsyncClient(timeout=probe_timeout_s) as client:
        while not pending.done():
            reply = await client.get(f"{server.http_url}/healthz")
            assert reply.status_code == 200, reply.text
            healthy += 1
            await asyncio.sleep(0.05)
    return await pending, healthy


async def test_pathological_schema_inline_does_not_stall_healthz(server: RewardServer) -> None:
    schema, answer = _nested_any_of(24)  # hours of CPU if nothing stopped it
    request = score_request("structured_outputs", {"schema_str": schema}, answer)
    async with aio.insecure_channel(server.grpc_target) as channel:
        stub = reward_pb2_grpc.RewardServiceStub(channel)
        result, healthy = await _await_polling_healthz(
            server, stub.Score(request, timeout=60), probe_timeout_s=10.0
        )
    assert FailureKind(result.failure_kind) is FailureKind.TIMEOUT, result.failure_reason
    # The loop answered /healthz again and again while the answer was being scored.
    assert healthy >= 3, healthy


async def test_large_inline_group_does_not_stall_healthz(server: RewardServer) -> None:
    # 250 checks of 40 ms each, all ready at once: back to back they held the loop 10 s.
    request = reward_pb2.ScoreGroupRequest(
        env="probe", row_json="{}", responses=[reward_pb2.Response(text="sleep 0.04")] * 250
    )
    async with aio.insecure_channel(server.grpc_target) as channel:
        stub = reward_pb2_grpc.RewardServiceStub(channel)
        reply, healthy = await _await_polling_healthz(
            server, stub.ScoreGroup(request, timeout=60), probe_timeout_s=5.0
        )
    assert healthy >= 3, healthy
    # timeout_s=3 covers waiting for the loop too: the first answers score, the rest that
    # waited past 3 s are TIMEOUT failures; none is an error or a silent 0.
    assert reply.results[0].reward == 1.0, reply.results[0].failure_reason
    for result in reply.results:
        kind = FailureKind(result.failure_kind)
        assert kind is FailureKind.TIMEOUT or (kind is FailureKind.NONE and result.reward == 1.0)


# --- thread --------------------------------------------------------------------------------


def test_thread_placement_scores_in_a_verifier_thread(
    server: RewardServer, stub: reward_pb2_grpc.RewardServiceStub
) -> None:
    pid, thread = _where_scored(stub, "thread_probe")
    assert pid == str(server.process.pid) and thread.startswith("rlfleet-verify")
    _assert_raise_is_a_verifier_error(stub, "thread_probe")


def test_thread_placement_pushes_back_when_full(stub: reward_pb2_grpc.RewardServiceStub) -> None:
    # pool.threads=1 + pool.max_queue=2: a group of 4 does not fit, and is refused whole.
    request = reward_pb2.ScoreGroupRequest(
        env="thread_probe", row_json="{}", responses=[reward_pb2.Response(text="ok")] * 4
    )
    with pytest.raises(grpc.RpcError) as caught:
        stub.ScoreGroup(request, timeout=30)
    assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "verifier threads full" in (caught.value.details() or "")


def test_thread_check_past_its_deadline_is_a_timeout(
    stub: reward_pb2_grpc.RewardServiceStub,
) -> None:
    result = _score(stub, "thread_probe", "sleep 4", timeout=1.5)
    assert FailureKind(result.failure_kind) is FailureKind.TIMEOUT, result.failure_reason
    assert "(thread)" in result.failure_reason


# --- process -------------------------------------------------------------------------------


def test_process_placed_envs_are_unaffected(
    server: RewardServer, stub: reward_pb2_grpc.RewardServiceStub
) -> None:
    assert _where_scored(stub, "process_probe")[0] != str(server.process.pid)
    math = stub.Score(score_request("math", {"expected_answer": "3"}, r"\boxed{3}"), timeout=30)
    assert math.failure_kind == FailureKind.NONE.value and math.reward == 1.0
    hung = _score(stub, "process_probe", "spin 600")  # the worker's own timeout stops it
    assert FailureKind(hung.failure_kind) is FailureKind.TIMEOUT, hung.failure_reason
    text = _metrics(server)
    assert 'rlfleet_reward_verify_seconds_count{env="math",placement="process"}' in text
    assert 'rlfleet_reward_verify_seconds_count{env="process_probe",placement="process"}' in text
