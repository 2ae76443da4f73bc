"""Seeded verify requests for `reasoning_gym` across its failure categories (parity with
NeMo-Gym). Entries come from reasoning-gym's own generators (seeded), answers are written
the ways models write them. `generate()` returns `{"category", "request", "reference"}`."""

from __future__ import annotations

import json
import random
from typing import Any

from generate import message, response  # parity/ is on sys.path, as for record_mir

SEED = 13
PER_TASK = 40
TASKS = (
    "basic_arithmetic",
    "chain_sum",
    "leg_counting",
    "fraction_simplification",
    "word_sorting",
    "letter_counting",
    "spell_backward",
    "number_sorting",
    "base_conversion",
    "caesar_cipher",
    "gcd",
    "count_bits",
    "decimal_arithmetic",
    "number_filtering",
    "sentence_reordering",
)


def _text(rng: random.Random, gold: str, wrong: str) -> tuple[str, str]:
    lead = rng.choice(["", "Let me work it out.\n", "Step 1: read. Step 2: solve.\n\n"])
    forms = [
        ("answer_tag", f"<answer>{gold}</answer>"),
        ("answer_tag_spaced", f"<answer>\n  {gold}  \n</answer>"),
        ("answer_tag_wrong", f"<answer>{wrong}</answer>"),
        ("answer_tag_twice", f"<answer>{wrong}</answer> no wait <answer>{gold}</answer>"),
        ("answer_tag_empty", "<answer></answer>"),
        ("answer_tag_unclosed", f"<answer>{gold}"),
        ("answer_tag_and_box", f"\\boxed{{{wrong}}} <answer>{gold}</answer>"),
        ("boxed", f"\\boxed{{{gold}}}"),
        ("boxed_wrong", f"\\boxed{{{wrong}}}"),
        ("boxed_two", f"\\boxed{{{wrong}}} then \\boxed{{{gold}}}"),
        ("boxed_nested", f"\\boxed{{\\text{{{gold}}}}}"),
        ("boxed_empty_then", f"\\boxed{{}} \\boxed{{{gold}}}"),
        ("boxed_unclosed", f"\\boxed{{{gold}"),
        ("plain", gold),
        ("plain_sentence", f"The answer is {gold}."),
        ("plain_wrong", wrong),
        ("garbage", "I do not know"),
        ("empty", ""),
        ("case_changed", f"<answer>{gold.upper() if gold.islower() else gold.lower()}</answer>"),
        ("whitespace_inside", f"<answer>{' '.join(gold)}</answer>"),
    ]
    category, body = rng.choice(forms)
    return category, (lead + body if body else body)


def generate(seed: int = SEED, per_task: int = PER_TASK) -> list[dict[str, Any]]:
    import reasoning_gym

    rng = random.Random(seed)
    cases = []
    for t, task in enumerate(TASKS):
        dataset = reasoning_gym.create_dataset(task, size=per_task, seed=seed + t)
        entries = [json.loads(json.dumps(dataset[i], default=str)) for i in range(per_task)]
        for i, entry in enumerate(entries):
            gold = str(entry["answer"])
            wrong = str(entries[(i + 1) % per_task]["answer"])
            if wrong == gold:
                wrong = gold + "1"
            category, text = _text(rng, gold, wrong)
            request = {
                "responses_create_params": {
                    "input": [{"role": "user", "content": entry["question"]}]
                },
                "question": entry["question"],
                "answer": entry["answer"],
                "metadata": entry["metadata"],
                "response": response([message(text)]),
            }
            cases.append(
                {
                    "category": f"{task}/{category}",
                    "request": request,
                    "reference": {"server": "reasoning_gym", "request": request},
                }
            )
    return cases
