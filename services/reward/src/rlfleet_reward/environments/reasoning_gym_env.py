"""`reasoning_gym`: any reasoning-gym task, scored by that task's own scorer.

Row fields (reasoning-gym's dataset entry, flattened or under `entry`):
- `question` (optional): the task prompt (not used for scoring).
- `answer` (required): the gold answer as reasoning-gym generated it (a JSON number is
  read as its string, which is what the scorers compare).
- `metadata` (required): the entry's metadata; `metadata.source_dataset` names the task.
- `task` (optional): the task name, when `metadata.source_dataset` is absent.

The answer is read from <answer>...</answer> (reasoning-gym's convention), else the last
\\boxed{}, else the whole response. Scorers may give partial credit: the reward is the
scorer's value in [0, 1], as the single component `task_score`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from rlfleet_reward.environments.base import Environment
from rlfleet_reward.text import find_boxed
from rlfleet_reward.types import FailureKind, RowError, Sample, Score, failure, scored


@functools.cache
def task_names() -> frozenset[str]:
    """Registered reasoning-gym tasks (importing reasoning_gym takes seconds: see warm())."""
    from reasoning_gym.factory import DATASETS

    return frozenset(DATASETS)


@dataclass(frozen=True)
class ReasoningGymSpec:
    task: str
    entry: dict[str, Any]


def extract_answer(text: str) -> str:
    tagged = re.findall(r"<answer>(.*?)</answer>", text, flags=re.DOTALL)
    if tagged:
        return str(tagged[-1]).strip()
    boxed = find_boxed(text)
    if boxed:
        return boxed[-1].strip()
    return text.strip()


class ReasoningGymEnvironment(Environment):
    name: ClassVar[str] = "reasoning_gym"
    placement = "process"  # cost per answer: docs/reward.md
    description: ClassVar[str] = "Any reasoning-gym task by name, scored by its own scorer."
    required_fields: ClassVar[tuple[str, ...]] = ("answer", "metadata")
    optional_fields: ClassVar[tuple[str, ...]] = ("question", "task", "entry")
    preload_modules: ClassVar[tuple[str, ...]] = ("reasoning_gym",)

    def warm(self) -> None:
        task_names()

    def parse_row(self, row: Mapping[str, Any]) -> ReasoningGymSpec:
        prefix = ""
        if row.get("entry") is not None:
            if not isinstance(row["entry"], dict):
                raise RowError("entry", f"expected an object, got {type(row['entry']).__name__}")
            row, prefix = row["entry"], "entry."
        metadata = row.get("metadata")
        if metadata is None:
            raise RowError(f"{prefix}metadata", "required, but missing")
        if not isinstance(metadata, dict):
            raise RowError(
                f"{prefix}metadata", f"expected an object, got {type(metadata).__name__}"
            )
        if "answer" not in row:
            raise RowError(f"{prefix}answer", "required, but missing")
        task = metadata.get("source_dataset") or row.get("task")
        if not isinstance(task, str) or not task:
            raise RowError(
                f"{prefix}metadata.source_dataset",
                "required (or a `task` field): the reasoning-gym task name",
            )
        if task not in task_names():
            raise RowError(
                f"{prefix}metadata.source_dataset", f"unknown reasoning-gym task {task!r}"
            )
        answer = row["answer"]
        if isinstance(answer, int | float) and not isinstance(answer, bool):
            answer = str(answer)  # scorers compare strings; a JSON number is the same answer
        if not isinstance(answer, str):
            # Refused here, not left to fail inside the scorer as a verifier error.
            raise RowError(
                f"{prefix}answer", f"expected a string or number, got {type(answer).__name__}"
            )
        entry = {"question": row.get("question", ""), "answer": answer, "metadata": metadata}
        return ReasoningGymSpec(task=task, entry=entry)

    def score(self, spec: ReasoningGymSpec, sample: Sample) -> Score:
        from reasoning_gym import get_score_answer_fn

        answer = extract_answer(sample.text)
        value = get_score_answer_fn(spec.task)(answer, spec.entry)
        if not isinstance(value, int | float) or not 0.0 <= float(value) <= 1.0:
            return failure(
                FailureKind.VERIFIER_ERROR,
                f"{spec.task} scorer returned {value!r}, not a number in [0, 1]",
            )
        return scored({"task_score": float(value)}, extracted_answer=answer, task=spec.task)
