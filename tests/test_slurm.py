"""A real one-node SLURM cluster (Debian's slurm-wlm 22.05: slurmctld, slurmd, slurmdbd on
MariaDB for sacct, munge) in a container (deploy/slurm/cluster), and `rlfleet rl --run
<slurm profile>` against it.

The container sees this checkout, its .venv and the venv's Python at their host paths
(read-only) and the test's tmp folder (read-write, the "shared filesystem": run folder and
job_dir). The profile says `container_runtime = "none"` and activates the venv in `setup`,
so every service runs on the node's own environment. `sbatch`, `squeue`, `sacct`,
`scancel` and `scontrol` on this host are wrappers that `docker exec` the real commands in
the container (a login node), so `rlfleet rl` itself runs here and gets Ctrl-C here.

1. A tiny RLVR stage (2 steps, hf engine, the bundled `tiny` model) submitted by `rlfleet
   rl rlvr -c test --run slurm`: exit 0, the stage folder's summary and metrics, and
   `sacct` shows every component COMPLETED. Once with `services.weight_transport=
   grpc_stream`, once with `gloo`: the trainer (node1) hosts the weight group at the
   address the job exports (RLFLEET_WEIGHT_SYNC_HOST=node1) and the rollout (node2) joins
   it there; the held-out samples after training come from the version published last.
2. SIGINT to `rlfleet rl` (started with SIGINT ignored, as under a CI script) once a
   service of the job serves: it runs `scancel`, exits 130, `sacct` shows CANCELLED and no
   rlfleet process is left on the nodes.

One cluster serves both tests (module scope); each test has its own folder and job.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import REPO, RLFLEET, require_docker

pytestmark = [
    pytest.mark.docker,
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.budget(
        240, "a real SLURM controller and node in a container, one tiny stage per transport"
    ),
]

IMAGE = "rlfleet/slurm:22.05"
HOSTNAME = "slurmnode"
SLURM_COMMANDS = ("sbatch", "squeue", "sacct", "scancel", "scontrol")
# bubblewrap (the sandbox) needs what compose.yaml gives the sandbox container.
SECURITY = ["seccomp=unconfined", "apparmor=unconfined", "systempaths=unconfined"]


@dataclass
class Cluster:
    name: str
    bin_dir: Path

    def exec(self, *command: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["docker", "exec", self.name, *command],
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def sacct_states(self, job_id: str) -> list[str]:
        done = self.exec("sacct", "-X", "-n", "-P", "-j", job_id, "-o", "JobID,State")
        return [line.split("|")[1] for line in done.stdout.splitlines() if "|" in line]

    def rlfleet_processes(self) -> list[str]:
        done = self.exec("ps", "-eo", "pid,args")
        return [line for line in done.stdout.splitlines() if "rlfleet" in line]


def _build_image() -> None:
    subprocess.run([str(REPO / "deploy/docker/build-base.sh")], check=True, timeout=900)
    build = subprocess.run(
        ["docker", "build", "-q", "-t", IMAGE, str(REPO / "deploy/slurm/cluster")],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert build.returncode == 0, build.stderr[-3000:]


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cluster's shared filesystem: every test's folder is made under it."""
    return tmp_path_factory.mktemp("slurm-shared")


@pytest.fixture
def tmp_path(shared: Path, request: pytest.FixtureRequest) -> Path:
    path = shared / request.node.name.replace("[", "-").replace("]", "")
    path.mkdir()
    return path


@pytest.fixture(scope="module")
def cluster(shared: Path) -> Iterator[Cluster]:
    """One cluster for the module's tests (started in ~10 s; removed pass or fail)."""
    require_docker()
    _build_image()
    name = f"rlfleet-slurm-{uuid.uuid4().hex[:8]}"
    python_home = Path(sys.base_prefix).resolve()
    mounts = [
        f"{REPO}:{REPO}:ro",
        f"{python_home}:{python_home}:ro",
        f"{shared}:{shared}",
    ]
    security = [arg for opt in SECURITY for arg in ("--security-opt", opt)]
    volumes = [arg for m in mounts for arg in ("-v", m)]
    run = [
        "docker", "run", "-d", "--init", "--name", name, "--hostname", HOSTNAME,
        *security, *volumes, IMAGE,
    ]  # fmt: skip
    subprocess.run(run, check=True, capture_output=True, timeout=120)
    try:
        bin_dir = shared / "bin"
        bin_dir.mkdir()
        for command in SLURM_COMMANDS:
            wrapper = bin_dir / command
            wrapper.write_text(f'#!/bin/sh\nexec docker exec -i -w "$PWD" {name} {command} "$@"\n')
            wrapper.chmod(0o755)
        c = Cluster(name, bin_dir)
        deadline = time.monotonic() + 120
        while c.exec("sinfo", "-h", "-o", "%T").stdout.strip() != "idle":
            if time.monotonic() > deadline:
                logs = c.exec("bash", "-c", "tail -n 20 /var/log/slurm/*.log").stdout
                pytest.fail(f"the SLURM node did not turn idle in 120 s:\n{logs}")
            time.sleep(0.5)
        yield c
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=120)


def _rows(path: Path, count: int, seed: int) -> None:
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


def _stage(
    tmp_path: Path, cluster: Cluster, steps: int, extra: tuple[str, ...] = ()
) -> tuple[list[str], dict[str, str]]:
    """The `rlfleet rl` command line and environment for a tiny RLVR stage on the cluster."""
    (tmp_path / "env.toml").write_text(
        '[slurm]\nlauncher = "slurm"\ncontainer_runtime = "none"\nexclusive = false\n'
        f'gpus_per_node = 0\ntime = "00:20:00"\njob_dir = "jobs"\npoll_s = 1.0\n'
        f"start_timeout_s = 300\nsetup = [{json.dumps(f'source {REPO}/.venv/bin/activate')}]\n"
    )
    _rows(tmp_path / "train.jsonl", 40, seed=3)
    _rows(tmp_path / "val.jsonl", 4, seed=4)
    overrides = [
        "policy.model=tiny",
        "policy.dtype=float32",
        "policy.max_total_sequence_length=256",
        "policy.train_micro_batch_size=8",
        "generation.max_new_tokens=16",
        "grpo.num_prompts_per_step=2",
        "grpo.num_generations_per_prompt=4",
        "grpo.lr=1e-3",
        f"grpo.max_num_steps={steps}",
        "checkpoint.export_hf=false",
        f"data.train_path={tmp_path / 'train.jsonl'}",
        f"data.val_path={tmp_path / 'val.jsonl'}",
        *extra,
    ]
    command = [RLFLEET, "rl", "rlvr", "-c", "test", "--run", "slurm", "--engine", "hf"]
    command += ["--env-toml", str(tmp_path / "env.toml")]  # its `setup` runs in every task
    command += ["--out", str(tmp_path / "run"), *overrides]
    env = {**os.environ, "PATH": f"{cluster.bin_dir}{os.pathsep}{os.environ['PATH']}"}
    for key in ("RLFLEET_AUTH_TOKEN_FILE", "RLFLEET_AUTH_TOKEN"):
        env.pop(key, None)
    return command, env


def _job_id(stderr: str) -> str:
    for line in stderr.splitlines():
        if line.startswith("rlfleet: submitted job "):
            return line.split()[3].rstrip(";")
    raise AssertionError(f"no job id in:\n{stderr[-3000:]}")


@pytest.mark.parametrize("transport", ["grpc_stream", "gloo"])
def test_tiny_stage_runs_on_slurm(tmp_path: Path, cluster: Cluster, transport: str) -> None:
    extra = (f"services.weight_transport={transport}", "grpo.val_at_end=true")
    command, env = _stage(tmp_path, cluster, steps=2, extra=extra)
    started = time.monotonic()
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    print(f"stage on SLURM (2 steps, {transport}): {time.monotonic() - started:.0f} s")
    print(done.stdout[-3000:], done.stderr[-3000:])
    job_id = _job_id(done.stderr)
    logs = tmp_path / "jobs" / job_id
    assert done.returncode == 0, "\n".join(
        f"== {p.name}\n{p.read_text()[-2000:]}" for p in sorted(logs.glob("*.log"))
    )
    run_dir = tmp_path / "run"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["step"] == 2
    # the trainer ran on the recipe's transport (a collective was once swapped out)
    recipe = json.loads((run_dir / "recipe.json").read_text())
    assert recipe["services"]["weight_transport"] == transport
    # the rollout served what the trainer published last (version 2, after step 2)
    after = [json.loads(x) for x in (run_dir / "heldout_after.jsonl").read_text().splitlines()]
    assert after and {s["weight_version"] for s in after} == {2}, after
    if transport == "gloo":
        # The trainer (node1) advertised the address the job exported for it
        # (RLFLEET_WEIGHT_SYNC_HOST=node1) and the rollout (node2) joined there; loopback
        # would work here only because the "nodes" share one host.
        log = (logs / "trainer.log").read_text().splitlines()
        formed = [ln for ln in log if "weight group (gloo) formed" in ln]
        assert len(formed) == 1 and " at node1:" in formed[0], formed
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert 0.0 <= m["reward/reasoning_gym"] <= 1.0, m
        # the rollout served the policy's model (engine=hf model=tiny): same logprobs
        assert m["token_mult_prob_error"] == pytest.approx(1.0, abs=2e-3), m
    # one component per service, each COMPLETED; the trainer's log was tailed to stdout
    assert cluster.sacct_states(job_id) == ["COMPLETED"] * 4
    addresses = (logs / "addresses.env").read_text().split()
    assert sorted(a.split("=")[0] for a in addresses) == [
        "REWARD_TARGET",
        "ROLLOUT_TARGET",
        "SANDBOX_TARGET",
    ]
    assert all("=node" in a for a in addresses), addresses
    assert "rlfleet: job " + job_id + " COMPLETED" in done.stderr
    assert (logs / "trainer.log").read_text().strip().splitlines()[-1] in done.stdout


def test_ctrl_c_cancels_the_job(tmp_path: Path, cluster: Cluster) -> None:
    # Steps enough never to finish first; started with SIGINT ignored, as a background job
    # of a non-interactive shell is (a CI script's): Python then raises no
    # KeyboardInterrupt unless the CLI installs the handler itself (one CI run finished
    # all 500 steps of an earlier version of this test with the SIGINT lost).
    command, env = _stage(tmp_path, cluster, steps=100_000)
    proc = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # fmt: skip
    try:
        # Interrupt mid-job: once a service has published its address (serving).
        deadline = time.monotonic() + 300
        addresses = None
        while addresses is None or not addresses.read_text().strip():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no service served within 300 s"
            found = list((tmp_path / "jobs").glob("*/addresses.env"))
            addresses = found[0] if found else None
            time.sleep(0.5)
        job_id = addresses.parent.name
        assert cluster.rlfleet_processes(), "no service runs on the node"
        proc.send_signal(signal.SIGINT)
        # The CLI's own bound: scancel (60 s a command) and up to 120 s for the final
        # state; under a loaded CI machine the slurm commands themselves are slow.
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    print(stdout[-2000:], stderr[-2000:])
    assert proc.returncode == 130, stderr[-3000:]
    assert f"rlfleet: job {job_id} cancelled: CANCELLED" in stderr
    assert cluster.sacct_states(job_id)[0].startswith("CANCELLED")
    deadline = time.monotonic() + 60
    while (left := cluster.rlfleet_processes()) and time.monotonic() < deadline:
        time.sleep(1)
    assert not left, left
