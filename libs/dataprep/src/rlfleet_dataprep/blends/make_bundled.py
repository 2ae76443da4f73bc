"""Writes the bundled blends of placeholder rows (run from the repo root):

    uv run python libs/dataprep/src/rlfleet_dataprep/blends/make_bundled.py

Each line names a local source (see rlfleet_dataprep.sources), as published blends name the
data their fill script fetches; `rlfleet data prep rl <name>` fills them.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from pathlib import Path

from rlfleet_contracts.rows import LENIENT_EXTRACTION, MATH_EXTRACTION_FIELD
from rlfleet_dataprep.blends.rlhf import rlhf_rows
from rlfleet_dataprep.blends.safety import safety_rows
from rlfleet_dataprep.blends.super_sample import super_sample
from rlfleet_dataprep.blends.tool_use import tool_use_rows

HERE = Path(__file__).resolve().parent

# Easy, learnable-by-a-small-model reasoning-gym settings for the tiny pipeline.
EASY_ARITHMETIC: dict[str, object] = {
    "min_terms": 2,
    "max_terms": 2,
    "min_digits": 1,
    "max_digits": 1,
}


ADDITION: dict[str, object] = {
    **EASY_ARITHMETIC,
    "operators": ["+"],
    "allow_negation": False,
    "allow_parentheses": False,
}
MINUS_TIMES: dict[str, object] = {**ADDITION, "operators": ["-", "*"]}
MIXED_OPS: dict[str, object] = {**ADDITION, "operators": ["+", "-", "*"]}
BRIEF = " Reply with only the answer."
# A short system message: SmolLM2's chat template otherwise adds a 20-token default one,
# and prompt tokens are most of what a CPU step trains on.
TERSE = "Be brief."
# Stage 3: verifiable instructions (IFEval-style) on short open questions, graded per
# instruction followed. SmolLM2 after stages 1-2 follows ~28% of them (mostly "no
# commas" and "short"; lowercase almost never): room to learn, and reward spread within
# a group from the start.
TOPICS_TEXT = """
the sun, a cat, rain, the sea, bread, a tree, music, winter, a river, the moon,
coffee, a dog, snow, a garden, the wind, a book, an apple, a bird, the night, a city,
a mountain, summer, a bicycle, the forest, a candle, tea, a bridge, the desert, a
clock, a horse, a school, the ocean, a flower, a train, the sky, a lake, fire, a
friend, the rain, a storm, a map, a song, cheese, a window, a road, the stars, a boat,
autumn, a house, chocolate, a beach, the morning, a library, a lion, ice, a hill, a
painting, the spring, a kitchen, an island, a cloud, a garden path, soup, a market, a
village, the evening, a shell, a park, a whale, a farm, a pencil, a star, a wave, a
cake, a field
"""
TOPICS = tuple(" ".join(t.split()) for t in TOPICS_TEXT.split(","))
QUESTIONS = (
    "Describe {}.",
    "Tell me one fact about {}.",
    "What do you like about {}?",
    "Write a sentence about {}.",
)
INSTRUCTIONS = " Answer in all lowercase letters, without commas, in fewer than 12 words."


def instruction_following(n: int, start: int = 0) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for i in range(start, start + n):
        topic, question = TOPICS[i % len(TOPICS)], QUESTIONS[i // len(TOPICS) % len(QUESTIONS)]
        prompt = question.format(topic) + INSTRUCTIONS
        rows.append(
            {
                "id": f"tiny-if-{i}",
                "agent_ref": {"name": "instruction_following"},
                "responses_create_params": {
                    "input": [
                        {"role": "system", "content": TERSE},
                        {"role": "user", "content": prompt},
                    ]
                },
                "instruction_id_list": [
                    "change_case:english_lowercase",
                    "punctuation:no_comma",
                    "length_constraints:number_words",
                ],
                "kwargs": [{}, {}, {"relation": "less than", "num_words": 12}],
                "grading_mode": "fraction",
            }
        )
    return rows


def reasoning_gym(
    task: str,
    n: int,
    seed: int,
    config: dict[str, object] | None = None,
    score_with: str = "reasoning_gym",
    suffix: str = "",
    system: str = "",
    extraction: str = "",
) -> list[dict[str, object]]:
    spec = {
        "source": "reasoning_gym",
        "task": task,
        "seed": seed,
        "size": n,
        **({"config": config} if config else {}),
        **({"score_with": score_with} if score_with != "reasoning_gym" else {}),
        **({"suffix": suffix} if suffix else {}),
        **({"system": system} if system else {}),
        **({"extraction": extraction} if extraction else {}),
    }
    # The tiny prompts ask for a bare answer, not \\boxed{}: opt into lenient extraction.
    extra = {MATH_EXTRACTION_FIELD: LENIENT_EXTRACTION} if score_with == "math" else {}
    return [
        {"_placeholder": {**spec, "index": i}, "agent_ref": {"name": score_with}, **extra}
        for i in range(n)
    ]


# Structured outputs: a two-key JSON object about a topic, valid under its schema. SmolLM2
# answers ~15% of these with one bare JSON line (the rest: prose, or a ```json block cut
# off at 24 tokens): room to learn the format. (A multiple-choice set was tried first: the
# model answers "C) 58", which no mcqa grading mode reads, 0 of 44 held-out samples scored
# and nothing to learn from.)
JSON_KEYS = (("name", "color"), ("title", "mood"), ("name", "place"))


def structured_outputs(n: int, start: int = 0) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for i in range(start, start + n):
        topic, keys = TOPICS[i % len(TOPICS)], JSON_KEYS[i // len(TOPICS) % len(JSON_KEYS)]
        schema = {
            "type": "object",
            "properties": {key: {"type": "string"} for key in keys},
            "required": list(keys),
            "additionalProperties": False,
        }
        prompt = (
            f"Give {topic} a {keys[0]} and a {keys[1]}. Reply with only a JSON object with "
            f'the string keys "{keys[0]}" and "{keys[1]}".'
        )
        rows.append(
            {
                "id": f"tiny-json-{i}",
                "agent_ref": {"name": "structured_outputs"},
                "responses_create_params": {
                    "input": [
                        {"role": "system", "content": TERSE},
                        {"role": "user", "content": prompt},
                    ]
                },
                "schema_str": json.dumps(schema),
                "schema_type": "json",
            }
        )
    return rows


def indexed(source: str, env: str, indices: Iterable[int]) -> list[dict[str, object]]:
    return [
        {"_placeholder": {"source": source, "index": i}, "agent_ref": {"name": env}}
        for i in indices
    ]


# IFBench prompts whose instructions the instruction_following environment all checks (50 of
# the 61 such in IFBench_test): a row with any other id is refused by data prep's row check.
IFBENCH_COVERED = (
    *range(0, 5), *range(17, 22), 24, *range(35, 46), *range(52, 60), 63, 64,
    *range(106, 113), *range(118, 125), *range(234, 238),
)  # fmt: skip

BLENDS: dict[str, list[dict[str, object]]] = {
    # The tiny pipeline (`rlfleet run`): one blend per RLVR stage, each a mix of three
    # environments trained in every batch (like the Super stages' mixed blends), learnable
    # by SmolLM2-135M on 2 CPU cores in a few minutes: bare-answer arithmetic (`math`,
    # lenient extraction), open questions under verifiable instructions
    # (`instruction_following`) and small JSON objects under a schema (`structured_outputs`).
    "tiny-rlvr1": [
        *reasoning_gym("basic_arithmetic", 100, 11, ADDITION, "math", BRIEF, TERSE),
        *structured_outputs(100),
        *instruction_following(100),
    ],
    "tiny-rlvr2": [
        *reasoning_gym("basic_arithmetic", 100, 12, MINUS_TIMES, "math", BRIEF, TERSE),
        *structured_outputs(100, start=100),
        *instruction_following(100, start=100),
    ],
    "tiny-rlvr3": [
        *instruction_following(100, start=200),
        *reasoning_gym("basic_arithmetic", 100, 13, MIXED_OPS, "math", BRIEF, TERSE),
        *structured_outputs(100, start=200),
    ],
    "tiny-mix": [
        *reasoning_gym("basic_arithmetic", 150, seed=1, config=EASY_ARITHMETIC),
        *reasoning_gym("leg_counting", 50, seed=2),
        *indexed("human_eval", "code", range(50)),
        *indexed("ifbench", "instruction_following", IFBENCH_COVERED),
    ],
    # Multi-turn tool use over the reward gateway's bank (`tiny/tooluse`), tasks of graded
    # difficulty: `rlfleet data prep rl tiny-tooluse --val-rows 28` holds the last 28 out.
    "tiny-tooluse": tool_use_rows(140, seed=7),
    # RLHF (`tiny/rlhf`): open questions with principles, scored by the GenRM judge
    # (`genrm_compare`): `rlfleet data prep rl tiny-rlhf --val-rows 16`.
    "tiny-rlhf": rlhf_rows(128, seed=17),
    # A few rows of each judge-free Super RLVR environment the tiny blends lack.
    "super-sample": super_sample(),
    # The judge-graded `safety` environment: over-refusal and (placeholder) jailbreaks.
    "tiny-safety": safety_rows(),
}


def main() -> None:
    for name, rows in BLENDS.items():
        # Shuffled, like published blends, so the last rows (held out) mix every source.
        rows = list(rows)
        random.Random(0).shuffle(rows)
        path = HERE / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
        print(f"{path.name}: {len(rows)} rows")


if __name__ == "__main__":
    main()
