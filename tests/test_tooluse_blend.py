"""The bundled tool-use blend (tiny-tooluse): generated deterministically, passes data
prep's row check, holds every difficulty level in both splits, and each row's goal is
reachable: the intended calls, run through the real `tool_use` episode environment,
score 1 (and no calls score 0)."""

from __future__ import annotations

import asyncio
import json
import random
import re
from pathlib import Path
from typing import Any

import pytest
from rlfleet_dataprep.blends.make_bundled import BLENDS, HERE
from rlfleet_dataprep.blends.tool_use import tool_use_rows
from rlfleet_dataprep.prep import PrepOptions, prepare_rl

pytest.importorskip("rlfleet_reward", reason="the reward package is not installed")


def bundled_rows() -> list[dict[str, Any]]:
    return [json.loads(line) for line in (HERE / "tiny-tooluse.jsonl").read_text().splitlines()]


def test_bundled_file_is_what_the_generator_writes() -> None:
    assert tool_use_rows(140, seed=7) == tool_use_rows(140, seed=7)
    rows = list(BLENDS["tiny-tooluse"])
    random.Random(0).shuffle(rows)  # as make_bundled.main does
    assert bundled_rows() == json.loads(json.dumps(rows, sort_keys=True))


def test_blend_preps_with_every_level_in_both_splits(tmp_path: Path) -> None:
    _, manifest = prepare_rl("tiny-tooluse", PrepOptions(out=tmp_path, val_rows=28))
    assert manifest.options["row_check"] == "reward environments"
    for split, n in (("train", 112), ("val", 28)):
        rows = [
            json.loads(line)
            for line in (tmp_path / "tiny-tooluse" / split / "data.jsonl").read_text().splitlines()
        ]
        assert len(rows) == n
        levels = {re.search(r"-l(\d)-", r["id"]).group(1) for r in rows}  # type: ignore[union-attr]
        assert levels == {"1", "2", "3"}, split


def intended_calls(row: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The calls that solve a row, read from its task text and goal."""
    task = row["responses_create_params"]["input"][-1]["content"]
    start, goal = row["initial_state"]["accounts"], row["goal_state"]["accounts"]
    calls: list[tuple[str, dict[str, Any]]] = []
    if m := re.match(r"What is the balance of account (\w+)\?", task):
        return [("get_balance", {"account_id": m.group(1)})]
    if m := re.match(r"Transfer (\d+) from account (\w+) to account (\w+)", task):
        amount, source, target = int(m.group(1)), m.group(2), m.group(3)
        calls.append(("transfer", {"from_account": source, "to_account": target, "amount": amount}))
    if m := re.match(r"Move all the money in account (\w+) to account (\w+)", task):
        source, target = m.group(1), m.group(2)
        amount = start[source]["balance"]
        calls += [
            ("get_balance", {"account_id": source}),
            ("transfer", {"from_account": source, "to_account": target, "amount": amount}),
        ]
    if m := re.match(r"Freeze every account of (\w+)", task):
        calls.append(("list_accounts", {"owner": m.group(1)}))
    for account_id, body in goal.items():
        if body["frozen"] != start[account_id]["frozen"]:
            calls.append(("set_frozen", {"account_id": account_id, "frozen": body["frozen"]}))
    return calls


def run_episode(row: dict[str, Any], calls: list[tuple[str, dict[str, Any]]]) -> float:
    from rlfleet_reward.episodes import get_episode_environment
    from rlfleet_reward.types import Sample

    env = get_episode_environment("tool_use")
    spec = env.parse_row(row)

    async def run() -> float:
        state = await env.open(spec, None)  # type: ignore[arg-type]
        for name, arguments in calls:
            await env.call(state, name, arguments, None)  # type: ignore[arg-type]
        answer = f"Done: {row.get('expected_answer', '')}"
        score = await env.score(spec, state, Sample(answer, "", 0), None)  # type: ignore[arg-type]
        return score.reward

    return asyncio.run(run())


def test_every_row_is_solvable_and_not_solved_by_doing_nothing() -> None:
    rows = bundled_rows()
    kinds = {row["id"].rsplit("-", 1)[-1] for row in rows}
    assert len(kinds) == 7, kinds
    for row in rows:
        calls = intended_calls(row)
        assert 1 <= len(calls) <= 3, (row["id"], calls)
        assert run_episode(row, calls) == 1.0, row["id"]
        if "expected_answer" not in row:
            assert run_episode(row, []) == 0.0, row["id"]
