r"""`math`: answers checked for mathematical equivalence with math-verify.

Row fields (NeMo-Gym math shape):
- `expected_answer` (required): the gold answer, LaTeX or plain ("\frac{1}{2}", "0.5",
  "\{1,2\}", "[0,1)").
- `question` (optional): not used for grading; echoed back.

The answer is taken from the last \boxed{} in the response, else math-verify's own
final-answer extraction, else the last "Final answer: ..." / "The answer is ..." line.
Equivalent forms score 1 (0.5 = \frac{1}{2}, {1,2} = {2,1}, 5\text{ cm} = 5).

math-verify's built-in timeouts are switched off on purpose: on expiry they return
False, which is exactly the silent 0 this gateway exists to avoid. Instead, answers that
would make it hang are refused before parsing (answer_limits.py): a final answer over 400
characters (`verdict` answer_too_long), brackets nested over 8 deep, a power tower or
exponent above 10,000, a factorial above 10,000! (answer_too_complex); `info.reason` says
which. Whole-text extraction reads only the last 2,000 characters, whitespace runs
collapsed. The worker's own timeout still turns any other hang into a TIMEOUT failure.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from rlfleet_reward.environments.answer_limits import (
    MAX_ANSWER_CHARS,
    TAIL_CHARS,
    answer_problem,
    bounded_tail,
)
from rlfleet_reward.environments.base import Environment, require_str
from rlfleet_reward.text import final_answer_line, find_boxed
from rlfleet_reward.types import Sample, Score, binary


@dataclass(frozen=True)
class MathSpec:
    expected_answer: str


def _as_latex(answer: str) -> str:
    answer = answer.strip()
    if "$" in answer or "\\boxed" in answer or "\\(" in answer or "\\[" in answer:
        return answer
    return f"${answer}$"


@functools.lru_cache(maxsize=4096)
def _parse_gold(expected: str) -> Any:
    from math_verify import parse  # type: ignore[import-untyped]

    return parse(_as_latex(expected), parsing_timeout=None)


class AnswerRefused(Exception):
    """An answer too costly to parse (answer_limits); args: verdict, reason."""


def _checked(answer: str, *, max_chars: int = MAX_ANSWER_CHARS) -> str:
    problem = answer_problem(answer, max_chars=max_chars)
    if problem is not None:
        raise AnswerRefused(*problem)
    return answer


def _parse_answer(text: str) -> tuple[Any, str]:
    """(parsed answer, the string it came from); an empty list when nothing parses.
    Raises AnswerRefused before handing math-verify anything pathological."""
    from math_verify import parse

    boxed = find_boxed(text)
    if boxed:
        parsed = parse(f"${_checked(boxed[-1])}$", parsing_timeout=None)
        if parsed:
            return parsed, boxed[-1]
    tail = _checked(bounded_tail(text), max_chars=TAIL_CHARS)
    parsed = parse(tail, parsing_timeout=None)
    if parsed:
        return parsed, str(parsed[-1])
    line = final_answer_line(tail)
    if line:
        parsed = parse(_as_latex(_checked(line)), parsing_timeout=None)
        if parsed:
            return parsed, line
    return [], ""


def is_equivalent(expected: str, response_text: str) -> tuple[bool, str]:
    """(equivalent?, extracted answer). Raises only on verifier bugs, never on bad text
    (AnswerRefused for a pathological answer)."""
    from math_verify import verify

    gold = _parse_gold(expected)
    if not gold:
        return False, ""
    answer, extracted = _parse_answer(response_text)
    if not answer:
        return False, ""
    return bool(verify(gold, answer, timeout_seconds=None)), extracted


class MathEnvironment(Environment):
    name: ClassVar[str] = "math"
    placement = "process"  # cost per answer: docs/reward.md
    description: ClassVar[str] = (
        "Math answers (\\boxed{} or final-answer lines) checked for equivalence with math-verify."
    )
    required_fields: ClassVar[tuple[str, ...]] = ("expected_answer",)
    optional_fields: ClassVar[tuple[str, ...]] = ("question",)
    preload_modules: ClassVar[tuple[str, ...]] = (
        "math_verify",
        "sympy",
        "rlfleet_reward.environments.math_warmup",
    )

    def parse_row(self, row: Mapping[str, Any]) -> MathSpec:
        return MathSpec(expected_answer=require_str(row, "expected_answer"))

    def score(self, spec: MathSpec, sample: Sample) -> Score:
        logging.getLogger("math_verify").setLevel(logging.ERROR)
        try:
            ok, extracted = is_equivalent(spec.expected_answer, sample.text)
        except AnswerRefused as exc:
            verdict, reason = exc.args
            return binary("correctness", False, verdict=verdict, reason=reason)
        verdict = "correct" if ok else ("wrong" if extracted else "no_answer")
        return binary("correctness", ok, extracted_answer=extracted, verdict=verdict)
