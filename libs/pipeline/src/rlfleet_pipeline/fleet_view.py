"""A snapshot of a running fleet, read from its run folder: what `rlfleet status` prints
and `rlfleet ui` serves.

Given an `rlfleet up` / `rlfleet run` / `rlfleet rl` folder, the services are found from
`logs/<service>.ports.json` (written by each service, `rlfleet_core.ports`), then asked:

- gRPC health (open without a token): SERVING / NOT_SERVING, or `down` with the reason
  (its process is gone, the call failed);
- GetStatus of rollout services (`rollout`, `judge`): weight version, replicas, queue,
  tokens/s; of the trainer service: step, phase, weight version;
- each service's Prometheus `/metrics` on its HTTP port: calls in flight, queue gauges,
  and counters that two snapshots turn into rates (`FleetView` keeps the last ones);
- the newest stage's `metrics.jsonl`: the reward curve, reward per environment, policy lag.

Every call has a short deadline and every failure becomes a line in the snapshot, so a
dead or hung service shows as down instead of stalling the view. GetStatus and /metrics
need the fleet's token: RLFLEET_AUTH_TOKEN(_FILE) when set, else <run_dir>/auth_token.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
from rlfleet_contracts.run_folder import PipelineFolder
from rlfleet_core.auth import AuthError, auth_headers, token_from_env
from rlfleet_core.client import check_health, connect_sync
from rlfleet_core.ports import read_port_file
from rlfleet_core.processes import pid_alive
from rlfleet_proto.v1 import rollout_pb2, rollout_pb2_grpc, trainer_pb2, trainer_pb2_grpc

ROLLOUT_SERVICES = ("rollout", "judge")
"""Services that answer rlfleet.v1.RolloutService/GetStatus (`judge` is a second rollout)."""
CURVE_POINTS = 500
"""The reward curve keeps the last this many steps (the page redraws it every poll)."""
QUEUE_GAUGES = {
    "rlfleet_reward_pool_queue_depth": "verifier queue",
    "rlfleet_sandbox_pool_waiting": "runs waiting",
}
"""Queue-depth gauges some services export, and what the view calls them."""
RATE_COUNTERS = {
    "rlfleet_grpc_requests_total": "calls/s",
    "rlfleet_rollout_generated_tokens_total": "tokens/s",
    "rlfleet_reward_results_total": "scores/s",
}
"""Counters shown as per-second rates between two snapshots."""
OBSERVER_METHODS = ("GetStatus", "GetBuildInfo")
"""gRPC calls left out of calls/s besides health: what observers such as this view call."""


class NoServices(RuntimeError):
    """The folder has no logs/*.ports.json: no fleet was ever started there."""


@dataclass
class ServiceState:
    name: str
    target: str
    http_port: int | None
    pid: int
    health: str = "down"
    """SERVING, NOT_SERVING, ... (gRPC health), or `down` when it did not answer."""
    reason: str = ""
    in_flight: float | None = None
    queues: dict[str, float] = field(default_factory=dict)
    rates: dict[str, float] = field(default_factory=dict)


@dataclass
class RolloutState:
    service: str
    model: str
    engine: str
    weight_version: int
    replicas: int
    paused: bool
    waiting: int
    running: int
    tokens_per_s: float
    tokens_generated: int


@dataclass
class TrainerState:
    stage: str = ""
    phase: str = ""
    step: int | None = None
    total_steps: int | None = None
    weight_version: int | None = None
    versions_ahead: int | None = None
    """Trainer weight version minus the oldest rollout's: updates not yet served."""
    policy_lag_mean: float | None = None
    """From metrics.jsonl: weight versions between a sample's generation and its training."""
    policy_lag_max: float | None = None


@dataclass
class RewardState:
    stage: str
    path: str
    by_env: dict[str, float]
    """The last step's reward/<env> (reward/mean under `mean`)."""
    curve: list[dict[str, float]]
    """[{"step": n, "reward/mean": r, "reward/<env>": r...}, ...], oldest first."""


@dataclass
class Snapshot:
    run_dir: str
    time: float
    services: list[ServiceState]
    rollouts: list[RolloutState]
    trainer: TrainerState | None
    reward: RewardState | None
    gateway_reward: dict[str, float]
    """Mean reward the reward service scored per environment, from its /metrics."""
    problems: list[str]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def all_serving(self) -> bool:
        return all(s.health == "SERVING" for s in self.services)


def fleet_token(run_dir: Path) -> str | None:
    """The token to send: the environment's, else the one the fleet wrote to the folder."""
    token = token_from_env()
    if token is not None:
        return token
    path = PipelineFolder(run_dir).auth_token
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def find_services(run_dir: Path) -> dict[str, tuple[str, int | None, int]]:
    """{service: (grpc target, http port, pid)} from logs/*.ports.json."""
    found: dict[str, tuple[str, int | None, int]] = {}
    for path in sorted(PipelineFolder(run_dir).logs.glob("*.ports.json")):
        try:
            ports = read_port_file(path)
        except (ValueError, KeyError, OSError):
            continue  # half-written or foreign file: not a service of ours
        if ports is not None:
            found[path.name.removesuffix(".ports.json")] = (
                f"127.0.0.1:{ports.grpc}",
                ports.http,
                ports.pid,
            )
    if not found:
        raise NoServices(
            f"no services in {run_dir} (no {PipelineFolder(run_dir).logs}/*.ports.json); "
            "start some with `rlfleet up --run-dir DIR` (or `rlfleet run` / `rlfleet rl`) "
            "and point this at DIR"
        )
    return found


_SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Prometheus text format -> (name, labels, value) samples (comments skipped)."""
    samples = []
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if line.startswith("#") or match is None:
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        samples.append((match.group(1), dict(_LABEL.findall(match.group(2) or "")), value))
    return samples


def fetch_metrics(
    http_port: int, token: str | None, timeout_s: float
) -> list[tuple[str, dict[str, str], float]]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{http_port}/metrics", headers=auth_headers(token or "")
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as reply:
        return parse_metrics(reply.read().decode(errors="replace"))


def _rpc_reason(exc: grpc.RpcError) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else ""
    return f"{code.name if code else 'error'}: {details or 'no answer'}"


def newest_metrics(run_dir: Path) -> Path | None:
    """The metrics.jsonl of a stage folder, or the newest stage's of a pipeline folder."""
    own = run_dir / "metrics.jsonl"
    candidates = [own] if own.exists() else []
    candidates += (run_dir / "stages").glob("*/metrics.jsonl")
    return max(candidates, key=lambda p: p.stat().st_mtime, default=None)


def read_reward(path: Path) -> tuple[RewardState | None, dict[str, float]]:
    """The reward curve of a metrics.jsonl, and its last row (for the policy lag)."""
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # the trainer is appending this line right now
        if isinstance(row, dict):
            rows.append(row)
    curve = [
        {"step": float(row["step"]) if _number(row.get("step")) else float(i + 1)}
        | {k: float(v) for k, v in row.items() if k.startswith("reward/") and _number(v)}
        for i, row in enumerate(rows)
    ]
    if not rows:
        return None, {}
    last = curve[-1]
    by_env = {k.removeprefix("reward/"): v for k, v in last.items() if k.startswith("reward/")}
    stage = path.parent.name
    reward = RewardState(stage, str(path), by_env, curve[-CURVE_POINTS:])
    return reward, {k: float(v) for k, v in rows[-1].items() if _number(v)}


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == value


class FleetView:
    """Snapshots of one run folder; keeps the last counters so rates span two snapshots."""

    def __init__(self, run_dir: Path, timeout_s: float = 1.0) -> None:
        self.run_dir = run_dir
        self.timeout_s = timeout_s
        self._counters: dict[str, tuple[float, dict[str, float]]] = {}

    def snapshot(self) -> Snapshot:
        services = find_services(self.run_dir)  # NoServices: nothing to show
        problems: list[str] = []
        try:
            token = fleet_token(self.run_dir)
        except AuthError as exc:
            token = None
            problems.append(str(exc))
        states: list[ServiceState] = []
        rollouts: list[RolloutState] = []
        trainer_status: trainer_pb2.TrainerStatus | None = None
        gateway: dict[str, float] = {}
        for name, (target, http_port, pid) in services.items():
            state = ServiceState(name, target, http_port, pid)
            states.append(state)
            if not pid_alive(pid):
                state.reason = f"process {pid} has exited"
                continue
            try:
                state.health = check_health(target, timeout_s=self.timeout_s)
            except grpc.RpcError as exc:
                state.reason = _rpc_reason(exc)
                continue
            except AuthError as exc:  # an unreadable token or TLS file named in the env
                state.reason = str(exc)
                continue
            try:
                if name in ROLLOUT_SERVICES:
                    rollouts.append(self._rollout(name, target, token))
                elif name == "trainer":
                    trainer_status = self._trainer(target, token)
            except grpc.RpcError as exc:
                problems.append(f"{name} GetStatus: {_rpc_reason(exc)}")
            except AuthError as exc:
                problems.append(f"{name} GetStatus: {exc}")
            if http_port:
                try:
                    metrics = fetch_metrics(http_port, token, self.timeout_s)
                except (OSError, urllib.error.URLError) as exc:
                    problems.append(f"{name} /metrics: {exc}")
                else:
                    self._read_metrics(state, metrics, gateway)
        reward: RewardState | None = None
        last_row: dict[str, float] = {}
        path = newest_metrics(self.run_dir)
        if path is not None:
            reward, last_row = read_reward(path)
        return Snapshot(
            run_dir=str(self.run_dir),
            time=time.time(),
            services=states,
            rollouts=rollouts,
            trainer=_trainer_state(trainer_status, rollouts, last_row, reward),
            reward=reward,
            gateway_reward=gateway,
            problems=problems,
        )

    def _rollout(self, name: str, target: str, token: str | None) -> RolloutState:
        with connect_sync(
            target, default_timeout_s=self.timeout_s, retry=None, auth_token=token
        ) as ch:
            status = rollout_pb2_grpc.RolloutServiceStub(ch).GetStatus(
                rollout_pb2.GetStatusRequest(), timeout=self.timeout_s
            )
        return RolloutState(
            service=name,
            model=status.model,
            engine=status.engine,
            weight_version=status.weight_version,
            replicas=status.num_replicas,
            paused=status.paused,
            waiting=status.requests_waiting,
            running=status.requests_running,
            tokens_per_s=round(status.tokens_per_s, 2),
            tokens_generated=status.tokens_generated,
        )

    def _trainer(self, target: str, token: str | None) -> trainer_pb2.TrainerStatus:
        with connect_sync(
            target, default_timeout_s=self.timeout_s, retry=None, auth_token=token
        ) as ch:
            return trainer_pb2_grpc.TrainerServiceStub(ch).GetStatus(
                trainer_pb2.GetTrainerStatusRequest(), timeout=self.timeout_s
            )

    def _read_metrics(
        self,
        state: ServiceState,
        samples: list[tuple[str, dict[str, str], float]],
        gateway: dict[str, float],
    ) -> None:
        counters: dict[str, float] = {}
        sums: dict[str, float] = {}
        counts: dict[str, float] = {}
        for name, labels, value in samples:
            if name == "rlfleet_grpc_in_flight":
                state.in_flight = (state.in_flight or 0.0) + value
            elif name in QUEUE_GAUGES:
                state.queues[QUEUE_GAUGES[name]] = value
            elif name == "rlfleet_grpc_requests_total" and _observer_call(labels):
                continue  # health checks and status polls (this view's own) are not work
            elif name in RATE_COUNTERS:
                counters[name] = counters.get(name, 0.0) + value
            elif name == "rlfleet_reward_value_sum":
                sums[labels.get("env", "?")] = value
            elif name == "rlfleet_reward_value_count":
                counts[labels.get("env", "?")] = value
        gateway.update({env: round(sums.get(env, 0.0) / n, 4) for env, n in counts.items() if n})
        now = time.monotonic()
        before = self._counters.get(state.name)
        self._counters[state.name] = (now, counters)
        if before is not None and now > before[0]:
            for name, value in counters.items():
                if name in before[1]:  # a restarted service starts its counters again
                    rate = max(0.0, value - before[1][name]) / (now - before[0])
                    state.rates[RATE_COUNTERS[name]] = round(rate, 2)


def _observer_call(labels: dict[str, str]) -> bool:
    method = labels.get("method", "")
    return "grpc.health." in method or method.endswith(OBSERVER_METHODS)


def _trainer_state(
    status: trainer_pb2.TrainerStatus | None,
    rollouts: list[RolloutState],
    last_row: dict[str, float],
    reward: RewardState | None,
) -> TrainerState | None:
    """The trainer service's status where one runs, else what metrics.jsonl says."""
    if status is None and not last_row:
        return None
    state = TrainerState(
        policy_lag_mean=last_row.get("policy_lag/mean"),
        policy_lag_max=last_row.get("policy_lag/max"),
    )
    if status is not None:
        state.stage, state.phase = status.stage, status.phase
        state.step, state.total_steps = status.step, status.total_steps
        state.weight_version = status.weight_version
        served = [r.weight_version for r in rollouts if r.service == "rollout"]
        if served:
            state.versions_ahead = status.weight_version - min(served)
    elif "step" in last_row:
        state.step = int(last_row["step"])
        state.stage = reward.stage if reward is not None else ""
    return state
