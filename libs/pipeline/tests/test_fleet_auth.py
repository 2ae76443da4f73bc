"""A local fleet authenticates out of the box: it makes a token, its services require it,
and rlfleet clients (the reward gateway calling the sandbox, BlockingRewardClient here) send it."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import grpc
import httpx
import pytest
from rlfleet_contracts.reward_client import BlockingRewardClient
from rlfleet_core.auth import TOKEN_ENV, TOKEN_FILE_ENV
from rlfleet_core.client import check_health
from rlfleet_pipeline.fleet import FleetError, LocalFleet
from rlfleet_proto.v1 import reward_pb2, reward_pb2_grpc, sandbox_pb2, sandbox_pb2_grpc

ROW = {
    "prompt": "def add(a, b):\n",
    "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n",
    "entry_point": "add",
}


@pytest.fixture(autouse=True)
def no_token_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.delenv(TOKEN_FILE_ENV, raising=False)


def test_fleet_token_is_required_and_sent_end_to_end(tmp_path: Path) -> None:
    pytest.importorskip("rlfleet_reward")
    pytest.importorskip("rlfleet_sandbox")
    with LocalFleet(["reward", "sandbox"], tmp_path) as fleet:
        token_file = tmp_path / "auth_token"
        assert fleet.token_file == token_file.absolute()
        assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
        assert os.environ[TOKEN_FILE_ENV] == str(token_file.absolute())
        token = token_file.read_text().strip()
        assert len(token) >= 40

        # Without the token: refused, on both services and both faces; health stays open.
        with grpc.insecure_channel(fleet.target("sandbox")) as channel:
            with pytest.raises(grpc.RpcError) as err:
                sandbox_pb2_grpc.SandboxServiceStub(channel).Execute(
                    sandbox_pb2.ExecuteRequest(code="print(1)"), timeout=30
                )
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with grpc.insecure_channel(fleet.target("reward")) as channel:
            with pytest.raises(grpc.RpcError) as err:
                reward_pb2_grpc.RewardServiceStub(channel).ListEnvironments(
                    reward_pb2.ListEnvironmentsRequest(), timeout=30
                )
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert token not in (err.value.details() or "")
        assert check_health(fleet.target("reward"), timeout_s=10) == "SERVING"
        http = f"http://127.0.0.1:{fleet.processes['reward'].http_port}"
        assert httpx.get(f"{http}/healthz", timeout=10).status_code == 200
        verify = httpx.post(f"{http}/verify", json={}, timeout=10)
        assert verify.status_code == 401

        # With it (from the env the fleet set): reward → sandbox works, so the gateway's
        # sandbox client sent the token too (the sandbox refuses calls without it).
        client = BlockingRewardClient(fleet.target("reward"), timeout_s=120)
        try:
            scores = {}
            for name, body in (("right", "return a + b"), ("wrong", "return a - b")):
                text = f"```python\ndef add(a, b):\n    {body}\n```\n"
                scores[name] = client.score_group(name, "code", ROW, [(text, 10)])[0].reward
        finally:
            client.close()
        assert scores == {"right": 1.0, "wrong": 0.0}
        right = httpx.post(
            f"{http}/verify",
            json={**ROW, "env": "code", "response": json.dumps({})},
            headers={"authorization": f"Bearer {token}"},
            timeout=60,
        )
        assert right.status_code != 401
    assert TOKEN_FILE_ENV not in os.environ  # restored


def test_fleet_uses_the_callers_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token = "caller-token-" + "k" * 30
    monkeypatch.setenv(TOKEN_ENV, token)
    with LocalFleet(["swe-runner"], tmp_path) as fleet:
        assert fleet.token_file is None and not (tmp_path / "auth_token").exists()
        with grpc.insecure_channel(fleet.target("swe-runner")) as channel:
            stub = channel.unary_unary("/grpc.reflection.v1alpha.ServerReflection/Nope")
            with pytest.raises(grpc.RpcError) as err:
                stub(b"", timeout=10)
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
            reflection = channel.stream_stream(
                "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
            )
            with pytest.raises(grpc.RpcError) as err:
                list(reflection(iter([b""]), timeout=10))
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert list(
                reflection(
                    iter([b""]), timeout=10, metadata=(("authorization", f"Bearer {token}"),)
                )
            )


def test_a_bad_token_setting_is_a_fleet_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_FILE_ENV, str(tmp_path / "missing"))
    with pytest.raises(FleetError, match=f"{TOKEN_FILE_ENV}=.*cannot read"):
        LocalFleet(["swe-runner"], tmp_path).start()
