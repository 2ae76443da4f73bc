"""Domain types: the reward/components invariant and the proto enum mirror."""

from __future__ import annotations

import pytest
from rlfleet_proto.v1 import reward_pb2
from rlfleet_reward.text import (
    code_blocks,
    extract_code,
    final_answer_line,
    find_boxed,
    split_reasoning,
)
from rlfleet_reward.types import FailureKind, Score, binary, failure, scored


def test_failure_kind_mirrors_the_proto() -> None:
    for kind in FailureKind:
        assert reward_pb2.FailureKind.Value(f"FAILURE_KIND_{kind.name}") == kind.value
    assert len(FailureKind) == len(reward_pb2.FailureKind.keys())
    assert FailureKind.NONE.wire_name is None and FailureKind.TIMEOUT.wire_name == "timeout"


def test_components_must_sum_to_reward() -> None:
    assert scored({"a": 0.25, "b": 0.5}).reward == 0.75
    assert binary("correctness", True).components == {"correctness": 1.0}
    with pytest.raises(ValueError, match="must equal the sum"):
        Score(reward=1.0, components={"a": 0.5})


def test_failure_is_masked_zero_with_reason() -> None:
    score = failure(FailureKind.TIMEOUT, "too slow", extracted="x" * 1000)
    assert score.reward == 0.0 and score.components == {} and score.mask_sample and score.failed
    assert len(score.info["extracted"]) == 500
    with pytest.raises(ValueError, match="needs a reason"):
        Score(reward=0.0, failure_kind=FailureKind.TIMEOUT)


@pytest.mark.parametrize(
    ("text", "answer", "reasoning"),
    [
        ("plain", "plain", ""),
        ("<think>hmm</think> 42", "42", "hmm"),
        ("<think>a</think><think>b</think>c", "c", "a</think><think>b"),
        ("<think>cut off", "", "cut off"),
    ],
)
def test_split_reasoning(text: str, answer: str, reasoning: str) -> None:
    assert split_reasoning(text) == (answer, reasoning)


def test_text_helpers() -> None:
    assert find_boxed(r"\boxed{\frac{1}{2}} and \fbox{3} and \boxed{unclosed") == [
        r"\frac{1}{2}",
        "3",
    ]
    assert final_answer_line("work\nFinal answer: **12**.") == "12"
    assert final_answer_line("no answer here") is None
    assert code_blocks("```py\na\n```\n```\nb\n```") == [("py", "a\n"), ("", "b\n")]
    assert extract_code("```js\nx\n```\n```python\ny\n```") == "y\n"
    assert extract_code("print(1)") == "print(1)"
