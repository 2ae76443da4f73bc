"""Rows of the `super-sample` blend: a few of each judge-free environment of the Super
RLVR mix that the tiny blends lack (long_context, multi_challenge, math_with_code).
Imported by make_bundled.py."""

from __future__ import annotations

from rlfleet_dataprep.long_context import TASKS

PYTHON_TOOL = {
    "type": "function",
    "name": "execute_python",
    "description": "Run Python code in a persistent session; print what you need to see.",
    "parameters": {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "The Python code to run."}},
        "required": ["code"],
        "additionalProperties": False,
    },
    "strict": True,
}
TOOL_SYSTEM = (
    "You are a math assistant. Use the execute_python tool for calculations; variables "
    "persist between calls. Give the final answer as \\boxed{answer}."
)
MATH_WITH_CODE = (
    ("How many subsets of {1, ..., 12} have exactly 4 elements?", "495"),
    ("What is the sum of the primes below 100?", "1060"),
    ("What is the remainder of 7^2026 divided by 1000?", "49"),
)


def _chat(*turns: str) -> dict[str, object]:
    roles = ("user", "assistant")
    return {"input": [{"role": roles[i % 2], "content": t} for i, t in enumerate(turns)]}


MULTI_CHALLENGE: list[dict[str, object]] = [
    {
        "responses_create_params": _chat(
            "I'm Ana. Please never use commas when you answer me.",
            "Sure Ana. No commas from me.",
            "My cat is called Miso. Suggest a game I could play with her.",
        ),
        "rubric": [
            {"instruction_id": "punctuation:no_comma", "turn": 1},
            {"instruction_id": "keywords:existence", "kwargs": {"keywords": ["Miso"]}, "turn": 2},
        ],
    },
    {
        "responses_create_params": _chat(
            "From now on, answer only in lowercase letters.",
            "okay, lowercase it is.",
            "Name three fruits that are red.",
        ),
        "rubric": [{"instruction_id": "change_case:english_lowercase", "turn": 1}],
    },
    {
        "responses_create_params": _chat(
            "Let's continue in Russian, please.",
            "Хорошо, продолжим по-русски.",
            "What is a good name for a dog?",
        ),
        "rubric": [
            {"instruction_id": "language:script", "kwargs": {"script": "cyrillic"}, "turn": 1}
        ],
    },
    {
        "responses_create_params": _chat(
            "Keep every answer under 20 words.",
            "Understood.",
            "Where do I live? I told you: in Porto.",
            "Right, you live in Porto.",
            "Recommend a dish from my city.",
        ),
        "rubric": [
            {
                "instruction_id": "length_constraints:number_words",
                "kwargs": {"num_words": 20, "relation": "less than"},
                "turn": 1,
            },
            {"instruction_id": "keywords:existence", "kwargs": {"keywords": ["Porto"]}, "turn": 2},
        ],
        "grading_mode": "fraction",
    },
]


def super_sample() -> list[dict[str, object]]:
    long_context: list[dict[str, object]] = [
        {
            "_placeholder": {
                "source": "long_context",
                "task": task,
                "seed": i,
                "length_tokens": 2_000,
            },
            "agent_ref": {"name": "long_context"},
        }
        for i, task in enumerate(TASKS)
    ]
    tool_rows: list[dict[str, object]] = [
        {
            "responses_create_params": {
                "input": [
                    {"role": "system", "content": TOOL_SYSTEM},
                    {"role": "user", "content": question},
                ],
                "tools": [PYTHON_TOOL],
                "parallel_tool_calls": False,
            },
            "agent_ref": {"name": "math_with_code"},
            "expected_result": answer,
        }
        for question, answer in MATH_WITH_CODE
    ]
    chats = [{**row, "agent_ref": {"name": "multi_challenge"}} for row in MULTI_CHALLENGE]
    return [*long_context, *tool_rows, *chats]
