"""The code harness's literal parser (environments/code_harness.py): results of the untrusted
solution become builtin values or are refused, never objects of the solution's making."""

from __future__ import annotations

import math

import pytest
from rlfleet_reward.environments.code_harness import literal_value, plain


@pytest.mark.parametrize(
    "value",
    [
        0,
        -7,
        10**4000,
        1.5,
        -0.0,
        float("inf"),
        float("-inf"),
        1 + 2j,
        -1 - 2j,
        "s\n'\"\ud800",
        b"\x00\xff",
        None,
        True,
        (),
        (1,),
        [1, [2, (3, {4})]],
        set(),
        frozenset({1, 2}),
        {"a": {1: [None]}, (1, 2): frozenset()},
    ],
    ids=repr,
)
def test_round_trip(value: object) -> None:
    back = literal_value(repr(plain(value)))
    assert back == value and type(back) is type(value)


def test_nan_round_trips() -> None:
    assert math.isnan(literal_value(repr(float("nan"))))


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os').system('true')",
        "print",
        "(1).__class__",
        "[x for x in ()]",
        "lambda: 0",
        "1 + 1",
        "{[1]: 2}",
        "{[1]}",
        "set([1], [2])",
        "frozenset(x=1)",
        "...",
        "{**{}}",
        "[" * 300 + "]" * 300,
        "<__main__.Same object at 0x7f>",
    ],
)
def test_anything_else_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        literal_value(text)


def test_plain_strips_subclasses() -> None:
    class Same(int):
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = int.__hash__

    value = plain([Same(3), {"k": Same(4)}])
    assert value == [3, {"k": 4}] and type(value[0]) is int
    with pytest.raises(TypeError, match="not a plain value"):
        plain([object()])
