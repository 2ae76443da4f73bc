"""The instruction-checker registry: instruction id -> check function and the converters
of its kwargs, plus the helpers the checker modules share (if_checkers.py,
if_checkers_more.py register into CHECKERS; if_all_checkers.py imports both), among them
the two checks that `verifiable_instructions` has under one id of each module."""

from __future__ import annotations

import re
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlfleet_reward.types import RowError

Converter = Callable[[Any], Any]


@dataclass(frozen=True)
class Checker:
    instruction_id: str
    check: Callable[..., bool]
    args: dict[str, Converter]

    def convert_kwargs(self, given: Any, field: str) -> tuple[tuple[str, Any], ...]:
        """The row's kwargs object for this instruction, converted for `check`; RowError
        naming `field` (or `field.<arg>`) when it is not an object or an argument is bad."""
        given = given or {}
        if not isinstance(given, dict):
            raise RowError(field, f"expected an object, got {type(given).__name__}")
        args = []
        for name, convert in self.args.items():
            if given.get(name) is None:
                raise RowError(f"{field}.{name}", f"required by {self.instruction_id}, but missing")
            try:
                args.append((name, convert(given[name])))
            except ValueError as exc:
                raise RowError(f"{field}.{name}", str(exc)) from None
        return tuple(args)


CHECKERS: dict[str, Checker] = {}


def checker(
    instruction_id: str, **args: Converter
) -> Callable[[Callable[..., bool]], Callable[..., bool]]:
    def register(fn: Callable[..., bool]) -> Callable[..., bool]:
        CHECKERS[instruction_id] = Checker(instruction_id, fn, args)
        return fn

    return register


# --- argument converters (ValueError messages end up in INVALID_ARGUMENT) ---------------


def text_arg(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"expected a non-empty string, got {value!r}")
    return value


def count_arg(value: Any) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or int(value) != value
        or value < 0
    ):
        raise ValueError(f"expected a non-negative integer, got {value!r}")
    return int(value)


def words_arg(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"expected a non-empty list of strings, got {value!r}")
    return tuple(value)


def relation_arg(value: Any) -> str:
    if value not in ("less than", "at least"):
        raise ValueError(f"expected 'less than' or 'at least', got {value!r}")
    return str(value)


def letter_arg(value: Any) -> str:
    if not isinstance(value, str) or len(value) != 1 or value.lower() not in string.ascii_lowercase:
        raise ValueError(f"expected a single letter a-z, got {value!r}")
    return value.lower()


def search(pattern: str, text: str, flags: int = re.IGNORECASE) -> bool:
    """re.search for a row-given pattern; one that does not compile matches nothing."""
    try:
        return re.search(pattern, text, flags) is not None
    except re.error:
        return False


def count_matches(pattern: str, text: str) -> int:
    try:
        return len(re.findall(pattern, text, re.IGNORECASE))
    except re.error:
        return -1


def compare_count(count: int, relation: str, target: int) -> bool:
    return count < target if relation == "less than" else count >= target


def count_words(text: str) -> int:
    return len(re.findall(r"\w+", text))


def star_paragraphs(text: str) -> list[str]:
    """The text's paragraphs as `***` separates them."""
    return re.split(r"\s?\*\*\*\s?", text)


def paragraph_count(paragraphs: list[str]) -> int | None:
    """How many paragraphs hold text; None when an empty one stands between two others
    (that breaks every paragraph instruction; an empty first or last one is not counted)."""
    if any(not p.strip() for p in paragraphs[1:-1]):
        return None
    return sum(1 for p in paragraphs if p.strip())


# --- checks registered twice ------------------------------------------------------------
# verifiable_instructions has these under an IFEval id and again under a newer one
# (keywords:word_count_different_numbers, letters:letter_counting2): one function serves
# both ids, and each module registers the ids it owns.


def keyword_frequency(text: str, keyword: str, frequency: int, relation: str) -> bool:
    found = count_matches(keyword.strip(), text)
    return found >= 0 and compare_count(found, relation, frequency)


KEYWORD_FREQUENCY_ARGS: dict[str, Converter] = {
    "keyword": text_arg,
    "frequency": count_arg,
    "relation": relation_arg,
}


def letter_frequency(text: str, letter: str, let_frequency: int, let_relation: str) -> bool:
    return compare_count(text.lower().count(letter), let_relation, let_frequency)


LETTER_FREQUENCY_ARGS: dict[str, Converter] = {
    "letter": letter_arg,
    "let_frequency": count_arg,
    "let_relation": relation_arg,
}
