"""Table-driven cases per environment, shared by the gRPC and the HTTP tests.

A case states what the response must score (`reward`, and the failure kind if any) or
which field a malformed row must be refused for (`invalid_field`, INVALID_ARGUMENT / 422).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from rlfleet_reward.types import FailureKind


@dataclass(frozen=True)
class Case:
    id: str
    row: dict[str, Any] | str
    text: str
    reward: float | None = None
    invalid_field: str | None = None
    failure: FailureKind = FailureKind.NONE
    num_tokens: int = 0
    info: dict[str, str] = field(default_factory=dict)


def math_row(expected: Any, **extra: Any) -> dict[str, Any]:
    return {"question": "q", "expected_answer": expected, **extra}


LENIENT = {"extraction": "lenient"}


MATH = [
    Case(
        "frac-vs-decimal",
        math_row("0.5"),
        r"so the answer is \boxed{\frac{1}{2}}",
        1.0,
        info={"verdict": "correct"},
    ),
    Case("decimal-vs-frac", math_row(r"\frac{1}{2}"), r"\boxed{0.5}", 1.0),
    Case("dfrac", math_row("0.75"), r"\boxed{\dfrac{3}{4}}", 1.0),
    Case("set-order", math_row(r"\{2,1\}"), r"\boxed{\{1,2\}}", 1.0),
    Case("interval", math_row("[0,1)"), r"\boxed{[0,1)}", 1.0),
    Case(
        "interval-wrong-bracket",
        math_row("[0,1)"),
        r"\boxed{(0,1)}",
        0.0,
        info={"verdict": "wrong"},
    ),
    Case("units-stripped", math_row("5"), r"\boxed{5\text{ cm}}", 1.0),
    Case("final-answer-line", math_row("42", **LENIENT), "Adding up.\nFinal answer: 42", 1.0),
    Case("the-answer-is", math_row("7", **LENIENT), "The answer is 7.", 1.0),
    Case("bare-answer", math_row("7", **LENIENT), "7", 1.0),
    Case(
        "unboxed-by-default",
        math_row("7"),
        "The answer is 7.",
        0.0,
        info={"verdict": "no_boxed_answer"},
    ),
    Case("unclosed-last-box", math_row("7"), r"\boxed{7} or \boxed{7", 0.0),
    Case("unclosed-last-box-lenient", math_row("7", **LENIENT), r"\boxed{7} or \boxed{7", 1.0),
    Case("empty-box", math_row("7"), r"7 \boxed{ }", 0.0, info={"verdict": "no_boxed_answer"}),
    Case("gold-in-dollars", math_row("$\\frac{1}{2}$"), r"\boxed{0.5}", 1.0),
    Case("gold-in-parens", math_row("\\(\\frac{1}{2}\\)"), r"\boxed{1/2}", 1.0),
    Case("bad-extraction", math_row("7", extraction="loose"), "7", invalid_field="row.extraction"),
    Case("sqrt-forms", math_row(r"\frac{\sqrt{2}}{2}"), r"\boxed{\sqrt{2}/2}", 1.0),
    Case("polynomial", math_row("(x+1)^2"), r"\boxed{x^2+2x+1}", 1.0),
    Case("negative", math_row("-3"), r"\boxed{-3}", 1.0),
    Case("pi", math_row(r"2\pi"), r"\boxed{2\pi}", 1.0),
    Case("last-boxed-wins", math_row("4"), r"first \boxed{4}, no wait: \boxed{5}", 0.0),
    Case("close-but-wrong", math_row("0.5"), r"\boxed{0.49}", 0.0),
    Case("wrong-integer", math_row("4"), r"\boxed{3}", 0.0),
    Case("no-answer", math_row("4"), "I am not sure.", 0.0, info={"verdict": "no_boxed_answer"}),
    Case("empty-response", math_row("4"), "", 0.0, info={"verdict": "no_boxed_answer"}),
    Case(
        "no-answer-lenient",
        math_row("4", **LENIENT),
        "I am not sure.",
        0.0,
        info={"verdict": "no_answer"},
    ),
    Case("think-stripped", math_row("4"), r"<think>maybe \boxed{3}</think>It is \boxed{4}", 1.0),
    Case(  # lenient: cut off while reasoning, no answer; NeMo-Gym grades the box anyway
        "truncated-think",
        math_row("4", **LENIENT),
        r"<think>so \boxed{4}",
        0.0,
        info={"verdict": "no_answer"},
    ),
    Case("truncated-think-default", math_row("4"), r"<think>so \boxed{4}", 1.0),
    Case("int-expected-type", math_row(12), r"\boxed{12}", 1.0),
    Case("missing-expected", {"question": "q"}, "1", invalid_field="row.expected_answer"),
    Case("null-expected", math_row(None), "1", invalid_field="row.expected_answer"),
    Case("list-expected", math_row([1]), "1", invalid_field="row.expected_answer"),
    Case("empty-expected", math_row("  "), "1", invalid_field="row.expected_answer"),
    Case("row-not-json", "{not json", "1", invalid_field="row_json"),
    Case("row-not-object", "[1, 2]", "1", invalid_field="row_json"),
]

OPTIONS = [{"A": "Mercury"}, {"B": "Venus"}, {"C": "Earth"}, {"D": "Mars"}]


def mcqa_row(expected: Any, **extra: Any) -> dict[str, Any]:
    return {"question": "Which planet?", "options": OPTIONS, "expected_answer": expected, **extra}


def lenient_row(expected: Any, **extra: Any) -> dict[str, Any]:
    """A row graded by rlfleet's opt-in lenient mode."""
    return mcqa_row(expected, grading_mode="lenient", **extra)


MCQA = [
    Case("boxed", lenient_row("C"), r"Reasoning... \boxed{C}", 1.0, info={"extraction": "boxed"}),
    Case("boxed-text", lenient_row("C"), r"\boxed{\text{C}}", 1.0),
    Case("boxed-paren", lenient_row("C"), r"\boxed{(C)}", 1.0),
    Case(
        "answer-colon",
        lenient_row("B"),
        "Venus is closest.\nAnswer: B",
        1.0,
        info={"extraction": "answer_phrase"},
    ),
    Case("answer-is-paren", lenient_row("B"), "So the answer is (B).", 1.0),
    Case("bold-answer", lenient_row("D"), "**Answer:** D", 1.0),
    Case("lowercase-letter", lenient_row("D"), "answer: d", 1.0),
    Case(
        "final-line-letter",
        lenient_row("A"),
        "Thinking about it.\n(A)",
        1.0,
        info={"extraction": "final_line"},
    ),
    Case(
        "option-text",
        lenient_row("C"),
        "It must be\nEarth",
        1.0,
        info={"extraction": "option_text"},
    ),
    Case("last-phrase-wins", lenient_row("B"), "Answer: A\nWait. Answer: B", 1.0),
    Case("wrong-letter", lenient_row("C"), r"\boxed{B}", 0.0, info={"verdict": "wrong"}),
    Case("wrong-phrase", lenient_row("C"), "Answer: A", 0.0),
    Case(
        "no-letter",
        lenient_row("C"),
        "I cannot decide between them.",
        0.0,
        info={"verdict": "no_answer"},
    ),
    Case("letter-outside-options", lenient_row("C"), "Answer: F", 0.0),
    Case("empty", lenient_row("C"), "", 0.0),
    Case("strict-needs-boxed", mcqa_row("C"), "Answer: C", 0.0),
    Case("strict-boxed-ok", mcqa_row("C"), r"\boxed{C}", 1.0),
    # NeMo-Gym's grading modes (the default is strict_single_letter_boxed).
    Case("nemo-boxed-label", mcqa_row("C"), r"\boxed{C: Earth}", 1.0),
    Case("nemo-boxed-lowercase", mcqa_row("C"), r"\boxed{c}", 0.0),
    Case(
        "nemo-lenient-boxed-text",
        mcqa_row("C", grading_mode="lenient_boxed"),
        r"\boxed{\text{earth}}",
        1.0,
    ),
    Case(
        "nemo-answer-colon",
        mcqa_row("B", grading_mode="lenient_answer_colon"),
        "Answer: venus",
        1.0,
    ),
    Case(
        "nemo-md-list-is-no-answer",
        mcqa_row("B", grading_mode="lenient_answer_colon_md"),
        "**Answer:** B or C",
        0.0,
    ),
    Case(
        "nemo-output-regex",
        mcqa_row("D", template_metadata={"output_regex": r"\[\[([A-Z])\]\]"}),
        "[[d]]",
        1.0,
    ),
    Case(
        "no-options-nemo-mode", {"expected_answer": "E"}, r"\boxed{E}", invalid_field="row.options"
    ),
    Case(
        "bad-output-regex",
        mcqa_row("A", template_metadata={"output_regex": "(["}),
        "A",
        invalid_field="row.template_metadata.output_regex",
    ),
    Case(
        "two-group-output-regex",
        mcqa_row("A", template_metadata={"output_regex": "(a)(b)"}),
        "A",
        invalid_field="row.template_metadata.output_regex",
    ),
    Case("expected-lowercase", lenient_row("c"), r"\boxed{C}", 1.0),
    Case(
        "options-as-strings",
        {"options": ["x", "y", "z"], "expected_answer": "B", "grading_mode": "lenient"},
        "Answer: B",
        1.0,
    ),
    Case(
        "options-as-dict",
        {"options": {"A": "x", "B": "y"}, "expected_answer": "A", "grading_mode": "lenient"},
        "Answer: A",
        1.0,
    ),
    Case(
        "no-options-lenient", {"expected_answer": "E", "grading_mode": "lenient"}, r"\boxed{E}", 1.0
    ),
    Case(
        "missing-expected",
        {"options": OPTIONS, "grading_mode": "lenient"},
        "A",
        invalid_field="row.expected_answer",
    ),
    Case("expected-not-an-option", lenient_row("F"), "A", invalid_field="row.expected_answer"),
    Case("expected-two-letters", lenient_row("AB"), "A", invalid_field="row.expected_answer"),
    Case("bad-options", lenient_row("A", options=[1, 2]), "A", invalid_field="row.options[0]"),
    Case(
        "bad-grading-mode",
        mcqa_row("A", grading_mode="fuzzy"),
        "A",
        invalid_field="row.grading_mode",
    ),
]

PERSON = json.dumps(
    {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
)


def so_row(schema: Any = PERSON, **extra: Any) -> dict[str, Any]:
    return {"schema_str": schema, "schema_type": "json", **extra}


# Rows each checked with a matching answer and a wrong one.
NUMBERS_ROW = so_row(json.dumps({"type": "array", "items": {"type": "number"}, "minItems": 2}))
COLOR_ROW = so_row(json.dumps({"enum": ["red", "green"]}))
NESTED_REF_ROW = so_row(
    json.dumps(
        {
            "$defs": {"p": {"type": "integer"}},
            "type": "object",
            "properties": {"a": {"$ref": "#/$defs/p"}},
        }
    )
)

STRUCTURED = [
    Case("valid", so_row(), '{"name": "Ada", "age": 36}', 1.0, info={"verdict": "valid"}),
    Case(
        "valid-fenced-lenient",
        so_row(extraction="lenient"),
        'Here:\n```json\n{"name": "Ada", "age": 36}\n```',
        1.0,
    ),
    Case(
        "fenced-by-default",
        so_row(),
        '```json\n{"name": "Ada", "age": 36}\n```',
        0.0,
        info={"verdict": "parse_error"},
    ),
    Case("yaml", so_row(schema_type="yaml"), "name: Ada\nage: 36\n", 1.0),
    Case("yaml-wrong-type", so_row(schema_type="yaml"), "name: Ada\nage: old\n", 0.0),
    Case("toml", so_row(schema_type="toml"), 'name = "Ada"\nage = 36', 1.0),
    Case(
        "xml-coerced",
        so_row(
            json.dumps({"type": "object", "properties": {"p": json.loads(PERSON)}}),
            schema_type="xml",
        ),
        "<p><name>Ada</name><age>36</age></p>",
        1.0,
    ),
    Case(
        "csv-coerced",
        so_row(json.dumps({"type": "array", "items": json.loads(PERSON)}), schema_type="csv"),
        "name,age\nAda,36\nBob,7\n",
        1.0,
    ),
    Case(
        "strict-optional-missing",
        so_row(json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}})),
        "{}",
        0.0,
        info={"verdict": "validation_error"},
    ),
    Case(
        "lenient-optional-missing",
        so_row(
            json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}}),
            extraction="lenient",
        ),
        "{}",
        1.0,
    ),
    Case(
        "lenient-yaml",
        so_row(schema_type="yaml", extraction="lenient"),
        "{}",
        invalid_field="row.extraction",
    ),
    Case("valid-whitespace", so_row(), '\n  {"age": 1, "name": ""}  \n', 1.0),
    Case(
        "missing-required",
        so_row(),
        '{"name": "Ada"}',
        0.0,
        info={"verdict": "validation_error", "path": "<root>"},
    ),
    Case(
        "wrong-type",
        so_row(),
        '{"name": "Ada", "age": "36"}',
        0.0,
        info={"verdict": "validation_error", "path": "age"},
    ),
    Case("below-minimum", so_row(), '{"name": "Ada", "age": -1}', 0.0, info={"path": "age"}),
    Case(
        "extra-property",
        so_row(),
        '{"name": "Ada", "age": 3, "x": 1}',
        0.0,
        info={"verdict": "validation_error"},
    ),
    Case("not-json", so_row(), "name: Ada", 0.0, info={"verdict": "parse_error"}),
    Case(
        "truncated-json", so_row(), '{"name": "Ada", "age": ', 0.0, info={"verdict": "parse_error"}
    ),
    Case("array-not-object", so_row(), "[1, 2]", 0.0, info={"verdict": "validation_error"}),
    Case("empty", so_row(), "", 0.0, info={"verdict": "empty_response"}),
    Case(
        "trailing-text",
        so_row(),
        '{"name": "Ada", "age": 3} hope this helps',
        0.0,
        info={"verdict": "parse_error"},
    ),
    Case("array-schema", NUMBERS_ROW, "[1, 2.5]", 1.0),
    Case("array-schema-short", NUMBERS_ROW, "[1]", 0.0),
    Case("enum", COLOR_ROW, '"green"', 1.0),
    Case("enum-wrong", COLOR_ROW, '"blue"', 0.0),
    Case("nested-ref", NESTED_REF_ROW, '{"a": 2}', 1.0),
    Case("nested-ref-wrong", NESTED_REF_ROW, '{"a": 2.5}', 0.0),
    Case("schema-as-object", so_row({"type": "integer"}), "3", 1.0),
    Case("true-schema", so_row("true"), '{"anything": [1]}', 1.0),
    Case("missing-schema", {"schema_type": "json"}, "{}", invalid_field="row.schema_str"),
    Case("schema-not-json", so_row("{type: object"), "{}", invalid_field="row.schema_str"),
    Case(
        "schema-invalid",
        so_row(json.dumps({"type": "no-such-type"})),
        "{}",
        invalid_field="row.schema_str",
    ),
    Case("schema-is-number", so_row("3"), "{}", invalid_field="row.schema_str"),
    Case("schema-type-html", so_row(schema_type="html"), "{}", invalid_field="row.schema_type"),
    Case("response-mode-bad", so_row(response_mode="x"), "{}", invalid_field="row.response_mode"),
]


def if_row(
    ids: list[str], kwargs: list[dict[str, Any]] | None = None, **extra: Any
) -> dict[str, Any]:
    return {
        "prompt": "Write something.",
        "instruction_id_list": ids,
        "kwargs": kwargs if kwargs is not None else [{} for _ in ids],
        **extra,
    }


INSTRUCTION_FOLLOWING = [
    Case("no-comma", if_row(["punctuation:no_comma"]), "No commas here at all.", 1.0),
    Case(
        "no-comma-broken",
        if_row(["punctuation:no_comma"]),
        "One, two.",
        0.0,
        info={"not_followed": "punctuation:no_comma"},
    ),
    Case(
        "lowercase",
        if_row(["change_case:english_lowercase"]),
        "the river runs under the old stone bridge.",
        1.0,
    ),
    # Lowercase is not enough: the text must be English (langdetect, as NeMo-Gym checks).
    # NLTK's tokenizer runs in the workers (keywords:start_end), and NeMo-Gym's own ids work.
    Case("start-end-word", if_row(["keywords:start_end"]), "Hello there, hello", 1.0),
    Case(
        "nemo-gym-layout",
        {
            "id": 7,
            "verifier_metadata": {
                "instruction_id_list": ["last_word:last_word_answer", "count:lowercase_counting"],
                "prompt": "p",
                "kwargs": [{"last_word": "contest"}, {"N": 3}],
                "grading_mode": "fraction",
            },
        },
        "We Won The contest!",
        1.0,
    ),
    Case(
        "lowercase-not-english",
        if_row(["change_case:english_lowercase"]),
        "el río corre bajo el viejo puente de piedra.",
        0.0,
    ),
    Case("lowercase-broken", if_row(["change_case:english_lowercase"]), "All quiet here.", 0.0),
    Case(
        "uppercase",
        if_row(["change_case:english_capital"]),
        "THE RIVER RUNS UNDER THE OLD STONE BRIDGE!",
        1.0,
    ),
    Case(
        "keywords",
        if_row(["keywords:existence"], [{"keywords": ["apple", "Pear"]}]),
        "An apple and a pear.",
        1.0,
    ),
    Case(
        "keywords-missing",
        if_row(["keywords:existence"], [{"keywords": ["apple", "kiwi"]}]),
        "An apple.",
        0.0,
    ),
    Case(
        "keyword-frequency",
        if_row(
            ["keywords:frequency"], [{"keyword": "cat", "frequency": 2, "relation": "at least"}]
        ),
        "cat and cat",
        1.0,
    ),
    Case(
        "keyword-frequency-less",
        if_row(
            ["keywords:frequency"], [{"keyword": "cat", "frequency": 2, "relation": "less than"}]
        ),
        "cat and cat",
        0.0,
    ),
    Case(
        "forbidden",
        if_row(["keywords:forbidden_words"], [{"forbidden_words": ["very"]}]),
        "Every day.",
        1.0,
    ),
    Case(
        "word-count",
        if_row(["length_constraints:number_words"], [{"num_words": 5, "relation": "less than"}]),
        "Four words right here.",
        1.0,
    ),
    Case(
        "sentences",
        if_row(
            ["length_constraints:number_sentences"], [{"num_sentences": 3, "relation": "at least"}]
        ),
        "One. Two! Three?",
        1.0,
    ),
    Case(
        "paragraphs",
        if_row(["length_constraints:number_paragraphs"], [{"num_paragraphs": 2}]),
        "First.\n***\nSecond.",
        1.0,
    ),
    Case("json-format", if_row(["detectable_format:json_format"]), '```json\n{"a": 1}\n```', 1.0),
    Case("title", if_row(["detectable_format:title"]), "<<My Poem>>\nRoses.", 1.0),
    Case(
        "bullets",
        if_row(["detectable_format:number_bullet_lists"], [{"num_bullets": 2}]),
        "* one\n* two",
        1.0,
    ),
    Case(
        "bullets-wrong-count",
        if_row(["detectable_format:number_bullet_lists"], [{"num_bullets": 3}]),
        "* one\n* two",
        0.0,
    ),
    Case(
        "combined-all",
        if_row(["punctuation:no_comma", "change_case:english_lowercase"]),
        "the river runs under the old stone bridge",
        1.0,
    ),
    Case(
        "combined-one-fails",
        if_row(["punctuation:no_comma", "change_case:english_lowercase"]),
        "the river runs under the old stone bridge, slowly",
        0.0,
        info={"num_followed": "1/2"},
    ),
    Case(
        "fraction-mode",
        if_row(["punctuation:no_comma", "change_case:english_lowercase"], grading_mode="fraction"),
        "the river runs under the old stone bridge, slowly",
        0.5,
    ),
    Case(
        "end-phrase",
        if_row(["startend:end_checker"], [{"end_phrase": "Any other questions?"}]),
        "Done. Any other questions?",
        1.0,
    ),
    Case(
        "postscript",
        if_row(["detectable_content:postscript"], [{"postscript_marker": "P.S."}]),
        "Hi.\nP.S. bye",
        1.0,
    ),
    Case(
        "ifbench-keywords-multiple",
        if_row(
            ["count:keywords_multiple"],
            [
                {
                    "keyword1": "a1",
                    "keyword2": "b2",
                    "keyword3": "c3",
                    "keyword4": "d4",
                    "keyword5": "e5",
                }
            ],
        ),
        " ".join(["a1"] + ["b2"] * 2 + ["c3"] * 3 + ["d4"] * 5 + ["e5"] * 7),
        1.0,
    ),
    Case(
        "null-kwargs-ignored",
        if_row(["punctuation:no_comma"], [{"num_words": None, "keywords": None}]),
        "ok",
        1.0,
    ),
    Case(
        "unknown-instruction",
        if_row(["language:klingon"]),
        "x",
        invalid_field="row.instruction_id_list[0]",
    ),
    Case(
        "missing-arg",
        if_row(["keywords:existence"], [{}]),
        "x",
        invalid_field="row.kwargs[0].keywords",
    ),
    Case(
        "bad-relation",
        if_row(["length_constraints:number_words"], [{"num_words": 5, "relation": "about"}]),
        "x",
        invalid_field="row.kwargs[0].relation",
    ),
    Case(
        "kwargs-length-mismatch",
        if_row(["punctuation:no_comma"], [{}, {}]),
        "x",
        invalid_field="row.kwargs",
    ),
    Case("empty-list", if_row([]), "x", invalid_field="row.instruction_id_list"),
]


def rg_row(task: str, answer: str, **metadata: Any) -> dict[str, Any]:
    return {"question": "q", "answer": answer, "metadata": {"source_dataset": task, **metadata}}


REASONING_GYM = [
    Case("arith-tagged", rg_row("basic_arithmetic", "-4"), "<answer>-4</answer>", 1.0),
    Case("arith-boxed", rg_row("basic_arithmetic", "-4"), r"So \boxed{-4}", 1.0),
    Case("arith-bare", rg_row("basic_arithmetic", "-4"), "-4", 1.0),
    Case("arith-wrong", rg_row("basic_arithmetic", "-4"), "<answer>4</answer>", 0.0),
    Case(
        "arith-last-tag",
        rg_row("basic_arithmetic", "12"),
        "<answer>11</answer> no: <answer>12</answer>",
        1.0,
    ),
    Case("arith-empty", rg_row("basic_arithmetic", "12"), "", 0.0),
    Case("legs", rg_row("leg_counting", "292"), "<answer>292</answer>", 1.0),
    Case("legs-wrong", rg_row("leg_counting", "292"), "<answer>290</answer>", 0.0),
    Case(
        "task-field",
        {"task": "leg_counting", "answer": "8", "metadata": {}},
        "<answer>8</answer>",
        1.0,
    ),
    Case("entry-object", {"entry": rg_row("leg_counting", "8")}, "<answer>8</answer>", 1.0),
    Case(
        "think-stripped",
        rg_row("leg_counting", "8"),
        "<think><answer>7</answer></think><answer>8</answer>",
        1.0,
    ),
    Case("words-reversed", rg_row("spell_backward", "olleh"), "<answer>olleh</answer>", 1.0),
    # spell_backward gives partial credit for a same-length wrong word: the scorer decides.
    Case(
        "words-reversed-partial", rg_row("spell_backward", "olleh"), "<answer>hello</answer>", 0.2
    ),
    Case("whitespace-answer", rg_row("basic_arithmetic", "5"), "<answer>  5 \n</answer>", 1.0),
    Case(
        "number-answer-in-row",
        {"answer": 5, "metadata": {"source_dataset": "basic_arithmetic"}},
        "<answer>5</answer>",
        1.0,
    ),
    Case("other-text", rg_row("leg_counting", "8"), "there are eight legs", 0.0),
    Case(
        "multiple-answers",
        rg_row("basic_arithmetic", "3"),
        "<answer>3</answer><answer>4</answer>",
        0.0,
    ),
    # No closed tag: the whole text is the answer; basic_arithmetic's scorer gives 1/9 for it.
    Case(
        "tag-unclosed",
        rg_row("basic_arithmetic", "3"),
        "<answer>3",
        1 / 9,
        info={"extracted_answer": "<answer>3"},
    ),
    Case("boxed-over-bare", rg_row("basic_arithmetic", "3"), r"3 or \boxed{4}", 0.0),
    Case("zero", rg_row("basic_arithmetic", "0"), "<answer>0</answer>", 1.0),
    Case(
        "unknown-task",
        rg_row("no_such_task", "1"),
        "1",
        invalid_field="row.metadata.source_dataset",
    ),
    Case("missing-metadata", {"answer": "1"}, "1", invalid_field="row.metadata"),
    Case(
        "missing-answer",
        {"metadata": {"source_dataset": "leg_counting"}},
        "1",
        invalid_field="row.answer",
    ),
    *(
        Case(
            f"answer-{kind}",
            {"answer": value, "metadata": {"source_dataset": "leg_counting"}},
            "1",
            invalid_field="row.answer",
        )
        for kind, value in (("list", [1]), ("object", {"a": 1}), ("bool", True))
    ),
    # A null answer is allowed (some tasks score from metadata, as NeMo-Gym allows); a
    # scorer that then raises gives 0, not a failure.
    Case(
        "answer-null",
        {"answer": None, "metadata": {"source_dataset": "leg_counting"}},
        "1",
        0.0,
        info={
            "scorer_error": "TypeError: 'in <string>' requires string as left operand, not NoneType"
        },
    ),
    Case("flat-first-box", rg_row("basic_arithmetic", "3"), r"\boxed{3} then \boxed{4}", 1.0),
    Case(
        "balanced-box-opt-in",
        rg_row(
            "basic_arithmetic",
            "4",
        )
        | {"answer_extraction": "balanced_boxed"},
        r"\boxed{3} then \boxed{4}",
        1.0,
    ),
    Case(
        "metadata-not-object",
        {"answer": "1", "metadata": "leg_counting"},
        "1",
        invalid_field="row.metadata",
    ),
    Case(
        "no-task-name",
        {"answer": "1", "metadata": {}},
        "1",
        invalid_field="row.metadata.source_dataset",
    ),
]

ADD_TEST = (
    "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n"
)
ADD_ROW = {"prompt": "def add(a, b):\n", "test": ADD_TEST, "entry_point": "add"}
APPROX_ROW = {
    "test": "def check(candidate):\n    assert abs(candidate(3.0) - 1.5) < 1e-9\n",
    "entry_point": "half",
}
MAP_ROW = {
    "test": "def check(candidate):\n"
    "    for got, want in zip(map(candidate, [1, 2]), [2, 4]):\n        assert got == want\n",
    "entry_point": "double",
}
RAISES_ROW = {
    "test": "def check(candidate):\n    assert candidate(4) == 2\n"
    "    try:\n        candidate(-1)\n    except ValueError:\n        return\n"
    "    raise AssertionError('no ValueError')\n",
    "entry_point": "root",
}
ATEXIT_HACK = (
    "import atexit, os\natexit.register(lambda: os._exit(0))\ndef add(a, b):\n    return 0"
)
ALWAYS_EQUAL_HACK = (
    "class Same(int):\n"
    "    def __eq__(self, other):\n        return True\n"
    "    def __repr__(self):\n        return object.__repr__(self)\n"
    "def add(a, b):\n    return Same(0)"
)
ECHO_CASES = [{"input": "3\n", "output": "6\n"}, {"input": "10\n", "output": "20"}]


def fenced(code: str) -> str:
    return f"Here is my solution:\n```python\n{code}\n```\n"


CODE = [
    Case(
        "humaneval-correct",
        ADD_ROW,
        fenced("def add(a, b):\n    return a + b"),
        1.0,
        info={"status": "ok", "verdict": "pass"},
    ),
    Case(
        "humaneval-wrong",
        ADD_ROW,
        fenced("def add(a, b):\n    return a - b"),
        0.0,
        info={"status": "ok", "verdict": "fail", "error": "AssertionError:  (test line 2)"},
    ),
    Case("humaneval-completion-style", ADD_ROW, fenced("    return a + b"), 1.0),
    Case("humaneval-bare-code", ADD_ROW, "def add(a, b):\n    return b + a\n", 1.0),
    Case("humaneval-syntax-error", ADD_ROW, fenced("def add(a, b) return a + b"), 0.0),
    Case("humaneval-raises", ADD_ROW, fenced("def add(a, b):\n    raise ValueError('no')"), 0.0),
    Case(
        "humaneval-infinite-loop",
        {**ADD_ROW, "timeout_s": 1.0},
        fenced("def add(a, b):\n    while True: pass"),
        0.0,
        info={"status": "timeout"},
    ),
    # Reward hacks (issue 12): a wrong `add` plus a trick that made the old one-process
    # program exit 0 or pass its asserts. The full table runs against the real sandbox in
    # tests/test_reward_sandbox.py; these are the ones safe to run without isolation.
    Case(
        "hack-sys-exit-0-before-tests",
        ADD_ROW,
        fenced("import sys\ndef add(a, b):\n    return 0\nsys.exit(0)"),
        0.0,
        info={"verdict": "fail", "error": "solution did not load: SystemExit: 0"},
    ),
    Case(
        "hack-atexit-os-exit-0",
        ADD_ROW,
        fenced(ATEXIT_HACK),
        0.0,
        info={"verdict": "fail", "error": "AssertionError:  (test line 2)"},
    ),
    Case(
        "hack-always-equal-result",
        ADD_ROW,
        fenced(ALWAYS_EQUAL_HACK),
        0.0,
        info={"verdict": "fail"},
    ),
    Case(
        "hack-system-exit-during-call",
        ADD_ROW,
        fenced("def add(a, b):\n    raise SystemExit(0)"),
        0.0,
        info={"verdict": "fail"},
    ),
    Case(
        "hack-patched-abs",
        APPROX_ROW,
        fenced("import builtins\nbuiltins.abs = lambda x: 0\ndef half(x):\n    return 7.0"),
        0.0,
        info={"verdict": "fail", "error": "AssertionError:  (test line 2)"},
    ),
    Case("approx-correct", APPROX_ROW, fenced("def half(x):\n    return x / 2"), 1.0),
    Case(
        "hack-stop-iteration-ends-map",
        MAP_ROW,
        fenced("def double(x):\n    raise StopIteration"),
        0.0,
        info={"verdict": "fail", "error": "CandidateError: StopIteration:  (test line 2)"},
    ),
    Case("map-correct", MAP_ROW, fenced("def double(x):\n    return 2 * x"), 1.0),
    Case(
        "expected-exception-passes",
        RAISES_ROW,
        fenced("def root(x):\n    if x < 0:\n        raise ValueError(x)\n    return x ** 0.5"),
        1.0,
    ),
    Case(
        "plain-values-round-trip",
        {
            "test": "def check(candidate):\n"
            "    assert candidate() == (float('inf'), {1, 2}, frozenset(), b'x', 1j, {'a': [None]})\n",
            "entry_point": "values",
        },
        fenced(
            "import collections\ndef values():\n"
            "    return (float('inf'), {1, 2}, frozenset(), b'x', 1j,"
            " collections.OrderedDict(a=[None]))"
        ),
        1.0,
    ),
    Case(
        "humaneval-last-block",
        ADD_ROW,
        fenced("def add(a, b):\n    return 0") + fenced("def add(a, b):\n    return a + b"),
        1.0,
    ),
    Case(
        "tests-alias",
        {"tests": ADD_TEST, "entry_point": "add"},
        fenced("def add(a, b):\n    return a + b"),
        1.0,
    ),
    Case(
        "stdio-correct",
        {"test_cases": ECHO_CASES},
        fenced("print(int(input()) * 2)"),
        1.0,
        info={"passed": "2/2"},
    ),
    Case(
        "stdio-one-wrong",
        {"test_cases": ECHO_CASES},
        fenced("n = int(input())\nprint(6 if n == 3 else 0)"),
        0.0,
        info={"passed": "1/2"},
    ),
    Case(
        "stdio-partial",
        {"test_cases": ECHO_CASES, "partial_credit": True},
        fenced("n = int(input())\nprint(6 if n == 3 else 0)"),
        0.5,
    ),
    Case(
        "stdio-trailing-space",
        {"test_cases": ECHO_CASES},
        fenced("print(str(int(input()) * 2) + '   ')"),
        1.0,
    ),
    Case("stdio-crash", {"test_cases": ECHO_CASES}, fenced("raise SystemExit(2)"), 0.0),
    Case(
        "stdio-reads-nothing",
        {"test_cases": [{"input": "", "output": "hi"}]},
        fenced("print('hi')"),
        1.0,
    ),
    Case("empty-response", ADD_ROW, "", 0.0, info={"verdict": "no_code"}),
    Case("other-language-fence", ADD_ROW, "```js\nfunction add(a,b){return a+b}\n```", 0.0),
    Case(
        "stderr-noise-ok",
        ADD_ROW,
        fenced("import sys\ndef add(a, b):\n    print('dbg', file=sys.stderr)\n    return a + b"),
        1.0,
    ),
    Case("wrong-entry-point", ADD_ROW, fenced("def plus(a, b):\n    return a + b"), 0.0),
    Case("missing-tests", {"entry_point": "add"}, "x", invalid_field="row.test"),
    Case("missing-entry-point", {"test": ADD_TEST}, "x", invalid_field="row.entry_point"),
    Case(
        "bad-entry-point",
        {"test": ADD_TEST, "entry_point": "a b"},
        "x",
        invalid_field="row.entry_point",
    ),
    Case(
        "bad-test-cases", {"test_cases": [{"input": "1"}]}, "x", invalid_field="row.test_cases[0]"
    ),
    Case("empty-test-cases", {"test_cases": []}, "x", invalid_field="row.test_cases"),
    Case("bad-timeout", {**ADD_ROW, "timeout_s": -1}, "x", invalid_field="row.timeout_s"),
]

WEATHER = {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius", "days": 3}}


def tool_row(expected: Any = WEATHER, **extra: Any) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": "Weather?"}]},
        "expected_tool_call": expected,
        **extra,
    }


def hermes(name: str, arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


TOOL_USE = [
    Case(
        "hermes-exact",
        tool_row(),
        hermes("get_weather", {"city": "Paris", "unit": "celsius", "days": 3}),
        1.0,
    ),
    Case(
        "key-order-irrelevant",
        tool_row(),
        hermes("get_weather", {"days": 3, "unit": "celsius", "city": "Paris"}),
        1.0,
    ),
    Case(
        "int-equals-float",
        tool_row(),
        hermes("get_weather", {"city": "Paris", "unit": "celsius", "days": 3.0}),
        1.0,
    ),
    Case(
        "bare-json",
        tool_row(),
        json.dumps({"name": "get_weather", "arguments": WEATHER["arguments"]}),
        1.0,
    ),
    Case(
        "fenced-json-parameters",
        tool_row(),
        "```json\n"
        + json.dumps({"name": "get_weather", "parameters": WEATHER["arguments"]})
        + "\n```",
        1.0,
    ),
    Case(
        "openai-function-shape",
        tool_row(),
        json.dumps(
            {
                "type": "function",
                "name": "get_weather",
                "function": {"name": "get_weather", "arguments": json.dumps(WEATHER["arguments"])},
            }
        ),
        1.0,
    ),
    Case(
        "arguments-as-string",
        tool_row(),
        hermes("get_weather", json.dumps(WEATHER["arguments"])),
        1.0,
    ),
    Case(
        "wrong-name",
        tool_row(),
        hermes("get_forecast", WEATHER["arguments"]),
        0.0,
        info={"verdict": "wrong_name"},
    ),
    Case(
        "wrong-value",
        tool_row(),
        hermes("get_weather", {"city": "Lyon", "unit": "celsius", "days": 3}),
        0.0,
        info={"verdict": "wrong_arguments"},
    ),
    Case(
        "missing-arg", tool_row(), hermes("get_weather", {"city": "Paris", "unit": "celsius"}), 0.0
    ),
    Case(
        "extra-arg", tool_row(), hermes("get_weather", {**WEATHER["arguments"], "lang": "fr"}), 0.0
    ),
    Case(
        "case-differs-exact",
        tool_row(),
        hermes("get_weather", {"city": "paris", "unit": "celsius", "days": 3}),
        0.0,
    ),
    Case(
        "case-differs-normalized",
        tool_row(argument_match="normalized"),
        hermes("get_weather", {"city": " paris", "unit": "Celsius", "days": 3}),
        1.0,
    ),
    Case(
        "partial-credit",
        tool_row(partial_credit=True),
        hermes("get_weather", {"city": "Paris", "unit": "kelvin", "days": 3}),
        0.5 + 0.5 * 2 / 3,
    ),
    Case(
        "partial-wrong-name",
        tool_row(partial_credit=True),
        hermes("other", WEATHER["arguments"]),
        0.5,
    ),
    Case("no-call", tool_row(), "It is sunny in Paris.", 0.0, info={"verdict": "no_call"}),
    Case(
        "malformed-call",
        tool_row(),
        "<tool_call>{name: get_weather}</tool_call>",
        0.0,
        info={"verdict": "malformed_call"},
    ),
    Case(
        "two-calls",
        tool_row(),
        hermes("get_weather", WEATHER["arguments"]) * 2,
        0.0,
        info={"verdict": "multiple_calls"},
    ),
    Case("no-args-expected", tool_row({"name": "ping", "arguments": {}}), hermes("ping", {}), 1.0),
    Case(
        "nested-args",
        tool_row({"name": "f", "arguments": {"a": {"b": [1, 2]}}}),
        hermes("f", {"a": {"b": [1, 2]}}),
        1.0,
    ),
    Case(
        "nested-args-wrong",
        tool_row({"name": "f", "arguments": {"a": {"b": [1, 2]}}}),
        hermes("f", {"a": {"b": [2, 1]}}),
        0.0,
    ),
    Case(
        "bool-not-int",
        tool_row({"name": "f", "arguments": {"x": True}}),
        hermes("f", {"x": 1}),
        0.0,
    ),
    Case("missing-expected", {"x": 1}, "", invalid_field="row.expected_tool_call"),
    Case(
        "expected-no-name",
        tool_row({"arguments": {}}),
        "",
        invalid_field="row.expected_tool_call.name",
    ),
    Case(
        "expected-bad-args",
        tool_row({"name": "f", "arguments": "not json"}),
        "",
        invalid_field="row.expected_tool_call.arguments",
    ),
    Case(
        "bad-match-mode", tool_row(argument_match="fuzzy"), "", invalid_field="row.argument_match"
    ),
]


def le_row(inner: str = "math", **extra: Any) -> dict[str, Any]:
    return {
        "inner_env": inner,
        "expected_answer": "4",
        "token_budget": 1000,
        "length_penalty": 0.5,
        **extra,
    }


LOW_EFFORT = [
    Case("correct-zero-length", le_row(), r"\boxed{4}", 1.0 - 0.5 * 1 / 1000, num_tokens=1),
    Case("correct-half-budget", le_row(), r"\boxed{4}", 0.75, num_tokens=500),
    Case("correct-at-budget", le_row(), r"\boxed{4}", 0.5, num_tokens=1000),
    Case("correct-past-budget", le_row(), r"\boxed{4}", 0.5, num_tokens=5000),
    Case("wrong-short", le_row(), r"\boxed{5}", 0.0, num_tokens=10),
    Case("wrong-long", le_row(), r"\boxed{5}", 0.0, num_tokens=5000),
    Case("no-penalty", le_row(length_penalty=0.0), r"\boxed{4}", 1.0, num_tokens=900),
    Case("full-penalty", le_row(length_penalty=1.0), r"\boxed{4}", 0.9, num_tokens=100),
    Case(
        "default-budget",
        {"inner_env": "math", "expected_answer": "4"},
        r"\boxed{4}",
        1.0 - 0.5 * 1024 / 2048,
        num_tokens=1024,
    ),
    Case(
        "wraps-mcqa",
        {
            "inner_env": "mcqa",
            "expected_answer": "B",
            "grading_mode": "lenient",
            "token_budget": 100,
        },
        "Answer: B",
        0.75,
        num_tokens=50,
    ),
    Case(
        "wraps-mcqa-wrong",
        {
            "inner_env": "mcqa",
            "expected_answer": "B",
            "grading_mode": "lenient",
            "token_budget": 100,
        },
        "Answer: C",
        0.0,
        num_tokens=50,
    ),
    Case(
        "wraps-if-fraction",
        {
            "inner_env": "instruction_following",
            "instruction_id_list": ["punctuation:no_comma", "change_case:english_lowercase"],
            "grading_mode": "fraction",
            "token_budget": 10,
        },
        "the river runs under the old stone bridge, slowly",
        0.5 - 0.5 * 0.5 * 0.5,
        num_tokens=5,
    ),
    Case(
        "wraps-structured",
        {
            "inner_env": "structured_outputs",
            "schema_str": '{"type": "integer"}',
            "token_budget": 10,
        },
        "3",
        0.5,
        num_tokens=10,
    ),
    Case(
        "wraps-tool-use",
        {"inner_env": "tool_use", "expected_tool_call": {"name": "f"}, "token_budget": 4},
        hermes("f", {}),
        0.75,
        num_tokens=2,
    ),
    Case(
        "wraps-reasoning-gym",
        {"inner_env": "reasoning_gym", **rg_row("basic_arithmetic", "2"), "token_budget": 8},
        "<answer>2</answer>",
        0.75,
        num_tokens=4,
    ),
    Case(
        "wraps-code",
        {"inner_env": "code", **ADD_ROW, "token_budget": 100},
        fenced("def add(a, b):\n    return a + b"),
        0.5,
        num_tokens=100,
    ),
    Case("no-answer", le_row(), "no idea", 0.0, num_tokens=3),
    Case("tiny-budget", le_row(token_budget=1), r"\boxed{4}", 0.5, num_tokens=1),
    Case(
        "equivalent-form",
        {"inner_env": "math", "expected_answer": "0.5", "token_budget": 10},
        r"\boxed{\frac12}",
        0.75,
        num_tokens=5,
    ),
    Case(
        "think-counted-by-tokens", le_row(), r"<think>long</think>\boxed{4}", 0.75, num_tokens=500
    ),
    Case("missing-num-tokens", le_row(), r"\boxed{4}", invalid_field="response.num_tokens"),
    Case(
        "missing-inner", {"expected_answer": "4"}, "x", invalid_field="row.inner_env", num_tokens=5
    ),
    Case("inner-is-self", le_row("low_effort"), "x", invalid_field="row.inner_env", num_tokens=5),
    Case("inner-unknown", le_row("nope"), "x", invalid_field="row.inner_env", num_tokens=5),
    Case(
        "inner-row-invalid",
        {"inner_env": "math"},
        "x",
        invalid_field="row.expected_answer",
        num_tokens=5,
    ),
    Case(
        "bad-penalty",
        le_row(length_penalty=2),
        "x",
        invalid_field="row.length_penalty",
        num_tokens=5,
    ),
    Case("bad-budget", le_row(token_budget=0), "x", invalid_field="row.token_budget", num_tokens=5),
]

ALL_CASES = {
    "math": MATH,
    "mcqa": MCQA,
    "structured_outputs": STRUCTURED,
    "instruction_following": INSTRUCTION_FOLLOWING,
    "reasoning_gym": REASONING_GYM,
    "code": CODE,
    "tool_use": TOOL_USE,
    "low_effort": LOW_EFFORT,
}
