"""Sampling parameters are refused with INVALID_ARGUMENT naming the field before any engine
sees them, NaN and infinities included (NaN passes every `<` comparison)."""

from __future__ import annotations

import math

import pytest
from rlfleet_core.errors import InvalidArgument
from rlfleet_proto.v1 import rollout_pb2
from rlfleet_rollout.validation import sampling_from_proto


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", math.nan),
        ("temperature", math.inf),
        ("temperature", -0.5),
        ("repetition_penalty", math.nan),
        ("repetition_penalty", math.inf),
        ("repetition_penalty", -1.0),
        ("top_p", math.nan),
    ],
)
def test_non_finite_or_negative_sampling_floats_are_refused(field: str, value: float) -> None:
    params = rollout_pb2.SamplingParams(max_tokens=4, **{field: value})
    with pytest.raises(InvalidArgument) as caught:
        sampling_from_proto(params, vocab_size=100)
    assert caught.value.field == f"sampling.{field}"


def test_ordinary_sampling_is_accepted() -> None:
    params = rollout_pb2.SamplingParams(max_tokens=4, temperature=0.7, repetition_penalty=1.1)
    config = sampling_from_proto(params, vocab_size=100)
    assert config.temperature == pytest.approx(0.7)
