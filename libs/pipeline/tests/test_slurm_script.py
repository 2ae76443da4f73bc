"""The sbatch script of a stage, for every container runtime (pyxis, apptainer, none):
valid bash, one heterogeneous component per service of the stage, each srun line's flags
from the profile, every service's key=value overrides accepted by that service's own
config model (and the trainer's by the recipe model), the rollout serving the policy's
model, torchrun's environment for each trainer task, and the script's own bash run for
the token and the address wait. A real SLURM runs it in tests/test_slurm.py."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from rlfleet_contracts.recipe import RecipeConfig
from rlfleet_core.config import load_config
from rlfleet_pipeline.launch.profiles import SlurmProfile
from rlfleet_pipeline.launch.slurm import components, render_sbatch
from rlfleet_pipeline.launchers import launch_plan
from rlfleet_pipeline.recipes import load_recipe
from rlfleet_pipeline.services import get_service

RLVR = ["rollout", "reward", "sandbox"]


def profile(runtime: str = "pyxis", **extra: object) -> SlurmProfile:
    images = {
        s: f"/img/{s}.{'sqsh' if runtime == 'pyxis' else 'sif'}"
        for s in ("trainer", "rollout", "reward", "sandbox")
    }
    return SlurmProfile.model_validate(
        {
            "account": "acct",
            "partition": "gpu",
            "cpu_partition": "cpu",
            "gpus_per_node": 8,
            "nodes": {"trainer": 4, "rollout": 1, "reward": 1, "sandbox": 1},
            "container_runtime": runtime,
            "images": images,
            "mounts": ["/lustre:/lustre"],
            "job_dir": "/lustre/jobs",
            "master_port": 29400,
            **extra,
        }
    )


def sruns(script: str) -> dict[str, list[str]]:
    """service -> the srun line's words (the service named by its het group)."""
    order = [c.service for c in components(profile(), RLVR)]
    lines, text = {}, script.splitlines()
    for i, line in enumerate(text):
        if not line.startswith("srun "):
            continue
        j = i  # the srun command runs on until its quotes close
        while True:
            try:
                words = shlex.split("\n".join(text[i : j + 1]))
                break
            except ValueError:
                j += 1
        words = words[: next((k for k, w in enumerate(words) if w in (">", "2>&1", "|")), None)]
        group = next(w for w in words if w.startswith("--het-group="))
        lines[order[int(group.split("=")[1])]] = words
    return lines


def plan(runtime: str, tmp_path: Path, **extra: object) -> str:
    recipe = load_recipe("test", ["policy.model=tiny", "services.weight_transport=nccl"])
    script = launch_plan(recipe, profile(runtime, **extra), Path("/lustre/runs/rlvr"), "hf")
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return script


def test_heterogeneous_job_layout() -> None:
    comps = components(profile(), RLVR)
    assert [
        (c.service, c.nodes, c.gpus_per_node, c.partition, c.tasks_per_node) for c in comps
    ] == [
        ("trainer", 4, 8, "gpu", 8),
        ("rollout", 1, 8, "gpu", 1),
        ("reward", 1, 0, "cpu", 1),
        ("sandbox", 1, 0, "cpu", 1),
    ]
    # the stage's services decide the components: an RLHF stage has no sandbox
    assert [c.service for c in components(profile(), ["reward", "rollout"])] == [
        "trainer",
        "rollout",
        "reward",
    ]


def test_a_service_on_more_nodes_than_it_can_use_is_refused() -> None:
    p = profile(nodes={"trainer": 2, "rollout": 16})
    with pytest.raises(ValueError, match=r"nodes.rollout=16: rollout runs on one node"):
        components(p, RLVR)


def test_a_reward_on_several_nodes_runs_a_ray_cluster_over_them(tmp_path: Path) -> None:
    """nodes.reward=3: one task per node; task 0 starts the Ray head and the gateway with
    its workers on that cluster (pool.backend=ray ray.address=auto, one per node), the
    others join the head and block. The tasks' own bash runs, with SLURM's variables and
    stand-ins for scontrol and ray, and the overrides load in the reward's config."""
    script = plan("none", tmp_path, nodes={"trainer": 1, "reward": 3, "sandbox": 1})
    words = sruns(script)["reward"]
    flags = words[: words.index("bash")]
    assert "--nodes=3" in flags and "--ntasks=3" in flags and "--ntasks-per-node=1" in flags
    task = words[-1]
    command = _command(task)
    overrides = [w.replace("$SANDBOX_TARGET", "n9:50054") for w in command[5:]]
    config = load_config(get_service("reward").config_model, overrides=overrides)
    assert (config.pool.backend, config.ray.address, config.ray.workers) == ("ray", "auto", 3)
    bin_dir = tmp_path / "bin"  # stand-ins on PATH: the task script `exec`s them
    bin_dir.mkdir()
    for name, body in {
        "scontrol": "printf 'cpu-3\\ncpu-4\\ncpu-5\\n'",
        "ray": 'echo "ray $*"',
        "rlfleet-reward": 'echo "gateway $*"',
    }.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    base = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_STEP_NODELIST": "cpu-[3-5]",
        "ADDRESSES": str(tmp_path / "addresses.env"),
        "SANDBOX_TARGET": "n9:1",
    }

    def run_task(procid: str) -> list[str]:
        # Output to a file, not a pipe: the address publisher in the background holds its
        # stdout until it sees the task gone, which a pipe reader would wait for.
        out = tmp_path / f"task{procid}.out"
        with out.open("w") as sink:
            done = subprocess.run(
                ["bash", "-c", task],
                env={**base, "SLURM_PROCID": procid},
                stdout=sink,
                stderr=subprocess.STDOUT,
                timeout=30,
            )
        assert done.returncode == 0, out.read_text()
        return out.read_text().splitlines()

    head = run_task("0")
    assert head[0] == "ray start --disable-usage-stats --head --port=6381", head
    assert head[1].startswith("gateway --host 0.0.0.0 --port 50053 sandbox.target=n9:1"), head
    assert "pool.backend=ray ray.address=auto ray.workers=3" in head[1]
    assert run_task("2") == ["ray start --disable-usage-stats --address=cpu-3:6381 --block"]


@pytest.mark.parametrize("runtime", ["pyxis", "apptainer", "none"])
def test_every_srun_line_matches_the_profile(runtime: str, tmp_path: Path) -> None:
    script = plan(runtime, tmp_path)
    header = [ln for ln in script.splitlines() if ln.startswith("#SBATCH")]
    assert header.count("#SBATCH hetjob") == 3
    assert header.count("#SBATCH --exclusive") == 4
    assert "#SBATCH --account=acct" in header
    assert header.count("#SBATCH --gpus-per-node=8") == 2  # trainer and rollout only
    assert "ray start" not in script  # nothing would use a Ray cluster
    lines = sruns(script)
    assert sorted(lines) == ["reward", "rollout", "sandbox", "trainer"]
    for service, words in lines.items():
        flags = [w for w in words[: words.index("bash")] if w.startswith("--")]
        container = [
            f for f in flags if f.startswith("--container") or f.startswith("--no-container")
        ]
        if runtime == "pyxis":
            assert container == [
                f"--container-image=/img/{service}.sqsh",
                "--no-container-mount-home",
                "--container-mounts=/lustre:/lustre",
            ]
        else:
            assert container == []
        task = words[words.index("-c") + 1]
        if runtime == "apptainer":
            nv = " --nv" if service in ("trainer", "rollout") else ""
            assert f"exec apptainer exec{nv} --bind=/lustre:/lustre /img/{service}.sif " in task
        nodes, tasks = (4, 8) if service == "trainer" else (1, 1)
        assert f"--nodes={nodes}" in flags and f"--ntasks-per-node={tasks}" in flags
        assert f"--ntasks={nodes * tasks}" in flags


def _command(task: str) -> list[str]:
    """The service's command: the words after `exec` (and the container prefix)."""
    last = task.splitlines()[-1]
    words = shlex.split(last.removeprefix("exec "))
    return words[words.index(next(w for w in words if w.startswith("rlfleet-"))) :]


@pytest.mark.parametrize("runtime", ["pyxis", "apptainer", "none"])
def test_each_service_accepts_its_command_line(runtime: str, tmp_path: Path) -> None:
    """Every key=value the script passes is one the service's own config model takes
    (the reward gateway once got `sandbox_target=` and refused to start)."""
    lines = sruns(plan(runtime, tmp_path))
    ports = {"rollout": 50052, "reward": 50053, "sandbox": 50054}
    for service, port in ports.items():
        command = _command(lines[service][-1])
        assert command[:5] == [f"rlfleet-{service}", "--host", "0.0.0.0", "--port", str(port)]
        overrides = [w.replace("$SANDBOX_TARGET", "node9:50054") for w in command[5:]]
        load_config(get_service(service).config_model, overrides=overrides)
        if service == "rollout":  # the policy's model, engine and sequence length
            assert overrides == ["engine=hf", "model=tiny", "engine_config.max_model_len=1024"]
        if service == "reward":
            assert overrides == ["sandbox.target=node9:50054"]
    trainer = _command(lines["trainer"][-1])
    assert trainer[:6] == [
        "rlfleet-trainer",
        "run",
        "-c",
        "/lustre/runs/rlvr/recipe.yaml",
        "--run-dir",
        "/lustre/runs/rlvr",
    ]
    recipe = load_recipe("test", ["policy.model=tiny", "services.weight_transport=nccl"])
    keys = [
        w.replace("$ROLLOUT_TARGET", "n:1").replace("$REWARD_TARGET", "n:2") for w in trainer[6:]
    ]
    checked = load_config(RecipeConfig, overrides=keys, base=recipe.model_dump())
    assert (checked.services.rollout, checked.services.reward) == ("n:1", "n:2")
    # the recipe's collective transport is kept (the tasks get its rendezvous address)
    assert checked.services.weight_transport == "nccl"


def _trainer_probe(task: str) -> str:
    """The trainer task's script, printing the trainer's command and environment."""
    probe = task.replace("exec rlfleet-trainer", "echo rlfleet-trainer")
    probe += "\nenv | grep ^RLFLEET_WEIGHT_SYNC_ || true"
    return probe + '\necho "$RANK $WORLD_SIZE $LOCAL_RANK $MASTER_ADDR $MASTER_PORT"'


def test_trainer_tasks_get_torchrun_environment(tmp_path: Path) -> None:
    """Run the trainer task's script with SLURM's variables: each rank sees its own RANK,
    WORLD_SIZE, LOCAL_RANK and the first trainer node as MASTER_ADDR, and that node as
    the weight group's advertised address (global rank 0 runs there and hosts it)."""
    task = sruns(plan("none", tmp_path))["trainer"][-1]
    probe = _trainer_probe(task)
    env = {
        "PATH": os.environ["PATH"],
        "SLURM_PROCID": "13",
        "SLURM_NTASKS": "32",
        "SLURM_LOCALID": "5",
        "TRAINER_HEAD": "gpu-017",
        "ROLLOUT_TARGET": "gpu-100:50052",
        "REWARD_TARGET": "cpu-1:50053",
    }
    done = subprocess.run(["bash", "-c", probe], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "13 32 5 gpu-017 29400"
    assert "services.rollout=gpu-100:50052 services.reward=cpu-1:50053" in done.stdout
    # exported (the trainer process sees it), the trainer's first node; port left free
    assert [ln for ln in done.stdout.splitlines() if ln.startswith("RLFLEET_WEIGHT_SYNC_")] == [
        "RLFLEET_WEIGHT_SYNC_HOST=gpu-017"
    ]


def test_a_setup_export_of_the_weight_sync_address_wins(tmp_path: Path) -> None:
    """A profile whose `setup` names the rendezvous (an IB hostname, a fixed port for a
    firewall) keeps it: the job's default is only the trainer's first node."""
    setup = ["export RLFLEET_WEIGHT_SYNC_HOST=gpu-017-ib RLFLEET_WEIGHT_SYNC_PORT=29600"]
    task = sruns(plan("none", tmp_path, setup=setup))["trainer"][-1]
    env = {"PATH": os.environ["PATH"], "SLURM_PROCID": "0", "SLURM_NTASKS": "8"}
    env |= {"SLURM_LOCALID": "0", "TRAINER_HEAD": "gpu-017"}
    done = subprocess.run(
        ["bash", "-c", _trainer_probe(task)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert sorted(ln for ln in done.stdout.splitlines() if ln.startswith("RLFLEET_")) == [
        "RLFLEET_WEIGHT_SYNC_HOST=gpu-017-ib",
        "RLFLEET_WEIGHT_SYNC_PORT=29600",
    ]


def test_exclusive_is_a_profile_option(tmp_path: Path) -> None:
    script = plan("none", tmp_path, exclusive=False, gpus_per_node=0, account=None, time=None)
    assert "--exclusive" not in script and "--gpus-per-node" not in script
    assert "--account" not in script and "--time" not in script
    assert "--ntasks-per-node=1" in sruns(script)["trainer"]


def _setup(script: str) -> str:
    """The script's bash up to the first srun (variables, token, wait_for)."""
    return script[script.index("set -euo pipefail") : script.index("\nsrun ")]


@pytest.mark.parametrize("runtime", ["pyxis", "apptainer"])
def test_sbatch_script_makes_the_fleet_token(runtime: str, tmp_path: Path) -> None:
    """The services bind 0.0.0.0, so the job makes a 0600 token first (unless the
    submitter gave one) and hands it to every service and the trainer through
    RLFLEET_AUTH_TOKEN_FILE. Runs the script's own set-up lines in bash."""
    script = render_sbatch(profile(runtime), "rlvr1", ["-c", "/lustre/r.yaml"], services=RLVR)
    setup = _setup(script).replace("/lustre/jobs", str(tmp_path))
    probe = 'echo "file=$RLFLEET_AUTH_TOKEN_FILE"'
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST_HET_GROUP_0": "n1"}
    done = subprocess.run(
        ["bash", "-c", f"scontrol() {{ echo n1; }}\n{setup}\n{probe}"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    token_file = tmp_path / "77" / "auth_token"
    assert f"file={token_file}" in done.stdout
    assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
    token = token_file.read_text()
    assert len(token) == 43 and token.replace("-", "").replace("_", "").isalnum()
    # A token the submitter set is kept.
    own = tmp_path / "own"
    done = subprocess.run(
        ["bash", "-c", f"scontrol() {{ echo n1; }}\n{setup}\n{probe}"],
        env={**env, "RLFLEET_AUTH_TOKEN_FILE": str(own), "SLURM_JOB_ID": "78"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert f"file={own}" in done.stdout and not (tmp_path / "78" / "auth_token").exists()


def test_a_service_that_dies_before_serving_fails_the_job_at_once(tmp_path: Path) -> None:
    """The trainer's wait for addresses ends when a service's step has exited (naming it
    and its log), instead of waiting forever; and returns once every address is there."""
    script = render_sbatch(profile("none"), "rlvr1", [], services=RLVR)
    setup = _setup(script).replace("/lustre/jobs", str(tmp_path))
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST_HET_GROUP_0": "n1"}
    dead = (
        "( echo 'sandbox: bwrap: No permissions' >&2; exit 3 ) 2> \"$LOGS/sandbox.log\" &\n"
        "STEPS[$!]=sandbox\nwait_for SANDBOX_TARGET\necho never"
    )
    done = subprocess.run(
        ["bash", "-c", f"scontrol() {{ echo n1; }}\n{setup}\n{dead}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "never" not in done.stdout
    assert f"rlfleet: sandbox exited before serving; see {tmp_path}/5/sandbox.log" in done.stderr
    assert "bwrap: No permissions" in done.stderr
    ready = (
        "sleep 30 &\nSTEPS[$!]=sandbox\n"
        '( sleep 1; echo "SANDBOX_TARGET=n2:50054" >> "$ADDRESSES" ) &\n'
        'wait_for SANDBOX_TARGET\necho "got $SANDBOX_TARGET"; kill %1'
    )
    done = subprocess.run(
        ["bash", "-c", f"scontrol() {{ echo n1; }}\n{setup}\n{ready}"],
        env={**env, "SLURM_JOB_ID": "6"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "got n2:50054" in done.stdout


def test_missing_image_is_named() -> None:
    p = profile()
    p.images.pop("rollout")
    with pytest.raises(ValueError, match=r"images.rollout: no container image"):
        render_sbatch(p, "rlvr1", [], services=RLVR)


def test_run_without_slurm_commands_is_a_one_line_error(tmp_path: Path) -> None:
    """`rlfleet rl --run <slurm>` off a login node: no sbatch on PATH is named, exit 1;
    a profile the plan cannot honour is named in --dry-run, exit 1 (no traceback)."""
    rlfleet = str(Path(sys.executable).parent / "rlfleet")
    (tmp_path / "env.toml").write_text(
        '[c]\nlauncher = "slurm"\ncontainer_runtime = "none"\ngpus_per_node = 0\n'
        '[big]\nlauncher = "slurm"\ncontainer_runtime = "none"\n[big.nodes]\nrollout = 2\n'
    )
    env = {**os.environ, "PATH": "/usr/bin:/bin"}
    rows = tmp_path / "rows.jsonl"  # the start's own checks need the data to exist
    rows.write_text(
        '{"responses_create_params": {"input": [{"role": "user", "content": "2+2?"}]}, '
        '"env": "math", "expected_answer": "4"}\n'
    )
    args = [rlfleet, "rl", "rlvr", "-c", "test", "--engine", "hf", "policy.model=tiny"]
    args += [f"data.train_path={rows}", f"data.val_path={rows}"]
    done = subprocess.run(
        [*args, "--run", "c"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1, done.stderr
    assert (
        "`sbatch` not found on PATH: run `rlfleet rl --run <slurm profile>` on a SLURM login node"
        in done.stderr
    )
    assert "Traceback" not in done.stderr
    done = subprocess.run(
        [*args, "--run", "big", "--dry-run"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    # The dry-run fails as the start would (exit 1), with the line naming the key.
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "nodes.rollout=2: rollout runs on one node" in done.stderr


def test_a_cache_dir_is_exported_to_every_task(tmp_path: Path) -> None:
    """`cache_dir` in the profile: the job exports RLFLEET_CACHE_DIR and the caches'
    variables before any srun (the tasks inherit them); a variable the submitter set
    wins. The script's own lines run in bash."""
    script = plan("none", tmp_path, cache_dir="/lustre/cache")
    lines = [ln for ln in script.splitlines() if ln.startswith("export ") and "CACHE" in ln]
    lines += [ln for ln in script.splitlines() if ln.startswith("export HF_HOME")]
    assert script.index(lines[0]) < script.index("\nsrun ")
    probe = "\n".join([*lines, 'echo "$RLFLEET_CACHE_DIR $HF_HOME $VLLM_CACHE_ROOT"'])
    env = {"PATH": os.environ["PATH"]}
    done = subprocess.run(["bash", "-c", probe], env=env, capture_output=True, text=True)
    assert done.stdout.split() == [
        "/lustre/cache",
        "/lustre/cache/huggingface",
        "/lustre/cache/vllm",
    ], done.stderr
    done = subprocess.run(
        ["bash", "-c", probe], env={**env, "HF_HOME": "/fast/hf"}, capture_output=True, text=True
    )
    assert done.stdout.split()[1] == "/fast/hf"
    (tmp_path / "plain").mkdir()
    assert "RLFLEET_CACHE_DIR" not in plan("none", tmp_path / "plain")
