"""`rlfleet up` works with authentication out of the box: it makes the fleet token,
prints where it is (never the token), and its services refuse calls without it."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import time
from pathlib import Path

import grpc
import pytest
from rlfleet_core.auth import TOKEN_ENV, TOKEN_FILE_ENV
from rlfleet_core.client import connect_sync
from rlfleet_proto.v1 import sandbox_pb2, sandbox_pb2_grpc
from support import RLFLEET


def _read_until(proc: subprocess.Popen[bytes], out: Path, pattern: str, timeout_s: float) -> str:
    """The output so far, once it matches `pattern` (the process is left running)."""
    seen = ""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen = out.read_text(errors="replace")
        if re.search(pattern, seen):
            return seen
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    pytest.fail(f"no {pattern!r} in `rlfleet up` output:\n{seen}", pytrace=False)


def test_rlfleet_up_makes_and_requires_a_token(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in (TOKEN_ENV, TOKEN_FILE_ENV)}
    env["COLUMNS"] = "400"  # one table row per line
    run_dir = tmp_path / "up"
    log = tmp_path / "up.out"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [RLFLEET, "up", "--services", "sandbox", "--run-dir", str(run_dir)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        pattern = r"auth token: .*RLFLEET_AUTH_TOKEN_FILE=\S+\)"
        out = _read_until(proc, log, pattern, timeout_s=180)
        token_file = run_dir / "auth_token"
        assert f"RLFLEET_AUTH_TOKEN_FILE={token_file}" in out
        assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
        token = token_file.read_text().strip()
        assert token not in out
        # The start-up report: printed and in the run folder.
        assert re.search(r"services SERVING in [\d.]+ s", out), out
        assert re.search(r"sandbox +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+", out), out
        report = json.loads((run_dir / "startup.json").read_text())
        assert report["services"]["sandbox"]["serving_s"] > 0
        target = re.search(r"sandbox\s+│?\s*(127\.0\.0\.1:\d+)", out)
        assert target, out
        request = sandbox_pb2.ExecuteRequest(
            language=sandbox_pb2.LANGUAGE_PYTHON, code="print(6 * 7)"
        )
        with grpc.insecure_channel(target.group(1)) as channel:
            with pytest.raises(grpc.RpcError) as err:
                sandbox_pb2_grpc.SandboxServiceStub(channel).Execute(request, timeout=30)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with connect_sync(target.group(1), auth_token=token) as channel:
            reply = sandbox_pb2_grpc.SandboxServiceStub(channel).Execute(request, timeout=60)
            assert reply.stdout.strip() == "42", reply
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_rlfleet_up_serves_a_judge_for_the_gateway(tmp_path: Path) -> None:
    """`--judge-model` starts a second rollout service (`judge`) and wires the reward
    gateway to its OpenAI face with the fleet's token: a genrm_compare group reaches it
    (the tiny random model writes no verdict, so the failure names the judge's answer,
    not a missing judge)."""
    from rlfleet_proto.v1 import reward_pb2, reward_pb2_grpc

    env = {k: v for k, v in os.environ.items() if k not in (TOKEN_ENV, TOKEN_FILE_ENV)}
    env["COLUMNS"] = "400"
    bad = subprocess.run(
        [RLFLEET, "up", "--services", "reward", "--judge-model", "tiny", "--judge-engine", "x"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert bad.returncode != 0 and "--judge-engine" in bad.stderr and "Traceback" not in bad.stderr
    run_dir = tmp_path / "up"
    log = tmp_path / "up.out"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [RLFLEET, "up", "--services", "reward", "--judge-model", "tiny",
             "--run-dir", str(run_dir)],
            stdout=sink, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    try:
        out = _read_until(proc, log, r"auth token: .*RLFLEET_AUTH_TOKEN_FILE=\S+\)", 300)
        assert set(json.loads((run_dir / "startup.json").read_text())["services"]) == {
            "judge",
            "reward",
        }
        target = re.search(r"reward\s+│?\s*(127\.0\.0\.1:\d+)", out)
        assert target, out
        row = {"responses_create_params": {"input": [{"role": "user", "content": "Hi?"}]}}
        request = reward_pb2.ScoreGroupRequest(
            request_id="g",
            env="genrm_compare",
            row_json=json.dumps(row),
            responses=[reward_pb2.Response(text=t) for t in ("Hello!", "Hi there.")],
        )
        token = (run_dir / "auth_token").read_text().strip()
        with connect_sync(target.group(1), auth_token=token) as channel:
            reply = reward_pb2_grpc.RewardServiceStub(channel).ScoreGroup(request, timeout=240)
        for result in reply.results:
            reason = result.failure_reason
            assert result.failure_kind == reward_pb2.FAILURE_KIND_JUDGE_ERROR, result
            assert "judge.base_url" not in reason and "not a verdict" in reason, reason
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
