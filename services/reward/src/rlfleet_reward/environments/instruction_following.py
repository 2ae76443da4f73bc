"""`instruction_following`: verifiable instructions combined per prompt, graded as NeMo-Gym's
`instruction_following` server grades them.

Row fields (NeMo-Gym's shape, IFEval's and IFBench's): under `verifier_metadata`, or at the
top level (NeMo-Gym's legacy layout; `verifier_metadata` wins where both give a field):
- `instruction_id_list` (required): e.g. ["keywords:existence", "punctuation:no_comma"];
  every id must be one of `if_all_checkers.CHECKERS`: the ids of NeMo-Gym's
  `verifiable_instructions` registry (if_checkers.py, if_checkers_more.py) plus IFBench ids
  (rlfleet's own; NeMo-Gym does not know them and scores them 0).
- `kwargs` (optional): one object per instruction, same order; keys an instruction does
  not take, and null values (IFBench writes every key), are ignored.
- `grading_mode` (optional): `binary` (default; reward 1 only if every instruction is
  followed, IFEval's prompt-level strict accuracy; `all` is the same) or `fraction` (the
  share of instructions followed, one reward component per instruction).
- `prompt`, `id`: carried, not graded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from rlfleet_reward.environments.base import Environment, choice, require
from rlfleet_reward.environments.if_all_checkers import CHECKERS
from rlfleet_reward.environments.if_checkers import detect_language
from rlfleet_reward.types import RowError, Sample, Score


@dataclass(frozen=True)
class IfSpec:
    instructions: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...]
    fraction: bool


def parse_instructions(
    row: Mapping[str, Any],
) -> tuple[tuple[str, tuple[tuple[str, Any], ...]], ...]:
    """Validated (instruction id, converted args) pairs."""
    ids = require(row, "instruction_id_list")
    if not isinstance(ids, list) or not ids:
        raise RowError("instruction_id_list", "expected a non-empty list of instruction ids")
    raw_kwargs = row.get("kwargs")
    if raw_kwargs is None:
        raw_kwargs = [{} for _ in ids]
    if not isinstance(raw_kwargs, list) or len(raw_kwargs) != len(ids):
        raise RowError("kwargs", f"expected a list of {len(ids)} objects, one per instruction")
    parsed = []
    for i, (instruction_id, given) in enumerate(zip(ids, raw_kwargs, strict=True)):
        checker = CHECKERS.get(instruction_id) if isinstance(instruction_id, str) else None
        if checker is None:
            raise RowError(
                f"instruction_id_list[{i}]",
                f"unknown instruction {instruction_id!r}; supported: {', '.join(sorted(CHECKERS))}",
            )
        args = checker.convert_kwargs(given, f"kwargs[{i}]")
        values = dict(args)
        if instruction_id == "length_constraints:nth_paragraph_first_word" and not (
            1 <= values["nth_paragraph"] <= values["num_paragraphs"]
        ):
            # verifiable_instructions would pick a random paragraph instead.
            raise RowError(f"kwargs[{i}].nth_paragraph", "must be within [1, num_paragraphs]")
        parsed.append((instruction_id, args))
    return tuple(parsed)


class InstructionFollowingEnvironment(Environment):
    name: ClassVar[str] = "instruction_following"
    placement = "loop"  # cost per answer: docs/reward.md
    description: ClassVar[str] = (
        "IFEval/IFBench-style verifiable instructions (length, keywords, format, case, JSON, sections, ...)."
    )
    required_fields: ClassVar[tuple[str, ...]] = ("instruction_id_list",)
    optional_fields: ClassVar[tuple[str, ...]] = ("kwargs", "grading_mode", "prompt")

    def warm(self) -> None:
        # langdetect loads its 55 language profiles on first use (~1 s) and publishes the
        # factory before they are all loaded. On the loop, that first call would overrun the
        # inline guard and be interrupted midway, leaving a factory that knows a few
        # languages for the life of the process (short English texts then read as English
        # far more often than NeMo-Gym's, seen in the parity test). Load them up front.
        detect_language("The quick brown fox jumps over the lazy dog.")

    def parse_row(self, row: Mapping[str, Any]) -> IfSpec:
        meta = row.get("verifier_metadata")
        if meta is not None:
            if not isinstance(meta, dict):
                raise RowError(
                    "verifier_metadata", f"expected an object, got {type(meta).__name__}"
                )
            row = {**row, **meta}
        mode = choice(row, "grading_mode", ("binary", "all", "fraction"), "binary")
        return IfSpec(parse_instructions(row), mode == "fraction")

    def score(self, spec: IfSpec, sample: Sample) -> Score:
        results: list[
            tuple[str, bool]
        ] = []  # (component key, followed?) in row order; a repeated id gets a #index
        for i, (instruction_id, args) in enumerate(spec.instructions):
            key = f"if:{instruction_id}"
            if any(k == key for k, _ in results):
                key = f"{key}#{i}"
            results.append((key, bool(CHECKERS[instruction_id].check(sample.text, **dict(args)))))
        passed = [k[3:] for k, ok in results if ok]
        failed = [k[3:] for k, ok in results if not ok]
        info = {
            "followed": ",".join(passed),
            "not_followed": ",".join(failed),
            "num_followed": f"{len(passed)}/{len(results)}",
        }
        info = {k: str(v) for k, v in info.items()}
        if spec.fraction:
            share = 1.0 / len(results)
            # The reward is followed/total exactly, as NeMo-Gym computes it (a sum of
            # shares can differ in the last bit, e.g. 3 x 0.2 != 0.6).
            return Score(
                reward=len(passed) / len(results),
                components={k: share if ok else 0.0 for k, ok in results},
                info=info,
            )
        return Score(
            reward=1.0 if not failed else 0.0,
            components={"all_followed": 1.0 if not failed else 0.0},
            info=info,
        )
