"""Rows of the tiny RLHF blend (`tiny-rlhf`): open questions a 135M model can answer in a
sentence or two, each with the principles (RL-BFF style) the GenRM judge weighs its
responses by, scored by the reward gateway's `genrm_compare`. Deterministic: the same
`n` and `seed` give the same rows."""

from __future__ import annotations

import random

TOPICS = (
    "the sun", "a cat", "rain", "the sea", "bread", "a tree", "music", "winter", "a river",
    "the moon", "coffee", "a dog", "snow", "a garden", "the wind", "a book", "an apple",
    "a bird", "a city", "a mountain", "summer", "a bicycle", "the forest", "a candle", "tea",
    "a bridge", "a clock", "a horse", "a school", "a flower", "a train", "a lake",
)  # fmt: skip
QUESTIONS = (
    "What is {} good for?",
    "Explain {} to a child.",
    "Give me one tip about {}.",
    "Why do people like {}?",
)
PRINCIPLES = (
    "The response answers the question that was asked.",
    "The response is one or two short sentences.",
    "The response is accurate and invents nothing.",
    "The response is friendly and plain, without lists or headings.",
    "The response does not repeat itself.",
)
SYSTEM = "Be brief."
"""A short system message: SmolLM2's chat template otherwise adds a 20-token default one."""


def rlhf_rows(n: int, seed: int) -> list[dict[str, object]]:
    """`n` rows: topic × question, the first principle always (answer the question) plus
    one other drawn by `seed`."""
    rng = random.Random(seed)
    rows: list[dict[str, object]] = []
    for i in range(n):
        topic = TOPICS[i % len(TOPICS)]
        question = QUESTIONS[i // len(TOPICS) % len(QUESTIONS)].format(topic)
        rows.append(
            {
                "id": f"tiny-rlhf-{i}",
                "agent_ref": {"name": "genrm_compare"},
                "responses_create_params": {
                    "input": [
                        {"role": "system", "content": SYSTEM},
                        {"role": "user", "content": question[0].upper() + question[1:]},
                    ]
                },
                "principles": [PRINCIPLES[0], rng.choice(PRINCIPLES[1:])],
            }
        )
    return rows
