"""`instruction_following`: IFEval-style verifiable instructions, combined per prompt.

Row fields (IFEval / IFBench / NeMo-Gym IF shape):
- `instruction_id_list` (required): e.g. ["keywords:existence", "punctuation:no_comma"];
  every id must be one of `if_checkers.CHECKERS` (35 ids: IFEval's plus IFBench's that need
  no NLTK data).
- `kwargs` (optional): one object per instruction, same order; keys an instruction does
  not take, and null values (IFBench writes every key), are ignored.
- `grading_mode` (optional): `all` (default; reward 1 only if every instruction is
  followed, IFEval's prompt-level strict accuracy) or `fraction` (each followed
  instruction earns 1/k, one reward component per instruction).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from rlfleet_reward.environments.base import Environment, choice, require
from rlfleet_reward.environments.if_checkers import CHECKERS
from rlfleet_reward.types import RowError, Sample, Score, scored


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
        given = given or {}
        if not isinstance(given, dict):
            raise RowError(f"kwargs[{i}]", f"expected an object, got {type(given).__name__}")
        args = []
        for name, convert in checker.args.items():
            if given.get(name) is None:
                raise RowError(f"kwargs[{i}].{name}", f"required by {instruction_id}, but missing")
            try:
                args.append((name, convert(given[name])))
            except ValueError as exc:
                raise RowError(f"kwargs[{i}].{name}", str(exc)) from None
        parsed.append((instruction_id, tuple(args)))
    return tuple(parsed)


class InstructionFollowingEnvironment(Environment):
    name: ClassVar[str] = "instruction_following"
    placement = "loop"  # cost per answer: docs/reward.md
    description: ClassVar[str] = (
        "IFEval/IFBench-style verifiable instructions (length, keywords, format, case, JSON, sections, ...)."
    )
    required_fields: ClassVar[tuple[str, ...]] = ("instruction_id_list",)
    optional_fields: ClassVar[tuple[str, ...]] = ("kwargs", "grading_mode", "prompt")

    def parse_row(self, row: Mapping[str, Any]) -> IfSpec:
        fraction = choice(row, "grading_mode", ("all", "fraction"), "all") == "fraction"
        return IfSpec(parse_instructions(row), fraction)

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
        if spec.fraction:
            share = 1.0 / len(results)
            return scored({k: share if ok else 0.0 for k, ok in results}, **info)
        return scored({"all_followed": 1.0 if not failed else 0.0}, **info)
