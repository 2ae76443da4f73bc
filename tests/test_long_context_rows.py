"""Cross-package: rows of the data-prep source `long_context` scored by the reward
gateway's `long_context` environment, and the bundled `super-sample` blend parsed by the
environments of its rows. A solver that reads only the prompt (regular
expressions over the document) must reach the row's expected answer, and its answer must
score 1, a wrong one 0; so the generator's answers are right and the verifier reads them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from rlfleet_contracts.rows import env_of, prompt_messages
from rlfleet_dataprep.long_context import TASKS
from rlfleet_dataprep.prep import PrepOptions, prepare_rl
from rlfleet_dataprep.sources import fill_placeholder
from rlfleet_reward.environments import get_environment
from rlfleet_reward.types import Sample


def solve(task: str, prompt: str) -> list[str]:
    """The answer, from the prompt alone."""
    question = prompt.rsplit("</text>", 1)[1]
    if task.startswith("niah"):
        key = re.search(r"magic numbers? for (\S+?) mentioned", question)
        assert key
        return re.findall(rf"magic numbers for {re.escape(key.group(1))} is: (\d+)\.", prompt)
    if task == "multi_hop":
        name = re.search(r"VAR (\w+) hold", question)
        assert name
        assignments = dict(re.findall(r"VAR (\w+) = (VAR \w+|\d+)\.", prompt))
        value = assignments[name.group(1)]
        while value.startswith("VAR "):
            value = assignments[value[4:]]
        return [value]
    city = re.search(r"from (\w+)\?", question)
    assert city
    weights = [int(w) for w in re.findall(rf"from {city.group(1)} weighing (\d+) kg", prompt)]
    total = {"aggregate_count": len(weights), "aggregate_sum": sum(weights)}
    return [str(total.get(task, max(weights)))]


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_generated_rows_are_solvable_and_scored(task: str, seed: int) -> None:
    row = fill_placeholder(
        {
            "_placeholder": {
                "source": "long_context",
                "task": task,
                "seed": seed,
                "length_chars": 30_000,
            }
        }
    )
    answer = solve(task, prompt_messages(row)[-1]["content"])
    expected: Any = row["expected_answer"]
    assert sorted(answer) == sorted(expected if isinstance(expected, list) else [expected])
    env = get_environment("long_context")
    spec = env.parse_row(row)
    right = env.score(spec, Sample("Reading...\nFinal Answer: " + ", ".join(reversed(answer))))
    assert right.reward == 1.0, right.info
    wrong = env.score(spec, Sample("Final Answer: " + ", ".join([*answer[:-1], "0"])))
    assert wrong.reward == 0.0, wrong.info


def test_super_sample_blend_prepares_and_every_row_parses(tmp_path: Path) -> None:
    out, _ = prepare_rl("super-sample", PrepOptions(out=tmp_path / "data", val_rows=4))
    rows = [
        json.loads(line)
        for split in ("train", "val")
        for line in (out / split / "data.jsonl").read_text().splitlines()
    ]
    envs = sorted({env_of(row) for row in rows})
    assert envs == ["long_context", "math_with_code", "multi_challenge"]
    for row in rows:
        get_environment(env_of(row)).parse_row(row)  # raises RowError naming a bad field
