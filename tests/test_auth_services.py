"""Every service, through the shared bootstrap: refuses to start beyond loopback without
a token (saying how to fix it), and with a token refuses unauthenticated gRPC and HTTP
calls while health stays open."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import grpc
import httpx
import pytest
from rlfleet_core.auth import TOKEN_ENV, TOKEN_FILE_ENV, auth_headers, write_token_file
from rlfleet_core.client import check_health
from support import RLFLEET, spawn_bound

# One real, cheap method per service (the bytes are a valid empty request message).
METHODS = {
    "trainer": "/rlfleet.v1.TrainerService/GetStatus",
    "rollout": "/rlfleet.v1.RolloutService/GetStatus",
    "reward": "/rlfleet.v1.RewardService/ListEnvironments",
    "sandbox": "/rlfleet.v1.SandboxService/Execute",
    "swe-runner": "/rlfleet.v1.SweRunnerService/Evaluate",
}
EXTRA_ARGS = {"rollout": ["--engine", "hf", "--model", "tiny"]}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (TOKEN_ENV, TOKEN_FILE_ENV)}
    return {**env, **extra}


@pytest.mark.parametrize("service", list(METHODS))
def test_refuses_to_start_beyond_loopback_without_a_token(service: str) -> None:
    done = subprocess.run(
        [RLFLEET, "serve", service, "--host", "0.0.0.0", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert done.returncode == 1, done.stderr
    assert "server.host=0.0.0.0 is not loopback and no auth token is configured" in done.stderr
    assert "RLFLEET_AUTH_TOKEN_FILE" in done.stderr and "server.auth=off" in done.stderr
    assert "Traceback" not in done.stderr


def _wait_serving(port: int, proc: subprocess.Popen[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        try:
            if check_health(f"127.0.0.1:{port}", timeout_s=2.0) == "SERVING":
                return
        except grpc.RpcError:
            pass
        time.sleep(0.2)
    pytest.fail(f"not SERVING after {timeout_s:.0f} s", pytrace=False)


@pytest.mark.parametrize("service", list(METHODS))
def test_with_a_token_only_health_is_open(service: str, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token = write_token_file(token_file)
    proc, ports = spawn_bound(
        [
            RLFLEET,
            "serve",
            service,
            "--host",
            "0.0.0.0",
            "--http-port",
            "0",
            *EXTRA_ARGS.get(service, []),
        ],
        tmp_path / "ports.json",
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(**{TOKEN_FILE_ENV: str(token_file)}),
    )
    port, http_port = ports.grpc, ports.http
    try:
        # check_health runs here without the token (this process's env has none).
        _wait_serving(port, proc, timeout_s=180)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary(METHODS[service])
            for metadata in ((), (("authorization", "Bearer not-the-token-" + "n" * 20),)):
                with pytest.raises(grpc.RpcError) as err:
                    call(b"", timeout=30, metadata=metadata)
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, service
                assert token not in (err.value.details() or "")
            # With the token the call reaches the service (whatever it answers then).
            try:
                call(b"", timeout=30, metadata=(("authorization", f"Bearer {token}"),))
            except grpc.RpcError as exc:
                assert exc.code() != grpc.StatusCode.UNAUTHENTICATED, exc
        http = f"http://127.0.0.1:{http_port}"
        assert httpx.get(f"{http}/healthz", timeout=10).status_code == 200
        assert httpx.get(f"{http}/metrics", timeout=10).status_code == 401
        metrics = httpx.get(f"{http}/metrics", headers=auth_headers(token), timeout=10)
        assert metrics.status_code == 200 and "rlfleet_grpc_requests_total" in metrics.text
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.communicate()
