r"""`mcqa`: STEM multiple choice, graded as NeMo-Gym's `mcqa` resources server grades it.

Row fields (NeMo-Gym's names, accepted unchanged):
- `expected_answer` (required): the correct letter (case-insensitive).
- `options`: the choices, as NeMo-Gym writes them (a list of `{letter: text}` objects;
  entries with a null text are not choices), or as a dict `{"A": "text"}` or a list of
  strings (lettered A, B, ...). Required, except with `template_metadata.output_regex`
  or `grading_mode: lenient`: NeMo-Gym accepts only letters named here.
- `grading_mode`: one of NeMo-Gym's `strict_single_letter_boxed` (default),
  `lenient_boxed`, `lenient_answer_colon`, `lenient_answer_colon_md` (see mcqa_formats),
  or rlfleet's opt-in `lenient` (every format below, letters A-J without options).
- `template_metadata`: `output_regex` (a pattern or a list, tried before the grading
  mode) and `answer_prefix` (for `lenient_answer_colon_md`), as NeMo-Gym reads them.
- `question`, `uuid`, `metadata`: carried, not graded.

`lenient` (rlfleet's variant) understands, first match wins: \boxed{X} (also
\boxed{\text{X}}, \boxed{(X)}); "Answer: X", "answer is (X)", "**Answer:** X" (the last
such phrase); a final line that is just "X", "(X)" or "X."; a final line equal to an
option's text.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from rlfleet_reward.environments.base import Environment, choice, require_str
from rlfleet_reward.environments.mcqa_formats import NEMO_MODES, Options, nemo_letter
from rlfleet_reward.text import find_boxed
from rlfleet_reward.types import RowError, Sample, Score, binary

_DEFAULT_LETTERS = "ABCDEFGHIJ"
_ANSWER_PHRASE = re.compile(
    r"answer\s*(?:is|:)?\s*[:：]?\s*(?:\*\*|\\\(|\$)?\s*\(?\s*([A-Za-z])\s*\)?(?![A-Za-z])",
    re.IGNORECASE,
)
_LONE_LETTER = re.compile(r"^\W*\(?([A-Za-z])\)?[.:]?\W*$")
LENIENT = "lenient"


@dataclass(frozen=True)
class McqaSpec:
    expected: str
    letters: str
    option_texts: Options
    mode: str
    patterns: tuple[re.Pattern[str], ...] = ()
    answer_prefix: str | None = None


def _parse_options(raw: Any) -> Options:
    """(LETTER, text) pairs in row order; null texts dropped (NeMo-Gym ignores them)."""
    items: list[tuple[Any, Any]] = []
    if isinstance(raw, dict):
        items = list(raw.items())
    elif isinstance(raw, list):
        for i, entry in enumerate(raw):
            if isinstance(entry, dict) and entry:
                items.extend(entry.items())
            elif isinstance(entry, str):
                if i >= len(string.ascii_uppercase):
                    raise RowError("options", "at most 26 options")
                items.append((string.ascii_uppercase[i], entry))
            else:
                raise RowError(f"options[{i}]", "expected a string or a {letter: text} object")
    else:
        raise RowError("options", f"expected a list or an object, got {type(raw).__name__}")
    options = []
    for letter, text in items:
        if not isinstance(letter, str) or len(letter) != 1 or not letter.isalpha():
            raise RowError("options", f"option keys must be single letters, got {letter!r}")
        if text is None:
            continue
        if not isinstance(text, str):
            raise RowError(f"options.{letter}", f"expected a string, got {type(text).__name__}")
        options.append((letter.upper(), text))
    if len({letter for letter, _ in options}) < 2:
        raise RowError("options", "needs at least 2 options")
    return tuple(options)


def _parse_template(row: Mapping[str, Any]) -> tuple[tuple[re.Pattern[str], ...], str | None]:
    meta = row.get("template_metadata")
    if meta is None:
        return (), None
    if not isinstance(meta, dict):
        raise RowError("template_metadata", f"expected an object, got {type(meta).__name__}")
    prefix = meta.get("answer_prefix")
    if prefix is not None and not isinstance(prefix, str):
        raise RowError("template_metadata.answer_prefix", "expected a string")
    if "output_regex" not in meta:
        return (), prefix or None
    raw = meta["output_regex"]
    sources = [raw] if isinstance(raw, str) else raw
    if not isinstance(sources, list) or not all(isinstance(p, str) for p in sources):
        raise RowError("template_metadata.output_regex", "expected a pattern or a list of them")
    patterns = []
    for source in sources:
        try:
            pattern = re.compile(source, re.IGNORECASE)
        except re.error as exc:
            raise RowError("template_metadata.output_regex", f"not a regex: {exc}") from None
        if pattern.groups > 1:
            raise RowError(
                "template_metadata.output_regex",
                f"{source!r} has {pattern.groups} groups, at most 1",
            )
        patterns.append(pattern)
    return tuple(patterns), prefix or None


def _letter_from_boxed(content: str) -> str | None:
    inner = re.sub(r"\\text\s*\{([^}]*)\}", r"\1", content)
    match = _LONE_LETTER.match(inner.strip())
    return match.group(1).upper() if match else None


def extract_letter(text: str, spec: McqaSpec) -> tuple[str | None, str]:
    """rlfleet's lenient reading: (letter, how it was found) or (None, "none")."""
    boxed = find_boxed(text)
    if boxed:
        letter = _letter_from_boxed(boxed[-1])
        if letter:
            return letter, "boxed"
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
    optional_fields: ClassVar[tuple[str, ...]] = (
        "options",
        "grading_mode",
        "template_metadata",
        "question",
    )

    def parse_row(self, row: Mapping[str, Any]) -> McqaSpec:
        expected = require_str(row, "expected_answer").strip().upper()
        mode = choice(row, "grading_mode", (*NEMO_MODES, LENIENT), NEMO_MODES[0])
        patterns, prefix = _parse_template(row)
        options = _parse_options(row["options"]) if row.get("options") is not None else ()
        if not options and not patterns and mode != LENIENT:
            raise RowError(
                "options",
                f"required with grading_mode {mode} (only letters named in options count); "
                "or give template_metadata.output_regex, or grading_mode lenient",
            )
        letters = "".join(sorted({letter for letter, _ in options}))
        if mode == LENIENT and not letters:
            letters = _DEFAULT_LETTERS
        if mode == LENIENT:
            expected = expected.strip("()")
        # An output_regex may name letters outside options (NeMo-Gym trusts it), so then
        # any single letter is a valid key.
        if (
            len(expected) != 1
            or not expected.isalpha()
            or (letters and expected not in letters and not patterns)
        ):
            raise RowError(
                "expected_answer",
                f"must be one of the option letters {letters}; got {row['expected_answer']!r}",
            )
        return McqaSpec(expected, letters, options, mode, patterns, prefix)

    def score(self, spec: McqaSpec, sample: Sample) -> Score:
        if spec.mode == LENIENT:
            letter, how = extract_letter(sample.text, spec)
        else:
            letter = nemo_letter(
                sample.nemo_gym_text,  # the text NeMo-Gym's server reads (response.output_text)
                spec.mode,
                spec.option_texts,
                frozenset(spec.letters),
                spec.patterns,
                spec.answer_prefix,
            )
            how = spec.mode if letter is not None else "none"
        return binary(
            "correctness",
            letter == spec.expected,
            extracted_answer=letter or "",
            extraction=how,
            verdict="no_answer"
            if letter is None
            else ("correct" if letter == spec.expected else "wrong"),
        )
