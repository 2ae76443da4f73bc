"""`multi_challenge`: multi-turn instruction following with a programmatic rubric.

The conversation (several user/assistant turns in `responses_create_params.input`) sets
rules in earlier turns: a constraint in turn 1, a name in turn 2, a language for the
rest of the chat. The final response must still keep them; each rubric item is a check
that can be run on the response alone. NeMo-Gym's `multichallenge` and `inverse_if`
servers grade free-text rubric questions with an LLM judge; this environment covers only
rubrics whose items are programmatic (a judge-graded item is refused, naming it).

Row fields:
- `responses_create_params.input` (required): the conversation; it must hold at least
  one assistant turn before the last user turn (else it is not multi-turn).
- `rubric` (required): a list of 1-64 items `{"instruction_id", "kwargs", "turn",
  "description"}`. `instruction_id` is one of `if_checkers.CHECKERS` (the
  `instruction_following` ids, arguments checked the same way) or one of this module's
  `EXTRA_CHECKERS`: `language:script` (`script`: the writing system the reply must be in,
  e.g. the language a user asked for in an earlier turn; one of `SCRIPTS`). `turn`
  (optional) is the 1-based user turn that stated the rule; it must exist, and it names
  the rubric component. `description` is free text for people (ignored).
- `grading_mode` (optional): `all` (default; reward 1 only if every item passes) or
  `fraction` (each passing item earns 1/k, one reward component per item).
"""

from __future__ import annotations

import unicodedata
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from rlfleet_reward.environments.base import Environment, choice, require
from rlfleet_reward.environments.if_checkers import CHECKERS, Checker
from rlfleet_reward.types import RowError, Sample, Score, scored

MAX_RUBRIC_ITEMS = 64
SCRIPTS = (
    "latin",
    "cyrillic",
    "greek",
    "arabic",
    "hebrew",
    "devanagari",
    "thai",
    "hangul",
    "cjk",
    "hiragana",
    "katakana",
)
_SCRIPT_SHARE = 0.8
"""Share of a reply's letters that must be in the asked script (names and code in
another script are allowed for)."""


def _script_arg(value: Any) -> str:
    if value not in SCRIPTS:
        raise ValueError(f"expected one of {', '.join(SCRIPTS)}, got {str(value)[:40]!r}")
    return str(value)


def _script_of(char: str) -> str:
    name = unicodedata.name(char, "")
    first = name.split(" ", 1)[0].lower()
    if first == "cjk":
        return "cjk"
    return first if first in SCRIPTS else "other"


def in_script(text: str, script: str) -> bool:
    """True when at least 80% of the letters of `text` are in `script`."""
    # Classify each distinct character once: a 1 MB reply has a few hundred of them.
    counts = Counter(text)
    letters = inside = 0
    for char, count in counts.items():
        if char.isalpha():
            letters += count
            inside += count if _script_of(char) == script else 0
    return letters > 0 and inside >= _SCRIPT_SHARE * letters


EXTRA_CHECKERS: dict[str, Checker] = {
    "language:script": Checker("language:script", in_script, {"script": _script_arg}),
}


@dataclass(frozen=True)
class RubricItem:
    instruction_id: str
    args: tuple[tuple[str, Any], ...]
    key: str
    """Reward component name: `turn<N>:<id>` (or `<id>`), `#<index>` added when repeated."""


@dataclass(frozen=True)
class MultiChallengeSpec:
    items: tuple[RubricItem, ...]
    fraction: bool


def _user_turns(row: Mapping[str, Any]) -> int:
    """Count of user turns; RowError unless an assistant turn precedes the last one."""
    params = row.get("responses_create_params")
    messages = params.get("input") if isinstance(params, dict) else None
    where = "responses_create_params.input"
    if not isinstance(messages, list) or not messages:
        raise RowError(where, "required: the conversation as a list of messages")
    roles = [m.get("role") if isinstance(m, dict) else None for m in messages]
    if None in roles:
        raise RowError(f"{where}[{roles.index(None)}]", "expected a message with a role")
    last_user = max((i for i, r in enumerate(roles) if r == "user"), default=-1)
    if last_user < 0 or "assistant" not in roles[:last_user]:
        raise RowError(
            where,
            "multi_challenge needs a multi-turn conversation: an assistant turn "
            "before the last user turn",
        )
    return roles.count("user")


def _parse_item(i: int, item: Any, user_turns: int) -> tuple[str, tuple[tuple[str, Any], ...], int]:
    where = f"rubric[{i}]"
    if not isinstance(item, dict):
        raise RowError(where, "expected an object with an instruction_id")
    instruction_id = item.get("instruction_id")
    if instruction_id is None and "question" in item:
        raise RowError(
            where,
            "a judge-graded item (question/pass_criteria) needs an LLM judge, which "
            "this environment does not use; give a programmatic instruction_id",
        )
    checker = None
    if isinstance(instruction_id, str):
        checker = CHECKERS.get(instruction_id) or EXTRA_CHECKERS.get(instruction_id)
    if checker is None or not isinstance(instruction_id, str):
        known = sorted([*CHECKERS, *EXTRA_CHECKERS])
        raise RowError(
            f"{where}.instruction_id",
            f"unknown instruction {str(instruction_id)[:60]!r}; supported: {', '.join(known)}",
        )
    args = checker.convert_kwargs(item.get("kwargs"), f"{where}.kwargs")
    turn = item.get("turn", 0)
    if turn is None:
        turn = 0
    if isinstance(turn, bool) or not isinstance(turn, int) or not 0 <= turn <= user_turns:
        raise RowError(
            f"{where}.turn", f"expected a user turn in [1, {user_turns}] (or 0), got {turn!r}"
        )
    return instruction_id, args, turn


class MultiChallengeEnvironment(Environment):
    name: ClassVar[str] = "multi_challenge"
    description: ClassVar[str] = (
        "Multi-turn instruction following: the final reply must keep rules set in earlier "
        "turns, each checked programmatically (no judge)."
    )
    required_fields: ClassVar[tuple[str, ...]] = ("responses_create_params", "rubric")
    optional_fields: ClassVar[tuple[str, ...]] = ("grading_mode",)

    def parse_row(self, row: Mapping[str, Any]) -> MultiChallengeSpec:
        fraction = choice(row, "grading_mode", ("all", "fraction"), "all") == "fraction"
        user_turns = _user_turns(row)
        rubric = require(row, "rubric")
        if not isinstance(rubric, list) or not 1 <= len(rubric) <= MAX_RUBRIC_ITEMS:
            raise RowError("rubric", f"expected a list of 1-{MAX_RUBRIC_ITEMS} rubric items")
        items: list[RubricItem] = []
        keys: set[str] = set()
        for i, raw in enumerate(rubric):
            instruction_id, args, turn = _parse_item(i, raw, user_turns)
            key = f"turn{turn}:{instruction_id}" if turn else instruction_id
            if key in keys:
                key = f"{key}#{i}"
            keys.add(key)
            items.append(RubricItem(instruction_id, args, key))
        return MultiChallengeSpec(tuple(items), fraction)

    def score(self, spec: MultiChallengeSpec, sample: Sample) -> Score:
        results = []
        for item in spec.items:
            checker = CHECKERS.get(item.instruction_id) or EXTRA_CHECKERS[item.instruction_id]
            results.append((item.key, bool(checker.check(sample.text, **dict(item.args)))))
        failed = [k for k, ok in results if not ok]
        info = {
            "passed": ",".join(k for k, ok in results if ok),
            "failed": ",".join(failed),
            "num_passed": f"{len(results) - len(failed)}/{len(results)}",
        }
        if spec.fraction:
            share = 1.0 / len(results)
            return scored({f"rubric:{k}": share if ok else 0.0 for k, ok in results}, **info)
        return scored({"all_passed": 0.0 if failed else 1.0}, **info)
