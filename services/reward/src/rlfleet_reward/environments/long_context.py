"""`long_context`: questions over a long synthetic document, with one verifiable answer.

The document (in `responses_create_params.input`) hides needles, scattered records or a
chain of references; the row carries the answer. Row fields (RULER v2's row shape, so
NeMo-Gym `ruler2` rows written with `match_type: exact` load; our data-prep source
`long_context` writes them, rlfleet_dataprep.long_context):
- `expected_answer` (required): the answer as a string, or a list of strings when the
  question asks for several values (every needle): then the response must list all of
  them and nothing else, in any order.
- `match_type` (optional, default `exact`): only `exact` is served. RULER v2's soft
  string match (`all`, `part`, `2steps`: substring or 1 - WER, continuous reward) is
  refused with a reason rather than scored differently from NeMo-Gym's `ruler2` server.
- `task`, `length`, `seed` (optional): what generated the row (e.g. `niah_multi`,
  `aggregate_sum`, `multi_hop`), the document's length in characters and the generator
  seed; echoed in `info`, not used for grading.

The answer is the text after the last "Final Answer:" / "The answer is" / "Answer:" line,
else the last \\boxed{}, else the whole response when it is one short line. Both sides
are normalised: Unicode NFKC, case folded, whitespace collapsed, surrounding quotes,
brackets, backticks, asterisks and a final period removed; numbers compare by value
("1,250" = "1250" = "1250.0"). A list answer splits on commas, semicolons and " and ".
An answer over 1,000 characters (a model echoing the document) scores 0 with verdict
`answer_too_long`. Extraction is linear in the response's length (at most
`limits.max_response_chars`).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, ClassVar

from rlfleet_reward.environments.base import Environment, optional_number, require
from rlfleet_reward.text import final_answer_line, find_boxed
from rlfleet_reward.types import RowError, Sample, Score, binary

MAX_ANSWER_CHARS = 1_000
"""Longest extracted answer that is compared; longer ones score 0 (answer_too_long)."""
MAX_EXPECTED_ITEMS = 1_000

_EDGES = "\"'`*[](){}<>“”‘’«»"
_NUMBER = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_LIST_SPLIT = re.compile(r"\s*(?:[,;\n]|\band\b)\s*")


@dataclass(frozen=True)
class LongContextSpec:
    expected: tuple[str, ...]
    """Normalised expected values; several = a list answer."""
    is_list: bool
    task: str
    length: int
    seed: int | None


def normalise(text: str) -> str:
    """The comparable form of one answer value (see the module docstring)."""
    text = " ".join(unicodedata.normalize("NFKC", text).casefold().split())
    previous = None
    while previous != text:
        previous = text
        text = text.strip().strip(_EDGES).strip().removesuffix(".").strip()
    if _NUMBER.fullmatch(text):
        try:
            value = Decimal(text.replace(",", ""))
        except InvalidOperation:  # pragma: no cover - the regex admits only decimals
            return text
        return format(value.normalize(), "f") if value == value.to_integral() else str(value)
    return text


def split_list(text: str) -> list[str]:
    inner = text.strip().strip(_EDGES)
    return [item for item in (normalise(p) for p in _LIST_SPLIT.split(inner)) if item]


def extract_answer(text: str) -> str | None:
    """The final answer of a response, or None (see the module docstring)."""
    line = final_answer_line(text)
    if line is not None:
        return line
    boxed = find_boxed(text)
    if boxed:
        return boxed[-1]
    stripped = text.strip()
    if stripped and "\n" not in stripped and len(stripped) <= 200:
        return stripped
    return None


def _parse_expected(row: Mapping[str, Any]) -> tuple[tuple[str, ...], bool]:
    raw = require(row, "expected_answer")
    if isinstance(raw, list):
        if not raw or len(raw) > MAX_EXPECTED_ITEMS:
            raise RowError(
                "expected_answer", f"expected a list of 1-{MAX_EXPECTED_ITEMS} answer strings"
            )
        values = []
        for i, item in enumerate(raw):
            if isinstance(item, bool) or not isinstance(item, str | int | float):
                raise RowError(f"expected_answer[{i}]", "expected a string or a number")
            value = normalise(str(item))
            if not value:
                raise RowError(f"expected_answer[{i}]", "must not be empty")
            values.append(value)
        return tuple(values), len(values) > 1
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise RowError("expected_answer", f"expected a string or a list, got {type(raw).__name__}")
    value = normalise(str(raw))
    if not value:
        raise RowError("expected_answer", "must not be empty")
    return (value,), False


class LongContextEnvironment(Environment):
    name: ClassVar[str] = "long_context"
    placement = "loop"  # cost per answer: docs/reward.md
    description: ClassVar[str] = (
        "Long synthetic documents (needles, aggregation, multi-hop): the final answer must "
        "equal the row's expected answer after normalisation."
    )
    required_fields: ClassVar[tuple[str, ...]] = ("expected_answer",)
    optional_fields: ClassVar[tuple[str, ...]] = ("match_type", "task", "length", "seed")

    def parse_row(self, row: Mapping[str, Any]) -> LongContextSpec:
        match_type = row.get("match_type")
        if match_type not in (None, "exact"):
            raise RowError(
                "match_type",
                f"only 'exact' is served, got {str(match_type)[:40]!r}: RULER v2's soft match "
                "(all/part/2steps) is not implemented here; score such rows with NeMo-Gym's "
                "ruler2 server",
            )
        expected, is_list = _parse_expected(row)
        task = row.get("task")
        if task is not None and not isinstance(task, str):
            raise RowError("task", f"expected a string, got {type(task).__name__}")
        length = optional_number(row, "length", 0, low=0)
        seed = row.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise RowError("seed", f"expected an integer, got {seed!r}")
        return LongContextSpec(expected, is_list, task or "", int(length), seed)

    def score(self, spec: LongContextSpec, sample: Sample) -> Score:
        info: dict[str, object] = {"task": spec.task} if spec.task else {}
        answer = extract_answer(sample.text)
        if answer is None:
            return binary("correctness", False, verdict="no_answer", **info)
        if len(answer) > MAX_ANSWER_CHARS:
            return binary(
                "correctness",
                False,
                verdict="answer_too_long",
                reason=f"answer has {len(answer)} characters (limit {MAX_ANSWER_CHARS})",
                **info,
            )
        if spec.is_list:
            got = split_list(answer)
            ok = len(got) == len(set(got)) and set(got) == set(spec.expected)
        else:
            ok = normalise(answer) == spec.expected[0]
        verdict = "correct" if ok else "wrong"
        return binary("correctness", ok, extracted_answer=answer, verdict=verdict, **info)
