"""The fleet view's snapshot against a fake run folder: services from the port files, a
down service with its reason and without a hang, health and /metrics of a stand-in
service (gRPC health + an HTTP /metrics that wants the folder's token), rates over two
snapshots, and the reward curve of the newest stage."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2_grpc
from rlfleet_core.auth import TOKEN_ENV, TOKEN_FILE_ENV, write_token_file
from rlfleet_core.ports import write_port_file
from rlfleet_pipeline.fleet_view import FleetView, NoServices, parse_metrics, read_reward


@pytest.fixture(autouse=True)
def no_token_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.delenv(TOKEN_FILE_ENV, raising=False)


def port_file(run_dir: Path, name: str, grpc_port: int, http: int | None, pid: int) -> None:
    """What a service writes at start-up (the pid is written as this process's: patch it)."""
    path = run_dir / "logs" / f"{name}.ports.json"
    write_port_file(path, grpc_port, http)
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "pid": pid}))


METRICS = """# HELP rlfleet_grpc_in_flight gRPC calls being handled now.
# TYPE rlfleet_grpc_in_flight gauge
rlfleet_grpc_in_flight{service="reward"} 3.0
rlfleet_grpc_requests_total{code="OK",method="/rlfleet.v1.RewardService/Score",service="reward"} %d.0
rlfleet_grpc_requests_total{code="OK",method="/grpc.health.v1.Health/Check",service="reward"} %d.0
rlfleet_reward_pool_queue_depth 7.0
rlfleet_reward_value_sum{env="math"} 3.0
rlfleet_reward_value_count{env="math"} 4.0
"""


@pytest.fixture
def stand_in(tmp_path: Path) -> Iterator[tuple[Path, list[str | None], list[int]]]:
    """A 'reward' service: gRPC health SERVING, /metrics that needs the folder's token."""
    run_dir = tmp_path / "run"
    token = write_token_file(run_dir / "auth_token")
    seen: list[str | None] = []
    calls = [100]

    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("authorization"))
            ok = self.headers.get("authorization") == f"Bearer {token}"
            body = (METRICS % (calls[0], 10 * calls[0])).encode() if ok else b"unauthenticated"
            self.send_response(200 if ok else 401)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    http = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    server = grpc.server(ThreadPoolExecutor(2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    grpc_port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    port_file(run_dir, "reward", grpc_port, http.server_address[1], os.getpid())
    try:
        yield run_dir, seen, calls
    finally:
        server.stop(0)
        http.shutdown()
        http.server_close()


def test_no_port_files_says_how_to_start_a_fleet(tmp_path: Path) -> None:
    with pytest.raises(NoServices, match=r"rlfleet up --run-dir"):
        FleetView(tmp_path).snapshot()


def test_stand_in_service_health_metrics_token_and_rates(
    stand_in: tuple[Path, list[str | None], list[int]],
) -> None:
    run_dir, seen, calls = stand_in
    view = FleetView(run_dir)
    first = view.snapshot()
    (reward,) = first.services
    assert (reward.name, reward.health, reward.reason) == ("reward", "SERVING", "")
    assert first.all_serving and not first.problems
    assert seen and seen[-1] is not None and seen[-1].startswith("Bearer ")  # the folder's
    assert reward.in_flight == 3.0
    assert reward.queues == {"verifier queue": 7.0}
    assert first.gateway_reward == {"math": 0.75}
    assert reward.rates == {}  # one snapshot: no rate yet
    calls[0] = 160
    time.sleep(0.3)
    second = view.snapshot().services[0]
    rate = second.rates["calls/s"]
    assert 0 < rate <= 60 / 0.3  # 60 calls over at least 0.3 s; health checks left out


def test_wrong_token_is_a_problem_not_a_crash(
    stand_in: tuple[Path, list[str | None], list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir, _, _ = stand_in
    monkeypatch.setenv(TOKEN_ENV, "x" * 32)  # the environment's token wins, and is wrong
    snap = FleetView(run_dir).snapshot()
    assert snap.services[0].health == "SERVING"  # health needs no token
    assert any("reward /metrics" in p and "401" in p for p in snap.problems), snap.problems


def test_down_services_show_why_without_hanging(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    port_file(run_dir, "sandbox", 1, None, gone.pid)
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    port_file(run_dir, "rollout", closed, None, os.getpid())
    started = time.monotonic()
    snap = FleetView(run_dir, timeout_s=0.5).snapshot()
    assert time.monotonic() - started < 5
    states = {s.name: s for s in snap.services}
    assert states["sandbox"].health == "down"
    assert f"process {gone.pid} has exited" in states["sandbox"].reason
    assert states["rollout"].health == "down"
    assert states["rollout"].reason.startswith(("UNAVAILABLE", "DEADLINE_EXCEEDED"))
    assert not snap.all_serving and snap.rollouts == []


def test_reward_curve_from_the_newest_stage(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    old = run_dir / "stages" / "rlvr1" / "metrics.jsonl"
    new = run_dir / "stages" / "rlhf" / "metrics.jsonl"
    for path in (old, new):
        path.parent.mkdir(parents=True)
    old.write_text(json.dumps({"step": 1, "reward/mean": 0.9}) + "\n")
    rows = [
        {"step": 1, "reward/mean": 0.2, "reward/math": 0.1, "policy_lag/mean": 0.5},
        {"step": 2, "reward/mean": 0.4, "reward/math": 0.3, "policy_lag/mean": 1.0},
    ]
    new.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 3, "rew')
    os.utime(old, (time.time() - 60, time.time() - 60))
    port_file(run_dir, "rollout", 1, None, 2**22 + 12345)  # a pid that cannot exist
    snap = FleetView(run_dir).snapshot()
    assert snap.reward is not None and snap.reward.stage == "rlhf"
    assert [p["reward/mean"] for p in snap.reward.curve] == [0.2, 0.4]  # partial line skipped
    assert snap.reward.by_env == {"mean": 0.4, "math": 0.3}
    assert snap.trainer is not None and snap.trainer.step == 2
    assert snap.trainer.policy_lag_mean == 1.0
    json.dumps(snap.to_json())  # what --json and /api/snapshot send


def test_reward_of_an_empty_metrics_file(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text("")
    assert read_reward(tmp_path / "metrics.jsonl") == (None, {})


def test_parse_metrics_labels_and_comments() -> None:
    samples = parse_metrics(
        '# TYPE x counter\nx_total{a="1",b="q\\"uote"} 2.5\ny 3\nbad line\nz NaNx\n'
    )
    assert samples == [("x_total", {"a": "1", "b": 'q\\"uote'}, 2.5), ("y", {}, 3.0)]


def test_an_unreadable_token_file_is_shown_not_raised(
    stand_in: tuple[Path, list[str | None], list[int]],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    run_dir, _, _ = stand_in
    monkeypatch.setenv(TOKEN_FILE_ENV, str(tmp_path / "missing"))
    snap = FleetView(run_dir).snapshot()
    assert snap.services[0].health == "down"
    assert "cannot read the token file" in snap.services[0].reason
    assert any("cannot read the token file" in p for p in snap.problems)
