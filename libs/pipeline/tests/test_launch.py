"""Launch plans: env.toml profiles and the SLURM script (generated, checked by bash -n
and by the exact commands it would run; SLURM itself cannot run here)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
from rlfleet_core.config import ConfigError
from rlfleet_pipeline.launch.profiles import (
    ComposeProfile,
    LocalProfile,
    SlurmProfile,
    load_profile,
)
from rlfleet_pipeline.launch.slurm import components, render_sbatch

REPO = Path(__file__).resolve().parents[3]


def test_builtin_profiles_without_env_toml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert isinstance(load_profile("local"), LocalProfile)
    assert isinstance(load_profile("compose"), ComposeProfile)
    with pytest.raises(ConfigError, match="--run nope: no such profile"):
        load_profile("nope")


def test_example_env_toml_loads() -> None:
    profile = load_profile("cluster", REPO / "deploy" / "slurm" / "env.toml.example")
    assert isinstance(profile, SlurmProfile)
    assert (profile.nodes.trainer, profile.nodes.rollout, profile.gpus_per_node) == (16, 16, 8)


def test_bad_profile_names_the_key(tmp_path: Path) -> None:
    env = tmp_path / "env.toml"
    env.write_text(
        '[c]\nlauncher = "slurm"\naccount = "a"\npartition = "p"\ngpus_per_node = "eight"\n'
    )
    with pytest.raises(ConfigError) as info:
        load_profile("c", env)
    assert info.value.lines == [f"{env} [c] gpus_per_node: expected an integer, got 'eight'"]


def profile(runtime: str = "pyxis", sandbox: int = 1) -> SlurmProfile:
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
            "nodes": {"trainer": 4, "rollout": 2, "reward": 1, "sandbox": sandbox},
            "container_runtime": runtime,
            "images": images,
            "mounts": ["/lustre:/lustre"],
            "job_dir": "/lustre/jobs",
        }
    )


def test_heterogeneous_job_layout() -> None:
    comps = components(profile())
    assert [(c.service, c.nodes, c.gpus_per_node, c.partition) for c in comps] == [
        ("trainer", 4, 8, "gpu"),
        ("rollout", 2, 8, "gpu"),
        ("reward", 1, 0, "cpu"),
        ("sandbox", 1, 0, "cpu"),
    ]


@pytest.mark.parametrize("runtime", ["pyxis", "apptainer"])
def test_sbatch_script_is_valid_bash_with_the_expected_commands(
    runtime: str, tmp_path: Path
) -> None:
    script = render_sbatch(
        profile(runtime), "rlvr1", ["-c", "/lustre/r.yaml", "--run-dir", "/lustre/runs/rlvr1"]
    )
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    assert script.count("#SBATCH hetjob") == 3
    assert (
        "#SBATCH --nodes=4\n#SBATCH --ntasks-per-node=1\n#SBATCH --exclusive\n#SBATCH --gpus-per-node=8"
        in script
    )
    if runtime == "pyxis":
        assert (
            "--container-image=/img/trainer.sqsh" in script
            and "--container-mounts=/lustre:/lustre" in script
        )
    else:
        assert "apptainer exec --nv --bind=/lustre:/lustre /img/trainer.sif" in script
        assert "apptainer exec --containall --bind=/lustre:/lustre /img/sandbox.sif" in script
    # the reward gateway starts only once the sandbox has published its address
    assert script.index('[[ -n "${SANDBOX_TARGET:-}" ]]; do') < script.index("--het-group=2")
    assert (
        'exec rlfleet-reward --host 0.0.0.0 --port 50051 "sandbox.target=$SANDBOX_TARGET"' in script
    )
    assert (
        "exec rlfleet-trainer run -c /lustre/r.yaml --run-dir /lustre/runs/rlvr1 "
        '"services.rollout=$ROLLOUT_TARGET" "services.reward=$REWARD_TARGET"'
    ) in script


@pytest.mark.parametrize("runtime", ["pyxis", "apptainer"])
def test_sbatch_script_makes_the_fleet_token(runtime: str, tmp_path: Path) -> None:
    """The services bind 0.0.0.0, so the job makes a 0600 token first (unless the
    submitter gave one) and hands it to every service and the trainer through
    RLFLEET_AUTH_TOKEN_FILE. Runs the script's own set-up lines in bash."""
    script = render_sbatch(profile(runtime), "rlvr1", ["-c", "/lustre/r.yaml"])
    start = script.index("set -euo pipefail")
    setup = script[start : script.index("\n\n", script.index("auth token"))]
    setup = setup.replace("/lustre/jobs", str(tmp_path))
    probe = (
        'echo "file=$RLFLEET_AUTH_TOKEN_FILE"; echo "app=${APPTAINERENV_RLFLEET_AUTH_TOKEN_FILE:-}"'
    )
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "77"}
    done = subprocess.run(
        ["bash", "-c", f"{setup}\n{probe}"], env=env, capture_output=True, text=True, check=True
    )
    token_file = tmp_path / "77" / "auth_token"
    assert f"file={token_file}" in done.stdout
    if runtime == "apptainer":  # --containall cleans the environment but for APPTAINERENV_*
        assert f"app={token_file}" in done.stdout
    assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
    token = token_file.read_text()
    assert len(token) == 43 and token.replace("-", "").replace("_", "").isalnum()
    # A token the submitter set is kept.
    own = tmp_path / "own"
    done = subprocess.run(
        ["bash", "-c", f"{setup}\n{probe}"],
        env={**env, "RLFLEET_AUTH_TOKEN_FILE": str(own), "SLURM_JOB_ID": "78"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert f"file={own}" in done.stdout and not (tmp_path / "78" / "auth_token").exists()


def test_missing_image_is_named() -> None:
    p = profile()
    p.images.pop("rollout")
    with pytest.raises(ValueError, match=r"images.rollout: no container image"):
        render_sbatch(p, "rlvr1", [])
