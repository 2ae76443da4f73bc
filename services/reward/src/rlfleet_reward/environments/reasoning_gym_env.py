"""`reasoning_gym`: any reasoning-gym task, scored by that task's own scorer, as NeMo-Gym's
`reasoning_gym` resources server scores it.

Row fields (NeMo-Gym's / reasoning-gym's dataset entry, flattened or under `entry`):
- `question` (optional): the task prompt, passed to the scorer in the entry.
- `answer` (required, may be null: some tasks score from metadata): the gold answer as
  reasoning-gym generated it (a JSON number is read as its string).
- `metadata` (required): the entry's metadata; `metadata.source_dataset` names the task.
- `task` (optional): the task name, when `metadata.source_dataset` is absent.
- `answer_extraction` (optional, rlfleet): `nemo_gym` (default) or `balanced_boxed`.

The answer is read as NeMo-Gym reads it: the last <answer>...</answer>, else the *first*
`\\boxed{...}` up to its first closing brace (`\\boxed{\\frac{1}{2}}` gives `\\frac{1`),
else the whole response. `balanced_boxed` (opt-in) takes the last box with nested braces
balanced instead. A scorer that raises on the answer gives 0, as in NeMo-Gym. Scorers may
give partial credit: the reward is the scorer's value in [0, 1], as the single component
`task_score`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from rlfleet_reward.environments.base import Environment, choice
from rlfleet_reward.text import find_boxed
from rlfleet_reward.types import FailureKind, RowError, Sample, Score, failure, scored


@functools.cache
def task_names() -> frozenset[str]:
    """Registered reasoning-gym tasks (importing reasoning_gym takes seconds: see warm())."""
    from reasoning_gym.factory import DATASETS

    return frozenset(DATASETS)


_FIRST_FLAT_BOX = re.compile(r"\\boxed\{([^}]+)\}")


@dataclass(frozen=True)
class ReasoningGymSpec:
    task: str
    entry: dict[str, Any]
    balanced_boxed: bool = False


def extract_answer(text: str, balanced_boxed: bool = False) -> str:
    tagged = re.findall(r"<answer>(.*?)</answer>", text, flags=re.DOTALL)
    if tagged:
        return str(tagged[-1]).strip()
    if balanced_boxed:
        boxed = find_boxed(text)
        if boxed:
            return boxed[-1].strip()
    elif (m := _FIRST_FLAT_BOX.search(text)) is not None:
        return m.group(1).strip()
    return text.strip()


class ReasoningGymEnvironment(Environment):
    name: ClassVar[str] = "reasoning_gym"
    placement = "process"  # cost per answer: docs/reward.md
    description: ClassVar[str] = "Any reasoning-gym task by name, scored by its own scorer."
    required_fields: ClassVar[tuple[str, ...]] = ("answer", "metadata")
    optional_fields: ClassVar[tuple[str, ...]] = ("question", "task", "entry", "answer_extraction")
    preload_modules: ClassVar[tuple[str, ...]] = ("reasoning_gym",)

    def warm(self) -> None:
        task_names()

    def parse_row(self, row: Mapping[str, Any]) -> ReasoningGymSpec:
        extraction = choice(row, "answer_extraction", ("nemo_gym", "balanced_boxed"), "nemo_gym")
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
        if answer is not None and not isinstance(answer, str):
            # Refused here, not left to fail inside the scorer as a verifier error.
            raise RowError(
                f"{prefix}answer", f"expected a string or number, got {type(answer).__name__}"
            )
        entry = {"question": row.get("question", ""), "answer": answer, "metadata": metadata}
        return ReasoningGymSpec(task, entry, extraction == "balanced_boxed")

    def score(self, spec: ReasoningGymSpec, sample: Sample) -> Score:
        from reasoning_gym import get_score_answer_fn

        # NeMo-Gym's extraction reads its own join of the message parts; ours the graded text.
        text = sample.text if spec.balanced_boxed else sample.nemo_gym_text
        answer = extract_answer(text, spec.balanced_boxed)
        try:
            value = get_score_answer_fn(spec.task)(answer=answer, entry=spec.entry)
        except Exception as exc:  # scorers raise on answers they cannot parse
            # NeMo-Gym scores such an answer 0 (a wrong answer, trained on), not a failure.
            return scored(
                {"task_score": 0.0},
                extracted_answer=answer,
                task=spec.task,
                scorer_error=f"{type(exc).__name__}: {exc}",
            )
        if not isinstance(value, int | float) or not 0.0 <= float(value) <= 1.0:
            return failure(
                FailureKind.VERIFIER_ERROR,
                f"{spec.task} scorer returned {value!r}, not a number in [0, 1]",
            )
        return scored({"task_score": float(value)}, extracted_answer=answer, task=spec.task)
