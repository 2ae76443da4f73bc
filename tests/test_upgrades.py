"""Independent upgrades, proven on the wire: the previous release's code (tests/releases.json:
its commit, unpacked with `git archive`) runs against today's, in both directions, on a tiny
GRPO stage with real processes on loopback (hf engine, the bundled tiny model,
reasoning-gym rewards):

- the previous trainer (its clients.py and libs/proto stubs) against today's rollout and
  reward services;
- today's trainer against the previous release's rollout and reward services.

Each stage crosses versions on Generate, ScoreGroup, weight updates (StreamWeights, or
InitWeightTransfer + UpdateWeights for gloo) and GetStatus. The previous code runs from its
own source tree on PYTHONPATH, ahead of this venv's editable installs, on the venv's
third-party packages: one uv.lock serves both (docs/upgrades.md says what to do when it
no longer does)."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from rlfleet_core.client import connect_sync
from rlfleet_core.versions import git_commit, remote_build
from rlfleet_proto.v1 import common_pb2, common_pb2_grpc, rollout_pb2, rollout_pb2_grpc
from support import REPO, start_service, stop_service

pytestmark = pytest.mark.budget(180, "a tiny stage across two releases' processes")

pytest.importorskip("rlfleet_rollout", reason="the rollout service package is not installed")
pytest.importorskip("rlfleet_reward", reason="the reward service package is not installed")
reasoning_gym = pytest.importorskip("reasoning_gym")

RELEASES = json.loads((REPO / "tests" / "releases.json").read_text())


@dataclass(frozen=True)
class Release:
    tag: str
    commit: str
    root: Path
    env: dict[str, str]
    """Environment that makes `python -m rlfleet_*` import this release's code."""

    @property
    def has_build_service(self) -> bool:
        return "service BuildService" in (self.root / "protos/rlfleet/v1/common.proto").read_text()


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Release:
    tag = RELEASES["previous"]
    commit = RELEASES["releases"][tag]["commit"]
    if not (REPO / ".git").exists():
        pytest.skip(f"no git history here ({REPO}/.git is absent): cannot unpack {tag} ({commit})")
    if _git("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        # A shallow clone (some CI checkouts) lacks the release: say so, loudly, rather
        # than fail every landing on how the checkout was made.
        pytest.skip(
            f"{tag} ({commit}) is not in this clone (a shallow clone?); "
            f"run `git fetch --unshallow` or clone with full history to run this test"
        )
    archive = _git("archive", "--format=tar", commit, "libs", "services", "protos")
    assert archive.returncode == 0, archive.stderr.decode()
    root = tmp_path_factory.mktemp(f"release-{tag}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(root, filter="data")
    sources = sorted(str(p) for p in (*root.glob("libs/*/src"), *root.glob("services/*/src")))
    env = {"PYTHONPATH": os.pathsep.join(sources)}
    return Release(tag, commit, root, env)


def _python(release_env: dict[str, str] | None, *args: str, cwd: Path, timeout: float):  # type: ignore[no-untyped-def]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    env.pop("PYTHONPATH", None)
    env.update(release_env or {})
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_the_previous_release_runs_its_own_code(previous: Release, tmp_path: Path) -> None:
    """The PYTHONPATH trick really swaps the code: every rlfleet module the old trainer and
    services import comes from the unpacked release, and its wire contract is one today's
    only extends (the previous baseline's fields and methods, unchanged, are all here)."""
    probe = (
        "import json, rlfleet_proto.v1.common_pb2 as c, rlfleet_core.server, "
        "rlfleet_trainer.clients, rlfleet_rollout.grpc_face, rlfleet_reward.grpc_face, sys\n"
        "print(json.dumps({n: m.__file__ for n, m in sys.modules.items() "
        "if n.startswith('rlfleet') and getattr(m, '__file__', None)}))"
    )
    result = _python(previous.env, "-c", probe, cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    files = json.loads(result.stdout)
    assert len(files) > 10
    assert all(Path(f).is_relative_to(previous.root) for f in files.values()), files
    old = json.loads((previous.root / "libs/proto/wire_baseline.json").read_text())
    new = json.loads((REPO / "libs/proto/wire_baseline.json").read_text())
    changed = [
        f"{name}.{member}"
        for name, members in old.items()
        for member, shape in members.items()
        if new.get(name, {}).get(member) != shape
    ]
    assert changed == []


def _rows(path: Path, count: int = 10) -> Path:
    data = reasoning_gym.create_dataset("basic_arithmetic", size=count, seed=3)
    rows = [
        {
            "id": f"arith{i}",
            "responses_create_params": {"input": [{"role": "user", "content": entry["question"]}]},
            "env": "reasoning_gym",
            "answer": entry["answer"],
            "metadata": entry["metadata"],
        }
        for i, entry in enumerate(data)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def model() -> Path:
    from rlfleet_core.models import resolve_model

    return resolve_model("tiny")


@dataclass
class Services:
    rollout: str
    reward: str


@pytest.fixture
def services_of(model: Path, tmp_path: Path) -> Iterator[object]:
    """Starts rollout (hf engine, tiny model) and reward (reasoning-gym) of a release
    (None: today's code); stops them at the end of the test."""
    started: list[subprocess.Popen[bytes]] = []

    def start(release: Release | None) -> Services:
        env = {"OMP_NUM_THREADS": "1", **(release.env if release else {})}
        if release is None:
            env["PYTHONPATH"] = ""
        # 0.1.0's services take `--port N` only (no `--port-file`)
        new = release is None
        rollout, rollout_target = start_service(
            "rlfleet_rollout",
            ["engine=hf", f"model={model}"],
            tmp_path / "rollout.log",
            env,
            port_file=new,
        )
        started.append(rollout)
        reward, reward_target = start_service(
            "rlfleet_reward",
            ["environments=[reasoning_gym]", "pool.workers=1"],
            tmp_path / "reward.log",
            env,
            port_file=new,
        )
        started.append(reward)
        return Services(rollout_target, reward_target)

    yield start
    for process in started:
        stop_service(process)


def _train(
    release: Release | None,
    model: Path,
    services: Services,
    run_dir: Path,
    *,
    transport: str,
    steps: int,
    resume: bool = False,
) -> tuple[int, float]:
    """Train to `steps` with the trainer of `release` (None: today's) as its own process,
    `python -m rlfleet_trainer run` (the command the pipeline launches); returns the weight
    version it published last and its wall time in seconds."""
    rows = _rows(run_dir.parent / "rows.jsonl")
    args = [
        "-m",
        "rlfleet_trainer",
        "run",
        "--run-dir",
        str(run_dir),
        "--rows",
        str(rows),
        *(["--resume"] if resume else []),
        f"policy.model={model}",
        "policy.max_total_sequence_length=256",
        "policy.train_micro_batch_size=8",
        "generation.max_new_tokens=16",
        "grpo.num_prompts_per_step=2",
        "grpo.num_generations_per_prompt=4",
        f"grpo.max_num_steps={steps}",
        "grpo.max_trajectory_age_steps=0",
        "grpo.lr=1e-3",
        "checkpoint.export_hf=false",
        f"services.rollout={services.rollout}",
        f"services.reward={services.reward}",
        f"services.weight_transport={transport}",
    ]
    started = time.monotonic()
    result = _python(release.env if release else None, *args, cwd=run_dir.parent, timeout=400)
    elapsed = time.monotonic() - started
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    found = re.search(rf"^trained {steps} steps; weight version (\d+)$", result.stdout, re.M)
    assert found, result.stdout
    return int(found[1]), elapsed


def _stage(release: Release | None, model: Path, services: Services, run_dir: Path) -> str:
    """Two steps publishing weights by StreamWeights, then a resume to a third step by a
    gloo broadcast (InitWeightTransfer + UpdateWeights); checks what crossed the wire came
    out right: the engine's logprobs match the trainer's (same tokens, same weights after
    each update), rewards are the gateway's, every prompt is in the ledger, and the
    rollout serves the trainer's last weight version (GetStatus)."""
    _, first = _train(release, model, services, run_dir, transport="grpc_stream", steps=2)
    version, second = _train(
        release, model, services, run_dir, transport="gloo", steps=3, resume=True
    )
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for m in metrics:
        assert m["token_mult_prob_error"] == pytest.approx(1.0, abs=2e-3)
        assert m["policy_lag/max"] == 0 and 0.0 <= m["reward/reasoning_gym"] <= 1.0
    ledger = [json.loads(x) for x in (run_dir / "ledger.jsonl").read_text().splitlines()]
    assert sum(e["outcome"] == "trained" for e in ledger) == 6
    with connect_sync(services.rollout, default_timeout_s=10) as channel:
        status = rollout_pb2_grpc.RolloutServiceStub(channel).GetStatus(
            rollout_pb2.GetStatusRequest(), timeout=10
        )
    assert status.weight_version == version >= 3 and status.engine == "hf"
    return f"grpc_stream 2 steps {first:.1f} s, gloo resume +1 step {second:.1f} s"


def _build_service(target: str) -> common_pb2.BuildInfo | grpc.StatusCode:
    with connect_sync(target, default_timeout_s=10, retry=None) as channel:
        try:
            info: common_pb2.BuildInfo = common_pb2_grpc.BuildServiceStub(channel).GetBuildInfo(
                common_pb2.GetBuildInfoRequest(), timeout=10
            )
            return info
        except grpc.RpcError as exc:
            return exc.code()


@pytest.mark.slow
def test_previous_trainer_against_todays_services(
    previous: Release, model: Path, services_of, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    services = services_of(None)
    for target in (services.rollout, services.reward):
        assert isinstance(_build_service(target), common_pb2.BuildInfo)  # today's code serves
    rollout_build = _build_service(services.rollout)
    with connect_sync(services.rollout, default_timeout_s=10) as channel:
        status = rollout_pb2_grpc.RolloutServiceStub(channel).GetStatus(
            rollout_pb2.GetStatusRequest(), timeout=10
        )
    assert status.build == rollout_build and status.build.git_commit == git_commit()
    times = _stage(previous, model, services, tmp_path / "stage")
    print(f"previous trainer ({previous.tag}) x today's services: {times}")


@pytest.mark.slow
def test_todays_trainer_against_previous_services(
    previous: Release, model: Path, services_of, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    services = services_of(previous)
    rollout_build, reward_build = remote_build(services.rollout), remote_build(services.reward)
    if not previous.has_build_service:
        # proof that the old code is what serves: it lacks the method today's bootstrap adds
        assert _build_service(services.rollout) == grpc.StatusCode.UNIMPLEMENTED
        assert _build_service(services.reward) == grpc.StatusCode.UNIMPLEMENTED
        # ...yet `rlfleet version` still learns the old rollout's build from its GetStatus
        assert rollout_build is not None and rollout_build.service == "rollout"
        assert rollout_build.git_commit == "" and reward_build is None
    times = _stage(None, model, services, tmp_path / "stage")
    print(f"today's trainer x previous services ({previous.tag}): {times}")
