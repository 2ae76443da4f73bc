"""`rlfleet rl <stage> --run compose` without Docker: a fake `docker` on PATH records every
call and answers like Docker 20.10 + compose v2 would. Checks the order of the calls
(checks, up --wait, port, trainer, logs, down), what reaches compose and the trainer, that
the stack comes down when the trainer fails and stays up with --keep-up, and the one-line
errors when Docker, compose or an image is missing. tests/test_compose.py runs it for real.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
from rlfleet_pipeline import stage
from rlfleet_pipeline.launch.compose import ComposeError
from rlfleet_pipeline.launch.profiles import ComposeProfile
from rlfleet_pipeline.launchers import launch_plan
from rlfleet_pipeline.recipes import load_recipe
from rlfleet_pipeline.stage import StageError, run_compose

FAKE_DOCKER = """#!{python}
import json, os, sys
args = sys.argv[1:]
log = os.environ["FAKE_DOCKER_LOG"]
with open(log, "a") as f:
    keys = ("ROLLOUT_ENGINE", "ROLLOUT_MODEL", "RLFLEET_AUTH_TOKEN_FILE", "REWARD_SANDBOX_TARGET",
            "REWARD_SWE_TARGET", "REWARD_OVERRIDES", "JUDGE_OVERRIDES", "COMPOSE_PROFILES")
    env = {{k: os.environ.get(k, "") for k in keys}}
    f.write(json.dumps({{"args": args, "env": env}}) + "\\n")
fail = os.environ.get("FAKE_DOCKER_FAIL", "")
if args[:1] == ["info"]:
    if fail == "info":
        sys.stderr.write("Cannot connect to the Docker daemon at unix:///x.sock.\\n")
        sys.exit(1)
    print("20.10.24")
elif args[:2] == ["compose", "version"]:
    if fail == "compose":
        sys.stderr.write("docker: 'compose' is not a docker command.\\n")
        sys.exit(1)
    print("Docker Compose version v2.40.3")
elif args[:2] == ["image", "inspect"]:
    sys.exit(1 if fail == "image" and "rollout" in args[2] else 0)
elif args[:1] == ["compose"]:
    verb = args[5]
    if verb == "config":
        names = ["sandbox", "reward", "rollout", "swe-runner", "trainer", "judge"]
        print(json.dumps({{"services": {{s: {{"image": f"rlfleet/{{s}}:latest"}} for s in names}}}}))
    elif verb == "up" and fail == "up":
        sys.stderr.write("Error response from daemon: port is already allocated\\n")
        sys.exit(1)
    elif verb == "port":
        print({{"rollout": "127.0.0.1:41001", "reward": "127.0.0.1:41002"}}[args[6]])
    elif verb == "logs":
        print("rollout-1  | serving")
"""


@pytest.fixture
def docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake `docker` first on PATH; returns its call log (one JSON object per call)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "docker"
    fake.write_text(FAKE_DOCKER.format(python=sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "docker.log"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_DOCKER_LOG", str(log))
    # The trainer: a process that records its arguments and exits with TRAINER_EXIT.
    trainer_args = tmp_path / "trainer.json"

    def fake_trainer(recipe_file: Path, run_dir: Path, extra: list[str]) -> list[str]:
        code = (
            "import json, os, sys; "
            f"open({str(trainer_args)!r}, 'w').write(json.dumps(sys.argv[1:])); "
            "sys.exit(int(os.environ.get('TRAINER_EXIT', '0')))"
        )
        return [sys.executable, "-c", code, str(recipe_file), str(run_dir), *extra]

    monkeypatch.setattr(stage, "trainer_command", fake_trainer)
    return log


def calls(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def verbs(log: Path) -> list[str]:
    """`info`, `compose version`, `image inspect`, then compose verbs (`up`, `port`, ...)."""
    out = []
    for call in calls(log):
        args = call["args"]
        assert isinstance(args, list)
        out.append(args[5] if args[0] == "compose" and len(args) > 5 else " ".join(args[:2]))
    return out


def profile(tmp_path: Path) -> ComposeProfile:
    compose_file = tmp_path / "compose.yaml"
    compose_file.write_text("services: {}\n")
    return ComposeProfile(compose_file=str(compose_file), project_name="p1", wait_timeout_s=60)


def recipe(*extra: str):  # type: ignore[no-untyped-def]
    return load_recipe("test", ["policy.model=tiny", *extra])


def test_up_train_down(docker: Path, tmp_path: Path) -> None:
    lines: list[str] = []
    run_dir = tmp_path / "run"
    code = run_compose(
        recipe("services.weight_transport=gloo"),
        profile(tmp_path),
        run_dir,
        resume=True,
        engine="hf",
        say=lines.append,
    )
    assert code == 0
    assert verbs(docker) == [
        "info --format",
        "compose version",
        "config",
        "image inspect",
        "image inspect",
        "image inspect",
        "up",
        "port",
        "port",
        "logs",
        "down",
    ]
    up = next(c for c in calls(docker) if c["args"][5:6] == ["up"])  # type: ignore[index]
    assert up["args"] == [
        "compose",
        "-f",
        str(tmp_path / "compose.yaml"),
        "-p",
        "p1",
        "up",
        "-d",
        "--no-deps",
        "--wait",
        "--wait-timeout",
        "60",
        "sandbox",
        "reward",
        "rollout",
    ]
    token_file = (run_dir / "auth_token").absolute()
    assert up["env"] == {
        "ROLLOUT_ENGINE": "hf",
        "ROLLOUT_MODEL": "tiny",
        "RLFLEET_AUTH_TOKEN_FILE": str(token_file),  # compose mounts it as the secret
        "REWARD_SANDBOX_TARGET": "sandbox:50051",
        "REWARD_SWE_TARGET": "",  # an rlvr stage starts no swe-runner
        "REWARD_OVERRIDES": "[]",  # no stage settings of the gateway's own
        "JUDGE_OVERRIDES": "[]",
        "COMPOSE_PROFILES": "",  # the judge's profile stays off
    }
    assert token_file.stat().st_mode & 0o777 == 0o600 and len(token_file.read_text()) > 40
    trainer = json.loads((tmp_path / "trainer.json").read_text())
    assert trainer == [
        str(run_dir / "recipe.yaml"),
        str(run_dir),
        "--resume",
        "services.rollout=127.0.0.1:41001",
        "services.reward=127.0.0.1:41002",
        "services.weight_transport=grpc_stream",
    ]
    assert "policy:\n" in (run_dir / "recipe.yaml").read_text()
    assert (run_dir / "logs" / "compose.log").read_text().startswith("rollout-1  | serving")
    assert any("using grpc_stream" in line for line in lines)


def test_failed_trainer_still_brings_the_stack_down(
    docker: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINER_EXIT", "3")
    assert run_compose(recipe(), profile(tmp_path), tmp_path / "run", False, say=print) == 3
    assert verbs(docker)[-2:] == ["logs", "down"]


def test_keep_up_leaves_it_running(docker: Path, tmp_path: Path) -> None:
    lines: list[str] = []
    run_compose(
        recipe(), profile(tmp_path), tmp_path / "run", False, keep_up=True, say=lines.append
    )
    assert "down" not in verbs(docker)
    assert "docker compose -f" in lines[-1] and lines[-1].endswith("-p p1 down")


@pytest.mark.parametrize(
    ("fail", "expected"),
    [
        ("info", "no Docker engine answers (Cannot connect to the Docker daemon at "),
        ("compose", "install it with deploy/compose/install-compose.sh"),
        (
            "image",
            "rlfleet/rollout:latest not found; build them with "
            "`deploy/docker/build-images.sh rollout`",
        ),
    ],
)
def test_missing_docker_parts_are_one_line_before_anything_starts(
    docker: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail: str, expected: str
) -> None:
    monkeypatch.setenv("FAKE_DOCKER_FAIL", fail)
    with pytest.raises(ComposeError) as info:
        run_compose(recipe(), profile(tmp_path), tmp_path / "run", False)
    assert expected in str(info.value) and "\n" not in str(info.value)
    assert "up" not in verbs(docker)
    assert not (tmp_path / "run").exists()


def test_failed_up_shows_logs_and_still_downs(
    docker: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_DOCKER_FAIL", "up")
    with pytest.raises(ComposeError, match="port is already allocated"):
        run_compose(recipe(), profile(tmp_path), tmp_path / "run", False)
    assert verbs(docker)[-3:] == ["logs", "logs", "down"]
    assert not (tmp_path / "trainer.json").exists()


def test_no_docker_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ComposeError, match=r"^no `docker` CLI on PATH: install Docker"):
        run_compose(recipe(), profile(tmp_path), tmp_path / "run", False)


def test_host_model_folders_are_refused(tmp_path: Path) -> None:
    with pytest.raises(StageError, match="can only serve a bundled model"):
        run_compose(recipe(f"policy.model={tmp_path}"), profile(tmp_path), tmp_path / "r", False)


def test_dry_run_plan(tmp_path: Path) -> None:
    plan = launch_plan(recipe(), profile(tmp_path), Path("runs/rlvr"), engine="hf")
    up, train, down = plan.splitlines()
    assert up.startswith("ROLLOUT_ENGINE=hf ROLLOUT_MODEL=tiny RLFLEET_AUTH_TOKEN_FILE=")
    # The stack and the trainer share the run's token file (docs/security.md).
    token = f"RLFLEET_AUTH_TOKEN_FILE={Path('runs/rlvr/auth_token').absolute()} "
    assert token in up and token in train
    assert up.endswith("-p p1 up -d --no-deps --wait --wait-timeout 60 sandbox reward rollout")
    assert "services.rollout=127.0.0.1:${ROLLOUT_PORT:-50052}" in train
    assert "services.weight_transport=grpc_stream" in train
    assert down.endswith("# unless --keep-up")


def test_a_served_judge_is_the_judge_service(docker: Path, tmp_path: Path) -> None:
    """tiny/rlhf through compose: the `judge` container (profile judge) serves the recipe's
    judge model, and the gateway gets its address, the fleet token and the stage's judge
    settings through REWARD_OVERRIDES (its `command:` is fixed)."""
    rlhf = load_recipe("tiny/rlhf", ["policy.model=smollm2-135m-instruct"])
    assert run_compose(rlhf, profile(tmp_path), tmp_path / "run", False, engine="hf") == 0
    up = next(c for c in calls(docker) if c["args"][5:6] == ["up"])  # type: ignore[index]
    assert up["args"][-3:] == ["reward", "rollout", "judge"]  # type: ignore[index]
    env = up["env"]
    assert isinstance(env, dict) and env["COMPOSE_PROFILES"] == "judge"
    reward = json.loads(env["REWARD_OVERRIDES"])
    assert reward[:2] == ["judge.base_url=http://judge:8000/v1", "judge.fleet_token=true"]
    assert "judge.prefill=true" in reward and "genrm.score_partial=true" in reward
    judge = json.loads(env["JUDGE_OVERRIDES"])
    assert judge == ["engine=hf", "model=smollm2-135m-instruct", "engine_config.max_model_len=1024"]
    with pytest.raises(StageError, match=r"judge\.model=/x"):
        bad = load_recipe("tiny/rlhf", ["policy.model=tiny", "judge.model=/x"])
        run_compose(bad, profile(tmp_path), tmp_path / "r2", False)
