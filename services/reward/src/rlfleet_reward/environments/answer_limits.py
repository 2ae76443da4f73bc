"""Cheap checks that keep a pathological answer from reaching a slow verifier.

math-verify's LaTeX parser and sympy can spend minutes on a few bytes: nested brackets
(the parser's cost grows about twofold per level past ~8: `\\boxed{((((((((((1))))))))))}`
did not finish in 20 s), power towers and huge exponents (`9^{9^{9^9}}`, `2^{10^{10}}`,
which sympy evaluates exactly) and long texts (a 200 kB run of spaces). Each would hold a
worker until the pool's timeout and come back as a TIMEOUT failure; these checks answer in
microseconds with a 0 and a reason instead. The bounds are far above any real final answer.
"""

from __future__ import annotations

import re

MAX_ANSWER_CHARS = 400
"""Longest extracted final answer (a \\boxed{} content or an answer line) that is parsed."""
MAX_BRACKET_DEPTH = 8
"""Deepest nesting of (), [] and {} together in what is parsed."""
MAX_EXPONENT = 10_000
"""Largest integer exponent (after evaluating a tower of literals) and factorial argument."""
TAIL_CHARS = 2_000
"""How much of the response's end the whole-text answer extraction reads."""

_SPACES = re.compile(r"[ \t\r\f\v]+")
_BLANK_LINES = re.compile(r"\n\s*\n+")
_OPEN, _CLOSE = "([{", ")]}"
_POWER_CHAIN = re.compile(r"\d+(?:\^-?\d+)+")
_FACTORIAL = re.compile(r"(\d+)(\^-?\d+)*!")
_GROUP_END = re.compile(r"[)}\]]\s*(?=[\d({\[])")


def bounded_tail(text: str) -> str:
    """The end of `text` with runs of whitespace collapsed: what whole-text extraction reads
    (final answers sit at the end)."""
    collapsed = _BLANK_LINES.sub("\n\n", _SPACES.sub(" ", text[-8 * TAIL_CHARS :]))
    return collapsed[-TAIL_CHARS:]


def answer_problem(answer: str, *, max_chars: int = MAX_ANSWER_CHARS) -> tuple[str, str] | None:
    """(verdict, reason) when `answer` is too costly to parse, else None."""
    if len(answer) > max_chars:
        return "answer_too_long", f"answer has {len(answer)} characters (limit {max_chars})"
    depth = deepest = 0
    for char in answer:
        if char in _OPEN:
            depth += 1
            deepest = max(deepest, depth)
        elif char in _CLOSE:
            depth = max(0, depth - 1)
    if deepest > MAX_BRACKET_DEPTH:
        return (
            "answer_too_complex",
            f"brackets nest {deepest} deep (limit {MAX_BRACKET_DEPTH})",
        )
    reason = _huge_number(answer)
    return ("answer_too_complex", reason) if reason else None


def _huge_number(answer: str) -> str | None:
    # Brackets and spacing do not change which literals a tower stacks, and reading every
    # tower right-associatively only overestimates: `(2^3)^4` is checked as 2^(3^4).
    # A closing bracket followed by a number or an opening bracket ends a group (`}{` between
    # \frac's arguments): mark it, or `\frac{2^{2016}}{6}` would read as the power 2^20166.
    marked = _GROUP_END.sub("|", answer)
    flat = re.sub(r"[\s{}()]|\\left|\\right", "", marked).replace("**", "^")
    for match in _POWER_CHAIN.finditer(flat):
        numbers = [_small_int(n) for n in match.group().split("^")]
        exponent = numbers[-1]
        for base in reversed(numbers[1:-1]):
            if exponent > MAX_EXPONENT or (base > 1 and exponent * base.bit_length() > 64):
                return f"power {match.group()[:40]} has an exponent above {MAX_EXPONENT}"
            exponent = base**exponent
        if exponent > MAX_EXPONENT and numbers[0] > 1:
            return f"power {match.group()[:40]} has an exponent above {MAX_EXPONENT}"
    for match in _FACTORIAL.finditer(flat):  # 10^{9999}! is a power, then a factorial
        value = _tower_value([_small_int(n) for n in match.group()[:-1].split("^")])
        if value is None or value > MAX_EXPONENT:
            return f"factorial {match.group()[:40]} is above {MAX_EXPONENT}!"
    return None


def _small_int(digits: str) -> int:
    """|int(digits)|, saturated: a 5,000-digit literal must not cost a big-int parse."""
    digits = digits.lstrip("-")
    return int(digits) if len(digits) <= 18 else 10**18


def _tower_value(numbers: list[int]) -> int | None:
    """a^b^c... (right-associative, magnitudes), or None when it passes 10**18."""
    value = numbers[-1]
    for base in reversed(numbers[:-1]):
        if base > 1 and value * base.bit_length() > 60:
            return None
        value = base**value
    return value if value <= 10**18 else None
