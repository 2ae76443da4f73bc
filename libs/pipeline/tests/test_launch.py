"""Launch plans: env.toml profiles (the SLURM script: test_slurm_script.py; a real SLURM:
tests/test_slurm.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rlfleet_core.config import ConfigError
from rlfleet_pipeline.launch.profiles import (
    ComposeProfile,
    LocalProfile,
    SlurmProfile,
    load_profile,
)

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
    assert (profile.nodes.trainer, profile.nodes.rollout, profile.gpus_per_node) == (16, 1, 8)
    assert isinstance(
        load_profile("slurm-here", REPO / "deploy" / "slurm" / "env.toml.example"), SlurmProfile
    )


def test_bad_profile_names_the_key(tmp_path: Path) -> None:
    env = tmp_path / "env.toml"
    env.write_text(
        '[c]\nlauncher = "slurm"\naccount = "a"\npartition = "p"\ngpus_per_node = "eight"\n'
    )
    with pytest.raises(ConfigError) as info:
        load_profile("c", env)
    assert info.value.lines == [f"{env} [c] gpus_per_node: expected an integer, got 'eight'"]
