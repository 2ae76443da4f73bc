"""Launch plans: env.toml profiles and the SLURM script (generated, checked by bash -n
and by the exact commands it would run; SLURM itself cannot run here)."""

from __future__ import annotations

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
        'exec rlfleet-reward --host 0.0.0.0 --port 50051 "sandbox_target=$SANDBOX_TARGET"' in script
    )
    assert (
        "exec rlfleet-trainer run -c /lustre/r.yaml --run-dir /lustre/runs/rlvr1 "
        '"services.rollout=$ROLLOUT_TARGET" "services.reward=$REWARD_TARGET"'
    ) in script


def test_missing_image_is_named() -> None:
    p = profile()
    p.images.pop("rollout")
    with pytest.raises(ValueError, match=r"images.rollout: no container image"):
        render_sbatch(p, "rlvr1", [])
