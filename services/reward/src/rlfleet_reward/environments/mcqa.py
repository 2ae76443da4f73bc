r"""`mcqa`: STEM multiple choice; the chosen letter is extracted and compared.

Row fields:
- `expected_answer` (required): the correct letter, "A".."Z" (case-insensitive).
- `options` (optional): the choices, as NeMo-Gym writes them (a list of one-entry dicts
  `[{"A": "text"}, ...]`), as a dict `{"A": "text"}` or as a list of strings (lettered A,
  B, ...). When given, only their letters are valid and an answer that quotes an
  option's text verbatim counts as that letter.
- `grading_mode` (optional): `lenient` (default: every format below) or `strict_boxed`
  (only \boxed{X} counts).

Formats understood, first match wins: \boxed{X} (also \boxed{\text{X}}, \boxed{(X)});
"Answer: X", "answer is (X)", "**Answer:** X" (the last such phrase); a final line that
is just "X", "(X)" or "X." ; a final line equal to an option's text.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from rlfleet_reward.environments.base import Environment, choice, require_str
from rlfleet_reward.text import find_boxed
from rlfleet_reward.types import RowError, Sample, Score, binary

_DEFAULT_LETTERS = "ABCDEFGHIJ"
_ANSWER_PHRASE = re.compile(
    r"answer\s*(?:is|:)?\s*[:：]?\s*(?:\*\*|\\\(|\$)?\s*\(?\s*([A-Za-z])\s*\)?(?![A-Za-z])",
    re.IGNORECASE,
)
_LONE_LETTER = re.compile(r"^\W*\(?([A-Za-z])\)?[.:]?\W*$")


@dataclass(frozen=True)
class McqaSpec:
    expected: str
    letters: str
    option_texts: tuple[tuple[str, str], ...]
    strict: bool


def _parse_options(raw: Any) -> dict[str, str]:
    if isinstance(raw, dict):
        items = list(raw.items())
    elif isinstance(raw, list):
        items = []
        for i, entry in enumerate(raw):
            if isinstance(entry, dict) and len(entry) == 1:
                items.extend(entry.items())
            elif isinstance(entry, str):
                if i >= len(string.ascii_uppercase):
                    raise RowError("options", "at most 26 options")
                items.append((string.ascii_uppercase[i], entry))
            else:
                raise RowError(
                    f"options[{i}]", "expected a string or a one-entry {letter: text} object"
                )
    else:
        raise RowError("options", f"expected a list or an object, got {type(raw).__name__}")
    options = {}
    for letter, text in items:
        if not isinstance(letter, str) or len(letter.strip()) != 1 or not letter.strip().isalpha():
            raise RowError("options", f"option keys must be single letters, got {letter!r}")
        options[letter.strip().upper()] = str(text)
    if len(options) < 2:
        raise RowError("options", "needs at least 2 options")
    return options


def _letter_from_boxed(content: str) -> str | None:
    inner = re.sub(r"\\text\s*\{([^}]*)\}", r"\1", content)
    match = _LONE_LETTER.match(inner.strip())
    return match.group(1).upper() if match else None


def extract_letter(text: str, spec: McqaSpec) -> tuple[str | None, str]:
    """(letter, how it was found) or (None, "none")."""
    boxed = find_boxed(text)
    if boxed:
        letter = _letter_from_boxed(boxed[-1])
        if letter:
            return letter, "boxed"
    if spec.strict:
        return None, "none"
    phrases = [m.group(1).upper() for m in _ANSWER_PHRASE.finditer(text)]
    phrases = [p for p in phrases if p in spec.letters]
    if phrases:
        return phrases[-1], "answer_phrase"
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if lines:
        match = _LONE_LETTER.match(lines[-1])
        if match and match.group(1).upper() in spec.letters:
            return match.group(1).upper(), "final_line"
        last = lines[-1].strip(" .*").lower()
        for letter, option in spec.option_texts:
            if option.strip(" .").lower() == last:
                return letter, "option_text"
    return None, "none"


class McqaEnvironment(Environment):
    name: ClassVar[str] = "mcqa"
    placement = "loop"  # cost per answer: docs/reward.md
    description: ClassVar[str] = (
        "Multiple-choice questions: the chosen letter must equal expected_answer."
    )
    required_fields: ClassVar[tuple[str, ...]] = ("expected_answer",)
    optional_fields: ClassVar[tuple[str, ...]] = ("options", "grading_mode", "question")

    def parse_row(self, row: Mapping[str, Any]) -> McqaSpec:
        expected = require_str(row, "expected_answer").strip().strip("()").upper()
        options = _parse_options(row["options"]) if row.get("options") is not None else {}
        letters = "".join(sorted(options)) if options else _DEFAULT_LETTERS
        if len(expected) != 1 or expected not in letters:
            raise RowError(
                "expected_answer",
                f"must be one of the option letters {letters}; got {row['expected_answer']!r}",
            )
        strict = (
            choice(row, "grading_mode", ("lenient", "strict_boxed"), "lenient") == "strict_boxed"
        )
        return McqaSpec(expected, letters, tuple(options.items()), strict)

    def score(self, spec: McqaSpec, sample: Sample) -> Score:
        letter, how = extract_letter(sample.text, spec)
        return binary(
            "correctness",
            letter == spec.expected,
            extracted_answer=letter or "",
            extraction=how,
            verdict="no_answer"
            if letter is None
            else ("correct" if letter == spec.expected else "wrong"),
        )
