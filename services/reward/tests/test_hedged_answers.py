"""Hedged answers (issue 28: the policy controls its whole answer): an answer that names
several candidates must not score for more than one gold. Each hedge is scored against two
different golds; at most one may give reward 1 (math, multiple choice, long-context
retrieval). math-verify reads `a \\lor b`, `a \\vee b`, `a \\land b` as their last operand, so
those commit to one value; the forms below that a lenient reader could take as "any of"
are exactly the ones to pin."""

from __future__ import annotations

import pytest
from rlfleet_reward.environments import get_environment
from rlfleet_reward.environments.math import EXTRACTION_MODES
from rlfleet_reward.environments.mcqa import LENIENT
from rlfleet_reward.environments.mcqa_formats import NEMO_MODES
from rlfleet_reward.types import Sample

MATH_HEDGES = [
    r"\boxed{3 \lor 2}", r"\boxed{2 \vee 3}", r"\boxed{x = 3 \lor x = 2}",
    r"\boxed{3 \text{ or } 2}", r"\boxed{x = 2 \text{ or } x = 3}", r"\boxed{3, 2}",
    r"\boxed{\{2, 3\}}", r"\boxed{2 \text{ and } 3}", r"\boxed{3 \quad 2}", r"\boxed{3 \\ 2}",
    r"\boxed{3 ; 2}", r"\boxed{3 \text{ (or 2)}}", r"\boxed{2 \mid 3}", r"\boxed{3 \pm 1}",
    r"\boxed{[2, 3]}", r"\boxed{2 \le x \le 3}", r"\boxed{\{3\} \cup \{2\}}",
    r"\boxed{3 \approx 2}", r"\boxed{3 \implies 2}", r"\boxed{3 \iff 2}", r"\boxed{3 \to 2}",
    r"\boxed{2} or \boxed{3}", r"\boxed{3} \boxed{2}", r"\boxed{3}\n(or \boxed{2})",
    "The answer is 3 or 2.", "Final answer: 2, 3", "3\n2",
]  # fmt: skip
OPTIONS = [{"A": "Mercury"}, {"B": "Venus"}, {"C": "Earth"}, {"D": "Mars"}]
MCQA_HEDGES = [
    r"\boxed{ABCD}", r"\boxed{A, C}", r"\boxed{A/C}", r"\boxed{A} \boxed{C}",
    r"\boxed{C} or \boxed{A}", "Answer: A or C", "Answer: C\nAnswer: A", "Answer: AC",
    "A B C D", "The answer is A, C", "**Answer:** A and C", "Answer: (A) or (C)",
    "Answer: A\n\nAnswer: C", "Answer: Mercury or Earth",
]  # fmt: skip


def _rewards(env: str, rows: list[dict[str, object]], text: str) -> list[float]:
    environment = get_environment(env)
    rewards = []
    for row in rows:
        score = environment.score(environment.parse_row(row), Sample(text=text))
        rewards.append(score.reward)
    return rewards


@pytest.mark.parametrize("mode", EXTRACTION_MODES)
def test_a_hedged_math_answer_scores_for_one_gold_at_most(mode: str) -> None:
    rows: list[dict[str, object]] = [
        {"expected_answer": gold, "extraction": mode} for gold in ("3", "2")
    ]
    both = [t for t in MATH_HEDGES if _rewards("math", rows, t) == [1.0, 1.0]]
    assert both == [], both
    # The check itself can fail: one committed answer scores for its own gold.
    assert _rewards("math", rows, r"so \boxed{3}") == [1.0, 0.0]


@pytest.mark.parametrize("mode", [*NEMO_MODES, LENIENT])
def test_a_hedged_choice_scores_for_one_gold_at_most(mode: str) -> None:
    rows: list[dict[str, object]] = [
        {"question": "Which planet is ours?", "options": OPTIONS, "expected_answer": gold,
         "grading_mode": mode}
        for gold in ("C", "A")
    ]  # fmt: skip
    both = [t for t in MCQA_HEDGES if _rewards("mcqa", rows, t) == [1.0, 1.0]]
    assert both == [], both
    assert _rewards("mcqa", rows, r"Answer: C" + "\n" + r"\boxed{C}") == [1.0, 0.0]


LONG_CONTEXT_HEDGES = [
    "Final Answer: 12 or 34", "Final Answer: 12, 34", "Final Answer: 34\nFinal Answer: 12",
    r"\boxed{12} \boxed{34}", "Answer: 12/34", "The answer is 12 and 34.", "12 34",
    "Final Answer: [12, 34]",
]  # fmt: skip


def test_a_hedged_long_context_answer_scores_for_one_gold_at_most() -> None:
    rows: list[dict[str, object]] = [
        {"expected_answer": gold, "match_type": "exact"} for gold in ("12", "34")
    ]
    both = [t for t in LONG_CONTEXT_HEDGES if _rewards("long_context", rows, t) == [1.0, 1.0]]
    assert both == [], both
    assert _rewards("long_context", rows, "Final Answer: 12") == [1.0, 0.0]
