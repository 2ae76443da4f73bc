"""`multi_challenge`: multi-turn instruction following, graded by a rubric.

The conversation (several user/assistant turns in `responses_create_params.input`) sets
rules in earlier turns: a constraint in turn 1, a name in turn 2, a language for the
rest of the chat. The final response must still keep them. A rubric item is either a
programmatic check of the response alone (scored where the environment is placed, in a
worker by default) or, as in NeMo-Gym's `multichallenge` server, a free-text question
the LLM judge answers `[[YES]]` / `[[NO]]` about the final response, given the whole
conversation (asked on the gateway's loop, concurrently: environments/judged.py). A
judged item passes when the judge's answer equals its `pass_criteria` (NeMo-Gym's
rule); an answer without exactly one of the two labels fails the response as a
JUDGE_ERROR with the reason (NeMo-Gym reads it as NO).

Row fields:
- `responses_create_params.input` (required): the conversation; it must hold at least
  one assistant turn before the last user turn (else it is not multi-turn).
- `rubric` (required): a list of 1-64 items (at most 16 of them judged), each either programmatic
  `{"instruction_id", "kwargs", "turn", "description"}` or judged
  `{"question", "pass_criteria", "turn"}`. `instruction_id` is one of
  `if_all_checkers.CHECKERS` (the `instruction_following` ids, arguments checked the same
  way) or one of this module's `EXTRA_CHECKERS`: `language:script` (`script`: the
  writing system the reply must be in; one of `SCRIPTS`). `question` is a yes/no
  question about the final response; `pass_criteria` (`YES` default, or `NO`) is the
  answer that passes. `turn` (optional) is the 1-based user turn that stated the rule;
  it must exist, and it names the rubric component. `description` is for people.
- `grading_mode` (optional): `all` (default; reward 1 only if every item passes) or
  `fraction` (each passing item earns 1/k, one reward component per item).
"""

from __future__ import annotations

import asyncio
import json
import unicodedata
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from rlfleet_reward.environments.base import Environment, RunContext, choice, require
from rlfleet_reward.environments.if_all_checkers import CHECKERS, Checker
from rlfleet_reward.environments.judged import (
    JudgeFailed,
    ask_judge,
    conversation_of,
    deadline_of,
    judge_chat,
    judge_failure,
)
from rlfleet_reward.judge.fence import FENCE_RULE, fence
from rlfleet_reward.judge.labels import parse_yes_no
from rlfleet_reward.types import RowError, Sample, Score, scored

MAX_RUBRIC_ITEMS = 64
MAX_JUDGED_ITEMS = 16
"""Judged items of a row: each is one judge call per response, so a group of 1,024
responses to a row of 64 judged items would be 65,536 calls."""
MAX_QUESTION_CHARS = 4000
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
    """The checker's id; `judge` for a judged item."""
    args: tuple[tuple[str, Any], ...]
    key: str
    """Reward component name: `turn<N>:<id>` (or `<id>`), `#<index>` added when repeated."""
    question: str | None = None
    """A judged item's question (None: programmatic)."""
    pass_yes: bool = True
    """A judged item passes when the judge answers YES (`pass_criteria`), else NO."""


@dataclass(frozen=True)
class MultiChallengeSpec:
    items: tuple[RubricItem, ...]
    fraction: bool
    conversation: tuple[tuple[str, str], ...] = ()
    """The conversation as (role, text), for the judge (kept only when an item is judged)."""


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
        return _parse_judged(where, item, user_turns)
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
    return instruction_id, args, _turn(where, item, user_turns)


def _turn(where: str, item: dict[str, Any], user_turns: int) -> int:
    turn = item.get("turn", 0)
    if turn is None:
        turn = 0
    if isinstance(turn, bool) or not isinstance(turn, int) or not 0 <= turn <= user_turns:
        raise RowError(
            f"{where}.turn", f"expected a user turn in [1, {user_turns}] (or 0), got {turn!r}"
        )
    return turn


def _parse_judged(
    where: str, item: dict[str, Any], user_turns: int
) -> tuple[str, tuple[tuple[str, Any], ...], int]:
    """A judged item as ("judge", (("question", q), ("pass_yes", b)), turn)."""
    question = item["question"]
    if not isinstance(question, str) or not question.strip():
        raise RowError(f"{where}.question", "expected a non-empty yes/no question")
    if len(question) > MAX_QUESTION_CHARS:
        raise RowError(f"{where}.question", f"longer than {MAX_QUESTION_CHARS} characters")
    criteria = item.get("pass_criteria", "YES")
    if not isinstance(criteria, str) or criteria.strip().upper() not in ("YES", "NO"):
        raise RowError(f"{where}.pass_criteria", f"expected YES or NO, got {str(criteria)[:40]!r}")
    pass_yes = criteria.strip().upper() == "YES"
    return "judge", (("question", question), ("pass_yes", pass_yes)), _turn(where, item, user_turns)


class MultiChallengeEnvironment(Environment):
    name: ClassVar[str] = "multi_challenge"
    description: ClassVar[str] = (
        "Multi-turn instruction following: the final reply must keep rules set in earlier "
        "turns, each checked programmatically or asked of the LLM judge (yes/no)."
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
            if instruction_id == "judge":
                found = dict(args)
                items.append(
                    RubricItem("judge", (), key, str(found["question"]), bool(found["pass_yes"]))
                )
            else:
                items.append(RubricItem(instruction_id, args, key))
        asked = sum(item.question is not None for item in items)
        if asked > MAX_JUDGED_ITEMS:
            raise RowError(
                "rubric",
                f"{asked} judged items (questions); at most {MAX_JUDGED_ITEMS}, since each is "
                "a judge call per response",
            )
        judged = asked > 0
        return MultiChallengeSpec(tuple(items), fraction, conversation_of(row) if judged else ())

    async def run(self, spec: MultiChallengeSpec, sample: Sample, ctx: RunContext) -> Score:
        if all(item.question is None for item in spec.items):
            return await ctx.verify(self.name, spec, sample)
        return await self._run_judged(spec, sample, ctx)

    async def _run_judged(self, spec: MultiChallengeSpec, sample: Sample, ctx: RunContext) -> Score:
        """Programmatic items where the environment is placed (as `fraction`, so each
        item's pass shows in its component), judged ones on this loop, all at once."""
        deadline = deadline_of(ctx)
        programmatic = tuple(item for item in spec.items if item.question is None)
        judged = [item for item in spec.items if item.question is not None]
        checks = (
            ctx.verify(self.name, replace(spec, items=programmatic, fraction=True), sample)
            if programmatic
            else _nothing()
        )
        asks = [
            ask_judge(
                ctx, self.name, judge_messages(spec, item, sample.text), parse_yes_no, deadline
            )
            for item in judged
        ]
        checked, answers = await asyncio.gather(checks, asyncio.gather(*asks))
        if checked is not None and checked.failed:
            return checked
        passed = {
            key.removeprefix("rubric:"): value > 0
            for key, value in (checked.components if checked else {}).items()
        }
        failures = [
            (item.key, answer)
            for item, answer in zip(judged, answers, strict=True)
            if isinstance(answer, JudgeFailed)
        ]
        if failures:
            return judge_failure(failures, len(judged))
        verdicts = {}
        for item, answer in zip(judged, answers, strict=True):
            passed[item.key] = answer == item.pass_yes
            verdicts[item.key] = "YES" if answer else "NO"
        results = [(item.key, passed[item.key]) for item in spec.items]
        return rubric_score(results, spec.fraction, judge=json.dumps(verdicts))

    def score(self, spec: MultiChallengeSpec, sample: Sample) -> Score:
        results = []
        for item in spec.items:
            checker = CHECKERS.get(item.instruction_id) or EXTRA_CHECKERS[item.instruction_id]
            results.append((item.key, bool(checker.check(sample.text, **dict(item.args)))))
        return rubric_score(results, spec.fraction)


async def _nothing() -> None:
    return None


JUDGE_INSTRUCTIONS = (
    "You check one criterion of an AI assistant's final reply in a conversation. Read the "
    "conversation, then the final reply, then the question about the final reply; answer "
    "the question about the final reply only. End your answer with exactly one label: "
    "[[YES]] or [[NO]]. " + FENCE_RULE
)


def judge_messages(
    spec: MultiChallengeSpec, item: RubricItem, response: str
) -> list[dict[str, str]]:
    """Our wording of NeMo-Gym multichallenge's judge prompt (context, final response,
    question; the label last)."""
    chat = "\n\n".join(f"[{role.upper()}]: {content}" for role, content in spec.conversation)
    user = (
        f"# Conversation\n{chat}\n\n# Final reply\n{fence('FINAL_REPLY', response)}\n\n"
        f"# Question about the final reply\n{item.question}\n\n"
        "Answer with exactly one label: [[YES]] or [[NO]]."
    )
    return judge_chat(JUDGE_INSTRUCTIONS, user)


def rubric_score(results: list[tuple[str, bool]], fraction: bool, **extra: object) -> Score:
    """The reward of (component key, passed) per rubric item, in `grading_mode`."""
    failed = [k for k, ok in results if not ok]
    info: dict[str, object] = {
        "passed": ",".join(k for k, ok in results if ok),
        "failed": ",".join(failed),
        "num_passed": f"{len(results) - len(failed)}/{len(results)}",
        **extra,
    }
    if fraction:
        share = 1.0 / len(results)
        return scored({f"rubric:{k}": share if ok else 0.0 for k, ok in results}, **info)
    return scored({"all_passed": 0.0 if failed else 1.0}, **info)
