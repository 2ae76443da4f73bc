"""Table cases of long_context, multi_challenge and math_with_code (the shape of cases.py),
run in-process and through the real gateway by test_new_environments.py."""

from __future__ import annotations

from typing import Any

from cases import Case


def lc_row(expected: Any, **extra: Any) -> dict[str, Any]:
    return {"expected_answer": expected, "match_type": "exact", **extra}


# Rows as the data-prep source `long_context` writes them (its own test,
# tests/test_long_context_rows.py at the repo root, scores generated rows end to end).
_GENERATED = {
    "niah_single": lc_row("6924336", task="niah_single", length=3014, seed=1),
    "niah_multi": lc_row(["7983616", "4102834", "5846033"], task="niah_multi", seed=1),
    "aggregate_sum": lc_row("1960", task="aggregate_sum", length=3008, seed=1),
}
_HOP = lc_row("49416", task="multi_hop", length=3017, seed=1)


def _answer_line(row: dict[str, Any]) -> str:
    answer = row["expected_answer"]
    return "Final Answer: " + (", ".join(answer) if isinstance(answer, list) else answer)


_DOC = "The grass is green. " * 5000  # a 100,000-character "answer": the document echoed

LONG_CONTEXT = [
    *(
        Case(f"generated-{task}", row, "I read it.\n" + _answer_line(row), 1.0)
        for task, row in _GENERATED.items()
    ),
    Case("generated-multi-hop", _HOP, _answer_line(_HOP), 1.0, info={"task": "multi_hop"}),
    Case("generated-wrong", _HOP, "Final Answer: 1", 0.0, info={"verdict": "wrong"}),
    Case("case-and-quotes", lc_row("Sleepy-Fox"), 'Final Answer: "sleepy-fox".', 1.0),
    Case("thousands-separator", lc_row("1250"), "The answer is 1,250", 1.0),
    Case("trailing-zero", lc_row("42"), "Answer: 42.0", 1.0),
    Case("boxed", lc_row("7"), r"So \boxed{7}", 1.0),
    Case("bare-short-answer", lc_row("oslo"), "Oslo", 1.0),
    Case("last-line-wins", lc_row("3"), "Final Answer: 5\nFinal Answer: 3", 1.0),
    Case("list-any-order", lc_row(["12", "34", "56"]), "Final Answer: [56, 12 and 34]", 1.0),
    Case("list-missing-one", lc_row(["12", "34", "56"]), "Final Answer: 12, 34", 0.0),
    Case("list-extra-one", lc_row(["12", "34"]), "Final Answer: 12, 34, 99", 0.0),
    Case("list-repeated", lc_row(["12", "34"]), "Final Answer: 12, 34, 34", 0.0),
    Case("substring-is-wrong", lc_row("123"), "Final Answer: 1234", 0.0),
    Case(
        "no-answer",
        lc_row("1"),
        "I could not find it.\nSorry about that.",
        0.0,
        info={"verdict": "no_answer"},
    ),
    Case("empty-response", lc_row("1"), "", 0.0, info={"verdict": "no_answer"}),
    Case(
        "echoed-document",
        lc_row("1"),
        "Final Answer: " + _DOC,
        0.0,
        info={"verdict": "answer_too_long"},
    ),
    Case("deep-nesting", lc_row("1"), "Final Answer: " + "[" * 400 + "1" + "]" * 400, 1.0),
    Case(
        "deep-nesting-too-long",
        lc_row("1"),
        "Final Answer: " + "[" * 5000 + "1",
        0.0,
        info={"verdict": "answer_too_long"},
    ),
    Case("missing-expected", {"task": "niah_single"}, "1", invalid_field="row.expected_answer"),
    Case("empty-expected", lc_row("  "), "1", invalid_field="row.expected_answer"),
    Case("empty-list", lc_row([]), "1", invalid_field="row.expected_answer"),
    Case("object-in-list", lc_row(["1", {"a": 1}]), "1", invalid_field="row.expected_answer[1]"),
    Case("ruler2-soft-match", lc_row("1", match_type="all"), "1", invalid_field="row.match_type"),
    Case("bad-seed", lc_row("1", seed="x"), "1", invalid_field="row.seed"),
]


def conversation(*turns: str) -> dict[str, Any]:
    """Alternating user/assistant messages, starting and ending with the user."""
    roles = ("user", "assistant")
    return {"input": [{"role": roles[i % 2], "content": t} for i, t in enumerate(turns)]}


_CHAT = conversation(
    "Hi, I'm Priya. From now on, never use commas in your replies.",
    "Understood Priya.",
    "Call my dog Biscuit when you mention him. Suggest a name for his new toy.",
)
_RUSSIAN_CHAT = conversation(
    "Let's talk in Russian from now on, please.",
    "Конечно, давайте говорить по-русски.",
    "What should I cook tonight?",
)


def mc_row(rubric: list[dict[str, Any]], chat: Any = None, **extra: Any) -> dict[str, Any]:
    return {"responses_create_params": chat or _CHAT, "rubric": rubric, **extra}


_NO_COMMA = {"instruction_id": "punctuation:no_comma", "turn": 1}
_NAMES = {"instruction_id": "keywords:existence", "kwargs": {"keywords": ["Biscuit"]}, "turn": 2}
_PRIYA = {"instruction_id": "keywords:existence", "kwargs": {"keywords": ["Priya"]}, "turn": 1}
_RUSSIAN = {"instruction_id": "language:script", "kwargs": {"script": "cyrillic"}, "turn": 1}
_FULL = [_NO_COMMA, _NAMES, _PRIYA]
_GOOD = "Priya how about Squeaky Bone for Biscuit?"

MULTI_CHALLENGE = [
    Case("all-kept", mc_row(_FULL), _GOOD, 1.0, info={"num_passed": "3/3"}),
    Case(
        "comma-from-turn-1",
        mc_row(_FULL),
        "Priya, how about Squeaky Bone for Biscuit?",
        0.0,
        info={"failed": "turn1:punctuation:no_comma"},
    ),
    Case("forgot-the-dog", mc_row(_FULL), "Priya how about Squeaky Bone?", 0.0),
    Case("fraction", mc_row(_FULL, grading_mode="fraction"), "Priya how about a ball?", 2 / 3),
    Case("fraction-all", mc_row(_FULL, grading_mode="fraction"), _GOOD, 1.0),
    Case("fraction-none", mc_row(_FULL, grading_mode="fraction"), "Ball, rope.", 0.0),
    Case("russian-kept", mc_row([_RUSSIAN], _RUSSIAN_CHAT), "Приготовьте борщ с хлебом.", 1.0),
    Case(
        "russian-with-name", mc_row([_RUSSIAN], _RUSSIAN_CHAT), "Приготовьте борщ, как в Kyiv.", 1.0
    ),
    Case("russian-forgotten", mc_row([_RUSSIAN], _RUSSIAN_CHAT), "Cook some borscht.", 0.0),
    Case("script-of-empty", mc_row([_RUSSIAN], _RUSSIAN_CHAT), "", 0.0),
    Case(
        "lowercase-and-words",
        mc_row(
            [
                {"instruction_id": "change_case:english_lowercase", "turn": 1},
                {
                    "instruction_id": "length_constraints:number_words",
                    "kwargs": {"num_words": 5, "relation": "less than"},
                    "turn": 2,
                },
            ]
        ),
        "squeaky bone for biscuit",
        1.0,
    ),
    Case("repeated-id", mc_row([_NAMES, _NAMES]), "Biscuit", 1.0),
    Case("huge-response", mc_row([_NO_COMMA]), "word " * 200_000, 1.0),
    Case("deeply-nested", mc_row([_NO_COMMA]), "(" * 50_000 + ")" * 50_000, 1.0),
    Case("missing-rubric", {"responses_create_params": _CHAT}, "x", invalid_field="row.rubric"),
    Case("empty-rubric", mc_row([]), "x", invalid_field="row.rubric"),
    Case(
        "judge-item-criteria",
        mc_row([{"question": "Did it remember?", "pass_criteria": "MAYBE"}]),
        "x",
        invalid_field="row.rubric[0].pass_criteria",
    ),
    Case(
        "unknown-id",
        mc_row([{"instruction_id": "vibes:good"}]),
        "x",
        invalid_field="row.rubric[0].instruction_id",
    ),
    Case(
        "missing-kwarg",
        mc_row([{"instruction_id": "keywords:existence", "turn": 1}]),
        "x",
        invalid_field="row.rubric[0].kwargs.keywords",
    ),
    Case(
        "bad-script",
        mc_row([{"instruction_id": "language:script", "kwargs": {"script": "klingon"}}]),
        "x",
        invalid_field="row.rubric[0].kwargs.script",
    ),
    Case(
        "turn-out-of-range",
        mc_row([{**_NO_COMMA, "turn": 3}]),
        "x",
        invalid_field="row.rubric[0].turn",
    ),
    Case(
        "single-turn",
        mc_row([_NO_COMMA], conversation("Never use commas.")),
        "x",
        invalid_field="row.responses_create_params.input",
    ),
    Case("bad-mode", mc_row(_FULL, grading_mode="most"), "x", invalid_field="row.grading_mode"),
]


def mwc_row(expected: Any, key: str = "expected_result") -> dict[str, Any]:
    return {key: expected, "expected_code_contains": ""}


MATH_WITH_CODE = [
    Case("boxed", mwc_row("32"), r"The tool printed 32, so \boxed{32}", 1.0),
    Case("equivalent-form", mwc_row("0.5"), r"\boxed{\frac{1}{2}}", 1.0),
    Case("expected-answer-alias", mwc_row("7", "expected_answer"), r"\boxed{7}", 1.0),
    Case("wrong", mwc_row("32"), r"\boxed{31}", 0.0, info={"verdict": "wrong"}),
    Case("no-answer", mwc_row("32"), "Let me run more code.", 0.0),
    Case(
        "deep-nesting",
        mwc_row("1"),
        r"\boxed{" + "(" * 40 + "1" + ")" * 40 + "}",
        0.0,
        info={"verdict": "answer_too_complex"},
    ),
    Case(
        "huge-answer",
        mwc_row("1"),
        r"\boxed{" + "1" * 100_000 + "}",
        0.0,
        info={"verdict": "answer_too_long"},
    ),
    Case("missing-expected", {"question": "q"}, "1", invalid_field="row.expected_result"),
    Case("empty-expected", mwc_row(""), "1", invalid_field="row.expected_result"),
    Case(
        "bad-code-contains",
        {"expected_result": "1", "expected_code_contains": 3},
        "1",
        invalid_field="row.expected_code_contains",
    ),
]

NEW_CASES = {
    "long_context": LONG_CONTEXT,
    "multi_challenge": MULTI_CHALLENGE,
    "math_with_code": MATH_WITH_CODE,
}
