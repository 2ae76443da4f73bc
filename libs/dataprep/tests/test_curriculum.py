"""The curriculum pass of `rlfleet data prep rl`: the ordering rule on its own, then the
whole pass through a real rollout (hf engine, tiny model) and reward gateway."""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from rlfleet_dataprep.curriculum import Measured, order_by_difficulty

RLFLEET = str(Path(sys.executable).parent / "rlfleet")


def test_solved_prompts_dropped_rest_ordered_easiest_first() -> None:
    rows = [{"id": name} for name in "abcde"]
    measured = [
        Measured(0, (0.0, 0.0, 0.0)),  # never solved: hardest
        Measured(1, (1.0, 1.0, 1.0)),  # solved every time: dropped
        Measured(2, (1.0, 0.0, 0.5)),  # 1/3 solved
        Measured(3, (1.0, 1.0, 0.0)),  # 2/3 solved: easiest kept
        Measured(4, (0.5, 0.5, 0.0)),  # none fully solved, but partial credit
    ]
    kept, dropped = order_by_difficulty(rows, measured)
    assert dropped == 1
    assert [r["id"] for r in kept] == ["d", "c", "e", "a"]
    assert kept[0]["curriculum"] == {"pass_rate": 2 / 3, "mean_reward": 0.666667, "samples": 3}
    # Ties keep the original order.
    tied, _ = order_by_difficulty(rows[:2], [Measured(0, (0.0, 0.0)), Measured(1, (0.0, 0.0))])
    assert [r["id"] for r in tied] == ["a", "b"]


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [RLFLEET, "data", "prep", "rl", *args], capture_output=True, text=True, timeout=timeout
    )


def _if_row(row_id: str, instructions: list[tuple[str, dict[str, object]]], **extra: object) -> str:
    return json.dumps(
        {
            "id": row_id,
            "env": "instruction_following",
            "responses_create_params": {"input": "Say something."},
            "instruction_id_list": [i for i, _ in instructions],
            "kwargs": [k for _, k in instructions],
            **extra,
        }
    )


def test_bad_curriculum_options_are_named(tmp_path: Path) -> None:
    blend = tmp_path / "b.jsonl"
    blend.write_text(_if_row("x", [("punctuation:no_comma", {})]) + "\n")
    for args, field in (
        (["--curriculum-samples", "1"], "--curriculum-samples"),
        (
            ["--curriculum-samples", "2", "--curriculum-temperature", "0"],
            "--curriculum-temperature",
        ),
        (["--curriculum-samples", "2", "--curriculum-engine", "tgi"], "--curriculum-engine"),
    ):
        result = _cli(str(blend), "--out", str(tmp_path / "d"), "--val-rows", "0", *args)
        assert result.returncode == 2, result.stderr
        assert field in result.stderr and "Traceback" not in result.stderr


def test_unreachable_rollout_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens
    blend = tmp_path / "b.jsonl"
    blend.write_text(_if_row("x", [("punctuation:no_comma", {})]) + "\n")
    result = _cli(
        str(blend),
        "--out",
        str(tmp_path / "d"),
        "--val-rows",
        "0",
        "--curriculum-samples",
        "2",
        "--rollout-url",
        f"http://127.0.0.1:{port}",
        "--reward",
        f"127.0.0.1:{port}",
    )
    assert result.returncode == 2, result.stderr
    assert f"127.0.0.1:{port}/v1/models" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(
    importlib.util.find_spec("rlfleet_rollout") is None
    or importlib.util.find_spec("rlfleet_reward") is None,
    reason="needs the rollout and reward packages",
)
def test_curriculum_pass_through_real_services(tmp_path: Path) -> None:
    # Instruction-following rows whose outcome does not depend on what the model says:
    # "fewer than 10000 words" always holds for 8 tokens, a nonsense keyword never
    # appears, and `fraction` grading of the two gives 0.5.
    trivial = ("length_constraints:number_words", {"relation": "less than", "num_words": 10000})
    never = ("keywords:existence", {"keywords": ["zqxjvkwzqxjv"]})
    rows = [
        _if_row("hard", [never]),
        _if_row("solved", [trivial]),
        _if_row("half", [trivial, never], grading_mode="fraction"),
        _if_row("held-out", [trivial]),
    ]
    blend = tmp_path / "if.jsonl"
    blend.write_text("\n".join(rows) + "\n")
    out = tmp_path / "data"
    result = _cli(
        str(blend),
        "--out",
        str(out),
        "--val-rows",
        "1",
        "--curriculum-samples",
        "3",
        "--curriculum-model",
        "tiny",
        "--curriculum-engine",
        "hf",
        "--curriculum-max-tokens",
        "8",
        timeout=540,
    )
    assert result.returncode == 0, result.stderr
    assert "dropped 1 training prompts: solved_by_start_model" in result.stdout
    prepared = out / "if"
    train = [
        json.loads(line) for line in (prepared / "train" / "data.jsonl").read_text().splitlines()
    ]
    assert [r["id"] for r in train] == ["half", "hard"]
    assert [r["curriculum"]["mean_reward"] for r in train] == [0.5, 0.0]
    val = [json.loads(line) for line in (prepared / "val" / "data.jsonl").read_text().splitlines()]
    assert [r["id"] for r in val] == ["held-out"]  # the held-out rows are never measured
    manifest = json.loads((prepared / "manifest.json").read_text())
    assert manifest["dropped"] == {"solved_by_start_model": 1}
    assert manifest["options"]["curriculum"]["samples"] == 3
    assert manifest["options"]["curriculum"]["measured"] == 3
