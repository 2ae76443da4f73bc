"""The `long_context` source: reproducible rows of the requested length, bad options
refused naming the option."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rlfleet_contracts.rows import DataError, prompt_messages
from rlfleet_dataprep.long_context import TASKS
from rlfleet_dataprep.sources import fill_placeholder


def fill(**spec: Any) -> dict[str, Any]:
    return fill_placeholder({"_placeholder": {"source": "long_context", **spec}})


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("length_chars", [500, 20_000, 200_000])
def test_rows_have_the_asked_length_and_their_facts(task: str, length_chars: int) -> None:
    row = fill(task=task, seed=3, length_chars=length_chars)
    assert row["agent_ref"] == {"name": "long_context"} and row["task"] == task
    assert row["seed"] == 3 and row["match_type"] == "exact"
    # The filler stops once the document holds `length_chars`: one sentence over at most.
    assert length_chars <= row["length"] <= max(length_chars, 1_000) + 100
    prompt = prompt_messages(row)[-1]["content"]
    assert "Final Answer:" in prompt
    answers = row["expected_answer"]
    for value in answers if isinstance(answers, list) else [answers]:
        if task.startswith(("niah", "multi_hop")):
            assert value in prompt  # the needle (or the chain's start) is in the text


def test_length_in_tokens_is_four_characters_each() -> None:
    row = fill(task="niah_single", seed=1, length_tokens=5_000)
    assert 20_000 <= row["length"] <= 20_100


def test_same_spec_same_row_and_seeds_differ() -> None:
    spec = {"task": "multi_hop", "seed": 11, "length_chars": 5_000, "hops": 4}
    assert json.dumps(fill(**spec)) == json.dumps(fill(**spec))
    assert fill(**spec)["expected_answer"] != fill(**{**spec, "seed": 12})["expected_answer"]


def test_multi_needle_lists_every_needle() -> None:
    row = fill(task="niah_multi", seed=2, length_chars=2_000, needles=5)
    assert isinstance(row["expected_answer"], list) and len(set(row["expected_answer"])) == 5


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"task": "haystack", "length_chars": 100}, "task"),
        ({"task": "niah_single", "length_chars": 0}, "length_chars"),
        ({"task": "niah_single", "length_chars": 10**9}, "length_chars"),
        ({"task": "niah_single", "length_tokens": "many"}, "length_tokens"),
        ({"task": "niah_single", "length_chars": 100, "seed": "x"}, "seed"),
        ({"task": "multi_hop", "length_chars": 100, "hops": 13}, "hops"),
        ({"task": "niah_multi", "length_chars": 100, "needles": 0}, "needles"),
        ({"task": "aggregate_sum", "length_chars": 100, "records": 10_000}, "records"),
    ],
)
def test_bad_options_name_the_option(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(DataError, match=f"_placeholder.{field}"):
        fill(**spec)


def test_no_length_is_refused() -> None:
    with pytest.raises(DataError, match="length_chars"):
        fill(task="niah_single", seed=1)
