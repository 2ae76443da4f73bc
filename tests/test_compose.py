"""The service images as a compose stack (deploy/compose/compose.yaml).

1. Brings up sandbox + reward + swe-runner with `docker compose up -d --wait` under a
   unique project name and free loopback ports, checks every service's gRPC health through
   its published port, scores a `code` row end to end (reward container → sandbox
   container over the compose network, `sandbox.target=sandbox:50051`), then `docker
   compose down` and checks that no container or network of the project is left. A
   `swe_agent` episode runs through reward → swe-runner (`swe.target=swe-runner:50051`) →
   an instance container the swe-runner starts through the mounted Docker socket.
2. Runs a tiny RLVR stage with `rlfleet rl rlvr -c test --run compose` (its own project,
   named by an env.toml `[compose]` profile): the CLI brings up sandbox + reward + rollout
   (hf engine, bundled `tiny` model built inside the container), trains two steps on this
   host against the published ports (weights over StreamWeights), and with `--keep-up`
   leaves the stack running so that the rollout's weight version can be read; a `--resume`
   run for one more step then brings it down. Checks the metrics, the ledger (every
   issued prompt accounted for exactly once) and that nothing of the project is left.

Authentication: the services bind 0.0.0.0 in their containers, so they require the fleet
token. The `stack` fixture makes one (RLFLEET_AUTH_TOKEN_FILE, mounted as the compose
secret) and its clients send it; the stage test leaves it to `rlfleet rl --run compose`,
which makes <run>/auth_token itself.

Images are built first (deploy/docker/build-images.sh; Docker's layer cache makes an
unchanged rebuild take seconds). Without Docker (and compose v2) the tests skip, or fail
when RLFLEET_REQUIRE_DOCKER=1. The trainer image is not used: `--run compose` runs the
trainer on the host (docs/containers.md).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest
from rlfleet_core.auth import TOKEN_ENV, TOKEN_FILE_ENV, auth_headers, write_token_file
from rlfleet_core.client import check_health, connect_sync
from rlfleet_core.ports import pick_free_port
from rlfleet_proto.v1 import reward_pb2, reward_pb2_grpc, rollout_pb2, rollout_pb2_grpc
from support import REPO, RLFLEET, ensure_images, require_docker, swe_instance_images

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(1800)]

COMPOSE_FILE = REPO / "deploy/compose/compose.yaml"
SERVICES = ("sandbox", "reward", "swe-runner")
"""Services the `stack` fixture brings up (the RLVR stage test brings up its own)."""
STAGE_SERVICES = ("sandbox", "reward", "rollout")
"""What `rlfleet rl rlvr --run compose` starts (rlfleet_pipeline.stage.SERVICES_FOR_STAGE)."""
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
    token: str = ""

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
    # Numbers compose publishes: needed before any container exists (pick_free_port's race).
    env, grpc_targets, http_urls = {}, {}, {}
    for service, (grpc_var, http_var) in PORT_VARS.items():
        env[grpc_var] = str(pick_free_port())
        grpc_targets[service] = f"127.0.0.1:{env[grpc_var]}"
        if http_var:
            env[http_var] = str(pick_free_port())
            http_urls[service] = f"http://127.0.0.1:{env[http_var]}"
    return env, grpc_targets, http_urls


def _env_without_token() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in (TOKEN_ENV, TOKEN_FILE_ENV)}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    require_docker(compose=True)
    ensure_images(*SERVICES)
    ports, grpc_targets, http_urls = _ports()
    project = f"rlfleet-test-{uuid.uuid4().hex[:8]}"
    token_file = tmp_path_factory.mktemp("compose") / "token"
    token = write_token_file(token_file)
    env = {**_env_without_token(), **ports, TOKEN_FILE_ENV: str(token_file)}
    stack = Stack(project, env, grpc_targets, http_urls, token)
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


@pytest.mark.budget(600, "a compose stack of three images up and down")
def test_every_service_is_healthy_and_loopback_only(stack: Stack) -> None:
    ps = stack.compose("ps", "--format", "json")
    assert ps.returncode == 0, ps.stderr
    rows = [json.loads(line) for line in ps.stdout.splitlines() if line.strip()]
    assert sorted(row["Service"] for row in rows) == sorted(SERVICES)
    for row in rows:
        assert row["State"] == "running" and row["Health"] == "healthy", row
        published = [p for p in row["Publishers"] if p.get("PublishedPort")]
        assert published and all(p["URL"] == "127.0.0.1" for p in published), row["Publishers"]
    for service in SERVICES:  # health needs no token
        assert check_health(stack.grpc[service], timeout_s=5.0) == "SERVING", service


def test_services_refuse_calls_without_the_token(stack: Stack) -> None:
    request = reward_pb2.ListEnvironmentsRequest()
    for token in (None, "wrong-" + "w" * 40):
        metadata = (("authorization", f"Bearer {token}"),) if token else ()
        with grpc.insecure_channel(stack.grpc["reward"]) as channel:
            stub = reward_pb2_grpc.RewardServiceStub(channel)
            with pytest.raises(grpc.RpcError) as err:
                stub.ListEnvironments(request, timeout=30, metadata=metadata)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert stack.token not in (err.value.details() or "")
    reply = httpx.post(f"{stack.http['sandbox']}/execute", json={"generated_code": "1"}, timeout=30)
    assert reply.status_code == 401
    with connect_sync(stack.grpc["reward"], auth_token=stack.token) as channel:
        stub = reward_pb2_grpc.RewardServiceStub(channel)
        assert "code" in {e.name for e in stub.ListEnvironments(request, timeout=30).environments}


def _score(target: str, token: str, row: Mapping[str, object], code: str) -> reward_pb2.ScoreResult:
    with connect_sync(target, auth_token=token, retry=None) as channel:
        stub = reward_pb2_grpc.RewardServiceStub(channel)
        request = reward_pb2.ScoreRequest(
            env="code",
            row_json=json.dumps(row),
            response=reward_pb2.Response(text=f"```python\n{code}```"),
        )
        return stub.Score(request, timeout=90)


def _sandbox_runs(stack: Stack) -> float:
    """rlfleet_sandbox_executions_total summed, from the sandbox's own /metrics."""
    text = httpx.get(
        f"{stack.http['sandbox']}/metrics", headers=auth_headers(stack.token), timeout=10
    ).text
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
    good = _score(stack.grpc["reward"], stack.token, CODE_ROW, "def add(a, b):\n    return a + b\n")
    assert good.failure_kind == reward_pb2.FAILURE_KIND_NONE, good.failure_reason
    assert good.reward == 1.0, dict(good.info)
    bad = _score(stack.grpc["reward"], stack.token, CODE_ROW, "def add(a, b):\n    return a - b\n")
    assert bad.failure_kind == reward_pb2.FAILURE_KIND_NONE, bad.failure_reason
    assert bad.reward == 0.0, dict(bad.info)
    stdin_row = {
        "test_cases": [{"input": "3 4\n", "output": "7\n"}, {"input": "10 -2\n", "output": "8\n"}]
    }
    io = _score(
        stack.grpc["reward"],
        stack.token,
        stdin_row,
        "a, b = map(int, input().split())\nprint(a + b)\n",
    )
    assert io.failure_kind == reward_pb2.FAILURE_KIND_NONE and io.reward == 1.0, dict(io.info)
    # The programs ran in the sandbox container, not somewhere else.
    assert _sandbox_runs(stack) >= runs_before + 3


# --- a tiny RLVR stage through `rlfleet rl rlvr --run compose` -------------------------------


def _reasoning_gym_rows(path: Path, count: int, seed: int) -> None:
    reasoning_gym = pytest.importorskip("reasoning_gym")
    data = reasoning_gym.create_dataset("basic_arithmetic", size=count, seed=seed)
    with path.open("w") as f:
        for i, entry in enumerate(data):
            row = {
                "id": f"arith{seed}-{i}",
                "responses_create_params": {
                    "input": [{"role": "user", "content": entry["question"]}]
                },
                "env": "reasoning_gym",
                "answer": entry["answer"],
                "metadata": entry["metadata"],
            }
            f.write(json.dumps(row) + "\n")


def _rl(workdir: Path, env: Mapping[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    command = [RLFLEET, "rl", "rlvr", "-c", "test", "--run", "compose", "--engine", "hf", *args]
    done = subprocess.run(
        command, cwd=workdir, env=dict(env), capture_output=True, text=True, timeout=900
    )
    print(f"$ {' '.join(command)}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def _verify_ledger(run_dir: Path) -> dict[str, int]:
    from rlfleet_contracts.recipe import RecipeConfig
    from rlfleet_core.config import load_config
    from rlfleet_trainer.ledger import Ledger, verify_ledger
    from rlfleet_trainer.run import build_context

    recipe = load_config(RecipeConfig, str(run_dir / "recipe.yaml"))
    summary = json.loads((run_dir / "summary.json").read_text())
    ctx = build_context(recipe, run_dir.parent / "probe")
    ctx.source.cursor = summary["data_cursor"]
    return verify_ledger(Ledger(run_dir / "ledger.jsonl").entries(), ctx.source.issued_ids())


def _weight_version(target: str, token_file: Path) -> int:
    token = token_file.read_text().strip()
    with connect_sync(target, auth_token=token, retry=None) as channel:
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)
        return int(stub.GetStatus(rollout_pb2.GetStatusRequest(), timeout=30).weight_version)


@pytest.mark.budget(780, "a compose stack of three images up twice (train, then --resume)")
def test_tiny_rlvr_stage_through_run_compose(tmp_path: Path) -> None:
    require_docker(compose=True)
    ensure_images(*STAGE_SERVICES)
    ports, grpc_targets, _ = _ports()
    project = f"rlfleet-stage-{uuid.uuid4().hex[:8]}"
    stack = Stack(project, {**_env_without_token(), **ports}, grpc_targets, {})
    (tmp_path / "env.toml").write_text(
        f'[compose]\nlauncher = "compose"\ncompose_file = "{COMPOSE_FILE}"\n'
        f'project_name = "{project}"\nwait_timeout_s = 300\n'
    )
    _reasoning_gym_rows(tmp_path / "train.jsonl", 12, seed=3)
    _reasoning_gym_rows(tmp_path / "val.jsonl", 4, seed=4)
    run_dir = tmp_path / "run"
    overrides = [
        "policy.model=tiny",
        "policy.dtype=float32",
        "policy.max_total_sequence_length=256",
        "policy.train_micro_batch_size=8",
        "generation.max_new_tokens=16",
        "grpo.num_prompts_per_step=2",
        "grpo.num_generations_per_prompt=4",
        "grpo.lr=1e-3",
        "checkpoint.export_hf=false",
        f"data.train_path={tmp_path / 'train.jsonl'}",
        f"data.val_path={tmp_path / 'val.jsonl'}",
    ]
    try:
        started = time.monotonic()
        first = _rl(
            tmp_path,
            stack.env,
            "--out",
            str(run_dir),
            "--keep-up",
            *overrides,
            "grpo.max_num_steps=2",
        )
        print(f"stage (2 steps, compose up included): {time.monotonic() - started:.0f} s")
        assert first.returncode == 0, first.stderr[-3000:]
        assert (run_dir / "logs" / "compose.log").stat().st_size > 0
        # --keep-up: the stage's services still run, healthy, and nothing else was started.
        assert stack.leftovers(), "--keep-up brought the stack down"
        assert sorted(_service_states(stack)) == sorted(STAGE_SERVICES)
        assert set(_service_states(stack).values()) == {("running", "healthy")}
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["step"] == 2
        # The rollout container got every published version (StreamWeights from the host).
        # `rlfleet rl --run compose` made the fleet token in the run folder (0600).
        token_file = run_dir / "auth_token"
        assert token_file.stat().st_mode & 0o777 == 0o600
        assert (
            _weight_version(grpc_targets["rollout"], token_file) == summary["weight_version"] >= 2
        )
        metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert [m["step"] for m in metrics] == [1, 2]
        for m in metrics:
            assert 0.0 <= m["reward/reasoning_gym"] <= 1.0, m
            # the container's `tiny` (built inside it) is the trainer's: same ids, logprobs
            assert m["token_mult_prob_error"] == pytest.approx(1.0, abs=2e-3), m
        assert _verify_ledger(run_dir)["trained"] == 4

        # One more step from the checkpoint against the running stack; this run brings it down.
        started = time.monotonic()
        second = _rl(
            tmp_path,
            stack.env,
            "--out",
            str(run_dir),
            "--resume",
            *overrides,
            "grpo.max_num_steps=3",
        )
        print(f"resumed stage (1 step, compose down included): {time.monotonic() - started:.0f} s")
        assert second.returncode == 0, second.stderr[-3000:]
        assert json.loads((run_dir / "summary.json").read_text())["step"] == 3
        assert _verify_ledger(run_dir)["trained"] == 6
        ps = stack.compose("ps", "-a", "-q")
        assert ps.returncode == 0 and ps.stdout.strip() == "", ps.stdout
        assert stack.leftovers() == [], f"left behind by project {project}"
    finally:
        if stack.leftovers():
            stack.compose("down", "--timeout", "10", "--volumes", "--remove-orphans")


def _service_states(stack: Stack) -> dict[str, tuple[str, str]]:
    ps = stack.compose("ps", "-a", "--format", "json")
    assert ps.returncode == 0, ps.stderr
    rows = [json.loads(line) for line in ps.stdout.splitlines() if line.strip()]
    return {row["Service"]: (row["State"], row["Health"]) for row in rows}


def test_run_compose_without_images_says_how_to_build(tmp_path: Path) -> None:
    """A missing image is one line naming the build command, before anything starts."""
    require_docker(compose=True)
    (tmp_path / "compose.yaml").write_text(
        "services:\n"
        + "".join(f"  {s}:\n    image: rlfleet-missing/{s}:none\n" for s in STAGE_SERVICES)
    )
    (tmp_path / "env.toml").write_text(
        f'[compose]\nlauncher = "compose"\ncompose_file = "{tmp_path / "compose.yaml"}"\n'
        'project_name = "rlfleet-missing"\n'
    )
    done = _rl(tmp_path, os.environ, "policy.model=tiny", "data.train_path=none.jsonl")
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert "deploy/docker/build-images.sh sandbox reward rollout" in done.stderr
    assert not (tmp_path / "runs").exists()


def test_swe_agent_episode_through_the_stack(stack: Stack) -> None:
    """reward container -> swe-runner container (compose's `swe.target`) -> an instance
    container the swe-runner starts through the mounted Docker socket: the gold fix
    applied with bash and submitted scores 1."""
    import sys

    from rlfleet_swe.images import bundled_instances_dir

    sys.path.insert(0, str(REPO / "services/reward/tests"))
    from episode_support import Caller

    swe_instance_images()  # the bundled instances' images, on the engine the runner uses
    row = json.loads((bundled_instances_dir() / "instances.jsonl").read_text().splitlines()[0])
    with connect_sync(stack.grpc["reward"], auth_token=stack.token) as channel:
        caller = Caller(reward_pb2_grpc.RewardServiceStub(channel))
        episode = caller.open("swe_agent", row)
        apply = f"git apply <<'RLFLEET_EOF'\n{row['patch']}RLFLEET_EOF\n"
        step = caller.step(episode.episode_id, ("bash", {"command": apply}))
        assert step.results[0].content.startswith("exit code: 0"), step.results[0].content
        assert caller.step(episode.episode_id, ("submit", {})).done
        result = caller.close(episode.episode_id)
    assert result.failure_kind == reward_pb2.FAILURE_KIND_NONE, result.failure_reason
    assert result.reward == 1.0, dict(result.info)
