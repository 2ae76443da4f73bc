"""The `rlfleet` command as a user runs it: a real process, its exit code and output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

RLFLEET = str(Path(sys.executable).parent / "rlfleet")
PACKAGES = [
    "rlfleet",
    "rlfleet-core",
    "rlfleet-proto",
    "rlfleet-trainer",
    "rlfleet-rollout",
    "rlfleet-reward",
    "rlfleet-sandbox",
    "rlfleet-swe",
]


def rlfleet(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [RLFLEET, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )


def test_help_lists_the_commands() -> None:
    result = rlfleet("--help")
    assert result.returncode == 0
    for command in ("serve", "run", "doctor", "bench", "version"):
        assert command in result.stdout


@pytest.mark.parametrize(
    ("command", "shown"),
    [(("rl", "--help"), "[default: runs/<stage>]"), (("serve", "--help"), "[default: 127.0.0.1]")],
)
def test_help_shows_defaults_written_in_brackets(command: tuple[str, ...], shown: str) -> None:
    """Rich reads `[...]` as markup and dropped these two defaults from --help."""
    result = rlfleet(*command, env={"COLUMNS": "300"})
    assert result.returncode == 0 and shown in result.stdout


def test_version_lists_every_package() -> None:
    result = rlfleet("version")
    assert result.returncode == 0
    lines = dict(line.split() for line in result.stdout.splitlines())
    commit = lines.pop("commit")  # the checkout's HEAD, or "unknown" outside git
    assert commit == "unknown" or len(commit) == 40, commit
    assert sorted(lines) == sorted(PACKAGES)
    assert all(v[0].isdigit() for v in lines.values()), lines


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["run", "grpo.lr=abc"],
            "grpo.lr: expected a number, got 'abc' (from override grpo.lr=abc)",
        ),
        (["run", "grpo.lrr=1e-6"], "grpo.lrr: unknown key; did you mean grpo.lr?"),
        (
            ["run", "grpo.num_generations_per_prompt=1"],
            "grpo.num_generations_per_prompt: input should be greater than or equal to 2",
        ),
        (
            ["run", "policy.model=two words"],
            "policy.model: 'two words' is not a bundled name (smollm2-135m-instruct, tiny, tiny-nemotron-h), "
            "a local folder",
        ),
        (
            ["serve", "rollout", "model=org/bad--name"],
            "model: 'org/bad--name' is not a bundled name",
        ),
        (
            ["serve", "reward", "server.grace_s=soon"],
            "server.grace_s: expected a number, got 'soon'",
        ),
        (
            ["serve", "sandbox", "server.port=70000"],
            "server.port: input should be less than or equal to 65535",
        ),
        (
            ["run", "+grpo.lr=1e-6"],
            "grpo.lr: key already exists; use ++grpo.lr=1e-6 to override "
            "(from override +grpo.lr=1e-6)",
        ),
        (["run", "++grpo.lrr=1e-6"], "grpo.lrr: unknown key; did you mean grpo.lr?"),
        (["run", "~policy.modl"], "policy.modl: not in the config; did you mean policy.model?"),
        (["run", "grpo.lr=1e-6,2e-6"], "a comma outside brackets is a Hydra sweep"),
        (
            ["serve", "sandbox", "~server.grace_s=9"],
            "not 9; nothing deleted (from override ~server.grace_s=9)",
        ),
    ],
)
def test_bad_override_prints_one_line_naming_the_key(args: list[str], expected: str) -> None:
    result = rlfleet(*args)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert expected in lines[0]
    assert "Traceback" not in result.stderr


def test_unknown_service_names_the_choices() -> None:
    result = rlfleet("serve", "nope", "--port", "0")
    assert result.returncode == 2
    assert "unknown service 'nope'; choose one of: " in result.stderr
    assert "swe-runner" in result.stderr


def test_bench_records_json_lines(tmp_path: Path) -> None:
    bench_dir = tmp_path / "bench"
    bench_dir.mkdir()
    (bench_dir / "toy_speed.py").write_text(
        "from rlfleet_core.bench import BenchResult\n"
        "DESCRIPTION = 'toy'\n"
        "def run(quick=False):\n"
        "    n = 10 if quick else 100\n"
        "    return [BenchResult('toy-speed', 'items_per_s', 3.0 * n, 'items/s', 2.0 * n, target=1.2, device='cpu: test')]\n"
    )
    env = {"RLFLEET_BENCH_DIR": str(bench_dir)}
    listing = rlfleet("bench", env=env)
    assert "toy-speed" in listing.stdout and "toy" in listing.stdout
    result = rlfleet("bench", "toy-speed", "--json", "--quick", env=env)
    assert result.returncode == 0, result.stderr
    (row,) = [json.loads(line) for line in result.stdout.splitlines()]
    assert row["name"] == "toy-speed" and row["metric"] == "items_per_s"
    assert (row["value"], row["baseline"], row["ratio"], row["target"]) == (30.0, 20.0, 1.5, 1.2)
    assert row["device"] == "cpu: test" and row["unit"] == "items/s" and "timestamp" in row
    recorded = (bench_dir / "results" / "toy-speed.jsonl").read_text().splitlines()
    assert json.loads(recorded[0]) == row
    missing = rlfleet("bench", "nope", env=env)
    assert (
        missing.returncode == 2
        and "no benchmark 'nope'" in missing.stderr
        and "toy-speed" in missing.stderr
    )


def test_bench_finds_the_repository_bench_folder() -> None:
    repo = Path(__file__).resolve().parents[3]
    result = rlfleet("bench", cwd=repo / "libs")
    assert result.returncode == 0, result.stderr
    # Listing loads every module (for its DESCRIPTION): each one must import and be listed.
    listed = {line.split()[0] for line in result.stdout.splitlines() if line.strip()}
    # `_name.py` files are helpers the benchmarks import, not benchmarks.
    on_disk = {
        p.stem.replace("_", "-")
        for p in (repo / "bench").glob("*.py")
        if not p.name.startswith("_")
    }
    assert on_disk <= listed and {"grpo", "grpc-overhead"} <= listed, result.stdout


def test_reward_score_prints_json_and_names_bad_flags() -> None:
    ok = rlfleet(
        "reward",
        "score",
        "--env",
        "math",
        "--response",
        r"so \boxed{\frac{1}{2}}",
        "--field",
        "expected_answer=0.5",
    )
    assert ok.returncode == 0, ok.stderr
    result = json.loads(ok.stdout)
    assert (result["reward"], result["reward_components"], result["failure_kind"]) == (
        1.0,
        {"correctness": 1.0},
        None,
    )
    wrong = json.loads(
        rlfleet(
            "reward",
            "score",
            "--env",
            "math",
            "--response",
            "it is 3",
            "--field",
            "expected_answer=4",
        ).stdout
    )
    assert wrong["reward"] == 0.0 and wrong["failure_kind"] is None
    bad = rlfleet("reward", "score", "--env", "nope", "--response", "x")
    assert bad.returncode == 2 and "--env: unknown environment 'nope'" in bad.stderr


def test_serve_engine_and_model_flags_reach_the_rollout_config() -> None:
    # A bad engine name fails config validation, naming the key: proof the flag is wired.
    result = rlfleet("serve", "rollout", "--port", "0", "--engine", "tensorrt", "--model", "tiny")
    assert result.returncode == 2
    (line,) = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert line.startswith("rlfleet: config error: engine:") and "tensorrt" in line


def test_cli_run_errors_are_one_line(tmp_path: Path) -> None:
    from rlfleet_cli.main import app
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["run", "--resume", "--out", str(tmp_path / "nothing")])
    assert result.exit_code == 1
    assert "holds no run" in result.output and "Traceback" not in result.output
    result = CliRunner().invoke(app, ["run", "--engine", "tgi", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "--engine: expected vllm or hf" in result.output


def test_rollout_with_an_uncached_hub_id_offline_fails_in_one_line(tmp_path: Path) -> None:
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path)}
    args = ("serve", "rollout", "--port", "0", "--engine", "hf", "--model", "nope-org/nope-model")
    result = rlfleet(*args, env=env)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    (line,) = [ln for ln in result.stderr.splitlines() if "nope-org/nope-model" in ln]
    assert line.startswith("rlfleet rollout: model 'nope-org/nope-model': not in the Hugging Face")
    assert f"({tmp_path})" in line and "`hf download nope-org/nope-model`" in line


def test_a_killed_trainer_is_named() -> None:
    """`rlfleet rl` (local) used to exit silently when the kernel's OOM killer took the
    trainer (a tool-use stage at micro-batch 4): the signal is now named, with the fix."""
    from pathlib import Path

    from rlfleet_cli.commands.rl import trainer_exit_message
    from rlfleet_pipeline.stage import shell_exit_code as _exit_code

    killed = trainer_exit_message("rlvr1", -9, Path("runs/rlvr1"))
    assert "killed by SIGKILL" in killed and "train_micro_batch_size" in killed
    assert "--resume" in killed and _exit_code(-9) == 137
    assert "killed by SIGTERM" in trainer_exit_message("rlvr1", -15, Path("r"))
    assert "exited with code 1" in trainer_exit_message("rlvr1", 1, Path("r"))
    assert _exit_code(1) == 1
