r"""`math`: answers checked for mathematical equivalence with math-verify.

Row fields (NeMo-Gym math shape):
- `expected_answer` (required): the gold answer, LaTeX or plain ("\frac{1}{2}", "0.5",
  "\{1,2\}", "[0,1)", "$\frac12$", "\(x+1\)").
- `question` (optional): not used for grading; echoed back.
- `extraction` (optional): `nemo_gym` (default) or `lenient`.

`nemo_gym` gives the reward NeMo-Gym 0.7's `math_with_judge` server gives with
`should_use_judge: false` (docs/reward.md "Parity with NeMo-Gym"): it reads the assistant
text as that server does (all `message` output text joined, a <think> part included,
`reasoning` items not), requires the *last* `\boxed{` to close and hold something (else 0,
`verdict` no_boxed_answer), then compares with math-verify: the gold, stripped of one outer
`\( \)` and/or `$ $` and put in `\boxed{}`, against the whole text, extracted with
math-verify's expression and LaTeX configs (first parsable match).
`lenient` (the tiny pipeline's rows, whose prompts ask for a bare answer): the answer is the
last complete \boxed{} of the final answer (reasoning stripped), else math-verify's own
final-answer extraction on the text's end, else the last "Final answer: ..." / "The answer
is ..." line.
Either way equivalent forms score 1 (0.5 = \frac{1}{2}, {1,2} = {2,1}, 5\text{ cm} = 5).

math-verify's built-in timeouts are switched off on purpose: on expiry they return
False, which is exactly the silent 0 this gateway exists to avoid. Instead, answers that
would make it hang are refused before parsing (answer_limits.py): a final (boxed) answer over 400
characters (`verdict` answer_too_long), brackets nested over 8 deep, a power tower or
exponent above 10,000, a factorial above 10,000! (answer_too_complex); `info.reason` says
which. Lenient whole-text extraction reads only the last 2,000 characters, whitespace
runs collapsed. The worker's own timeout still turns any other hang into a TIMEOUT failure
(where NeMo-Gym's 5 s parse / 10 s process limits would give a silent 0).
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
from rlfleet_reward.environments.base import Environment, choice, require_str
from rlfleet_reward.text import final_answer_line, find_boxed, last_complete_boxed
from rlfleet_reward.types import Sample, Score, binary

EXTRACTION_MODES = ("nemo_gym", "lenient")
"""Row field `extraction`: NeMo-Gym's rules (the default) or the lenient variant."""


@dataclass(frozen=True)
class MathSpec:
    expected_answer: str
    extraction: str = "nemo_gym"


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


def strip_math_delimiters(answer: str) -> str:
    r"""The gold without one outer `\( \)`, then one outer `$ $` (NeMo-Gym's rule: math-verify
    cannot read `\boxed{$x$}`)."""
    answer = answer.strip()
    if answer.startswith("\\(") and answer.endswith("\\)"):
        answer = answer[2:-2].strip()
    if len(answer) > 1 and answer.startswith("$") and answer.endswith("$"):
        answer = answer[1:-1].strip()
    return answer


@functools.lru_cache(maxsize=4096)
def _parse_boxed_gold(expected: str) -> Any:
    from math_verify.parser import LatexExtractionConfig, parse  # type: ignore[import-untyped]

    gold = "\\boxed{" + strip_math_delimiters(expected) + "}"
    return parse(gold, (LatexExtractionConfig(),), parsing_timeout=None)


def nemo_gym_score(expected: str, text: str) -> Score:
    """NeMo-Gym's library reward for `text` (its whole assistant text)."""
    from math_verify import verify
    from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig, parse

    boxed = last_complete_boxed(text)
    if boxed is None or not boxed.strip():
        return binary("correctness", False, verdict="no_boxed_answer")
    problem = answer_problem(boxed)
    if problem is not None:
        return binary("correctness", False, verdict=problem[0], reason=problem[1])
    try:
        gold = _parse_boxed_gold(expected)
        if not gold:  # NeMo-Gym's metric raises on an unparsable gold, which scores 0
            return binary("correctness", False, verdict="gold_unparsable", extracted_answer=boxed)
        answer = parse(
            text, (ExprExtractionConfig(), LatexExtractionConfig()), parsing_timeout=None
        )
        ok = bool(answer) and bool(verify(gold, answer, 6, timeout_seconds=None))
    except Exception as exc:  # NeMo-Gym scores any math-verify exception 0; say which
        reason = f"math-verify raised {type(exc).__name__}: {exc}"
        return binary("correctness", False, verdict="verifier_exception", reason=reason[:300])
    verdict = "correct" if ok else ("wrong" if answer else "no_answer")
    return binary("correctness", ok, extracted_answer=boxed, verdict=verdict)


class MathEnvironment(Environment):
    name: ClassVar[str] = "math"
    placement = "process"  # cost per answer: docs/reward.md
    description: ClassVar[str] = (
        "Math answers (the last \\boxed{}, or a bare answer with extraction: lenient) checked "
        "for equivalence with math-verify, as NeMo-Gym's math_with_judge server does."
    )
    required_fields: ClassVar[tuple[str, ...]] = ("expected_answer",)
    optional_fields: ClassVar[tuple[str, ...]] = ("question", "extraction")
    preload_modules: ClassVar[tuple[str, ...]] = (
        "math_verify",
        "sympy",
        "rlfleet_reward.environments.math_warmup",
    )

    def parse_row(self, row: Mapping[str, Any]) -> MathSpec:
        return MathSpec(
            expected_answer=require_str(row, "expected_answer"),
            extraction=choice(row, "extraction", EXTRACTION_MODES, "nemo_gym"),
        )

    def score(self, spec: MathSpec, sample: Sample) -> Score:
        logging.getLogger("math_verify").setLevel(logging.ERROR)
        if spec.extraction == "nemo_gym":
            return nemo_gym_score(spec.expected_answer, sample.nemo_gym_text)
        try:
            ok, extracted = is_equivalent(spec.expected_answer, sample.text)
        except AnswerRefused as exc:
            verdict, reason = exc.args
            return binary("correctness", False, verdict=verdict, reason=reason)
        verdict = "correct" if ok else ("wrong" if extracted else "no_answer")
        return binary("correctness", ok, extracted_answer=extracted, verdict=verdict)
