"""`rlfleet rl --dry-run` is honest: for every bundled recipe under every launcher profile
it either passes, and then the trainer's own start checks pass too, or it fails with the
one line the start prints. The start here is the real thing where it is cheap: `rlfleet
rl` without --dry-run, the trainer's `rlfleet-trainer run` and a service's own entry
point, each a process of its own. (The tiny recipes' dry-runs pass; that they then train
is test_chain.py, and tests/test_six_stages.py for `rlfleet run`.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from rlfleet_cli.main import app
from rlfleet_contracts.startup import start_problem
from rlfleet_core.config import dump_yaml
from rlfleet_core.ports import pick_free_port
from rlfleet_dataprep.prep import PrepOptions, prepare_rl
from rlfleet_pipeline.launch.profiles import load_profile
from rlfleet_pipeline.launchers import launcher_for
from rlfleet_pipeline.preflight import preflight, service_problem
from rlfleet_pipeline.recipes import bundled_recipes, load_recipe
from rlfleet_pipeline.stage import default_run_dir
from typer.testing import CliRunner

pytest.importorskip("rlfleet_trainer", reason="the trainer package is not installed")

# A SLURM profile with an image for every service (the plan is rendered, never submitted).
ENV_TOML = (Path(__file__).parent / "fixtures" / "slurm_env.toml").read_text()
PROFILES = ("local", "compose", "cluster")
TINY_BLENDS = ("tiny-rlvr1", "tiny-rlvr2", "tiny-rlvr3", "tiny-mix", "tiny-tooluse", "tiny-rlhf")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project folder as a user has it: the tiny blends prepared under data/ (where the
    tiny recipes and `test` read them) and an env.toml with a SLURM profile."""
    root = tmp_path_factory.mktemp("project")
    for blend in TINY_BLENDS:
        prepare_rl(blend, PrepOptions(out=root / "data", val_rows=8, force=True))
    (root / "env.toml").write_text(ENV_TOML)
    return root


def rl(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["rl", *args])
    return result.exit_code, result.stdout, result.stderr


def error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr  # one line, never a traceback
    return lines[0]


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("recipe", bundled_recipes())
def test_dry_run_fails_exactly_when_the_start_would(
    recipe: str, profile: str, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(workdir)
    kind = load_recipe(recipe).kind
    code, stdout, stderr = rl(kind, "-c", recipe, "--run", profile, "--dry-run")
    loaded = load_recipe(recipe)
    engine = loaded.services.rollout_engine  # what `rlfleet rl` uses without --engine
    expected = preflight(
        loaded, launcher_for(load_profile(profile)), default_run_dir(loaded), engine
    )
    assert "# launch plan" in stdout  # the plan is shown either way
    if expected is None:
        assert code == 0, stderr
        assert start_problem(loaded, 1) is None  # what the trainer checks before loading
        return
    assert (code, error_line(stderr)) == (1, f"rlfleet: {expected}")
    if profile == "local":
        # The start stops at the same check, before any service or trainer is started.
        code, _, stderr = rl(kind, "-c", recipe, "--run", profile, "--out", "runs/never")
        assert (code, error_line(stderr)) == (1, f"rlfleet: {expected}")
        assert not (workdir / "runs" / "never").exists()


@pytest.mark.parametrize("profile", PROFILES)
def test_a_judge_setting_the_gateway_does_not_know_fails_the_dry_run_naming_it(
    profile: str, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recipe's `judge.genrm` is handed to the reward gateway as it is: a key the
    gateway's GenRM config does not have fails `--dry-run` (and the start) on every
    launcher, naming the service and the key, not minutes later when the gateway starts
    (on SLURM, after a queue wait)."""
    monkeypatch.chdir(workdir)
    code, _, stderr = rl(
        "rlhf",
        "-c",
        "tiny/rlhf",
        "--run",
        profile,
        "--dry-run",
        "policy.model=tiny",  # a model the compose rollout container has
        "judge.genrm.swap_ordr=true",
    )
    line = error_line(stderr)
    assert code == 1 and line.startswith("rlfleet: reward: config error: genrm.swap_ordr:"), line
    assert "did you mean genrm.swap_order?" in line, line


def trainer_run(recipe_yaml: Path, run_dir: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "rlfleet_trainer", "run", "-c", str(recipe_yaml)]
    # A free rendezvous port: megatron's default (29511) may be taken by another test.
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "MASTER_PORT": str(pick_free_port())}
    return subprocess.run(
        [*command, "--run-dir", str(run_dir)], capture_output=True, text=True, timeout=300, env=env
    )


# One recipe per kind of refusal: a starting checkpoint that is not here, and an earlier
# stage's export not written yet (every super3/nano3 recipe fails one of these here).
@pytest.mark.parametrize("recipe", ["super3/rlvr1", "super3/rlvr2"])
def test_the_trainer_refuses_with_the_dry_runs_message(
    recipe: str, workdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recipes whose dry-run fails on a trainer check (here: a model not on this machine):
    the trainer itself, started on the same recipe, exits with the same message."""
    monkeypatch.chdir(workdir)
    loaded = load_recipe(recipe)
    problem = start_problem(loaded, 1)
    assert problem is not None
    recipe_yaml = tmp_path / "recipe.yaml"
    recipe_yaml.write_text(dump_yaml(loaded))
    result = trainer_run(recipe_yaml, tmp_path / "run")
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines()[-1] == f"rlfleet-trainer run: error: {problem}"


@pytest.mark.slow
def test_megatron_model_split_refusal_is_the_same_in_the_dry_run_and_the_trainer(
    workdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """super3/rlvr1 on a model and rows that exist: TP 4 cannot split the tiny model's 2
    key/value heads (and `rlfleet rl` would start its 4 ranks under torchrun). The dry-run
    says so from the model's config.json; the trainer, started as one process, says the
    same before it loads the model (check_start)."""
    monkeypatch.chdir(workdir)
    data = workdir / "data" / "tiny-rlvr1"
    overrides = [
        "policy.model=tiny",
        f"data.train_path={data / 'train' / 'data.jsonl'}",
        f"data.val_path={data / 'val' / 'data.jsonl'}",
    ]
    code, _, stderr = rl("rlvr", "-c", "super3/rlvr1", "--dry-run", *overrides)
    line = error_line(stderr)
    assert code == 1 and "policy.tensor_parallel_size=4 must divide the model's" in line, line
    recipe_yaml = tmp_path / "recipe.yaml"
    recipe_yaml.write_text(dump_yaml(load_recipe("super3/rlvr1", overrides)))
    result = trainer_run(recipe_yaml, tmp_path / "run")
    assert result.returncode == 1, result.stderr
    trainer_line = result.stderr.strip().splitlines()[-1]
    assert trainer_line == line.replace("rlfleet: ", "rlfleet-trainer run: error: ", 1)


def test_a_service_key_the_service_rejects_fails_the_dry_run_check_with_its_message() -> None:
    """The issue's SLURM plan gave the reward `sandbox_target=`: the check loads the
    overrides with the reward's own config model, as the service does when it starts."""
    problem = service_problem("reward", ["sandbox_target=h:1"], installed_only=False)
    assert problem == (
        "reward: config error: sandbox_target: unknown key; did you mean sandbox? "
        "(from override sandbox_target=h:1)"
    )
    started = subprocess.run(
        [sys.executable, "-m", "rlfleet_reward", "--port", "0", "sandbox_target=h:1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert started.returncode == 2
    assert started.stderr.strip().splitlines()[-1] == (
        "rlfleet-reward: config error: " + problem.removeprefix("reward: config error: ")
    )


def test_a_slurm_plan_starts_the_stages_sandbox_even_with_nodes_sandbox_0(
    workdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`nodes.sandbox = 0` once rendered a job with no sandbox and a reward with no
    sandbox.target (an RLVR stage's code environment could not score). The job's
    components now follow the stage's services: the sandbox gets a node and the reward
    its address, and the dry-run checks the reward's overrides with its own config."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "env.toml").write_text(ENV_TOML.replace("swe_runner = 1", "sandbox = 0"))
    data = workdir / "data" / "tiny-rlvr1"
    code, stdout, stderr = rl(
        "rlvr",
        "-c",
        "tiny/rlvr1",
        "--run",
        "cluster",
        "--dry-run",
        f"data.train_path={data / 'train' / 'data.jsonl'}",
        f"data.val_path={data / 'val' / 'data.jsonl'}",
    )
    assert code == 0, stderr
    assert "rlfleet-sandbox" in stdout
    assert "sandbox.target=$SANDBOX_TARGET" in stdout


def test_a_profile_the_plan_cannot_be_rendered_from_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SLURM profile without a service's image: one line naming the key (it was a
    traceback from the plan renderer)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "env.toml").write_text(ENV_TOML.replace('rollout = "r.sqsh"\n', ""))
    code, _, stderr = rl("rlvr", "-c", "test", "--run", "cluster", "--dry-run")
    assert code == 1
    assert error_line(stderr) == "rlfleet: images.rollout: no container image set in the profile"
