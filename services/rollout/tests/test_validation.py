"""Sampling parameters are refused with INVALID_ARGUMENT naming the field before any engine
sees them, NaN and infinities included (NaN passes every `<` comparison)."""

from __future__ import annotations

import math

import pytest
from rlfleet_core.errors import InvalidArgument
from rlfleet_proto.v1 import rollout_pb2
from rlfleet_rollout.validation import MIN_TEMPERATURE, checked_sampling, sampling_from_proto


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
        # Finite but past what float32 sampling survives (logits / t, logits * penalty).
        ("temperature", 3e38),
        ("repetition_penalty", 3e38),
        ("top_p", 1.5),
        ("top_k", -2),
    ],
)
def test_non_finite_negative_or_out_of_range_sampling_values_are_refused(
    field: str, value: float
) -> None:
    params = rollout_pb2.SamplingParams(max_tokens=4, **{field: value})
    with pytest.raises(InvalidArgument) as caught:
        sampling_from_proto(params, vocab_size=100)
    assert caught.value.field == f"sampling.{field}"


def test_ordinary_sampling_is_accepted() -> None:
    params = rollout_pb2.SamplingParams(max_tokens=4, temperature=0.7, repetition_penalty=1.1)
    config = sampling_from_proto(params, vocab_size=100)
    assert config.temperature == pytest.approx(0.7)


def test_a_tiny_positive_temperature_is_raised_to_vllms_floor() -> None:
    """logits / 1e-40 overflow float32 to inf and the softmax to NaN; vLLM raises such a
    temperature to 0.01, and so does the check shared by every engine."""
    config = checked_sampling(
        "", max_tokens=4, temperature=1e-40, top_p=1.0, top_k=-1, min_tokens=0,
        repetition_penalty=1.0,
    )  # fmt: skip
    assert config.temperature == MIN_TEMPERATURE
    greedy = checked_sampling(
        "", max_tokens=4, temperature=0.0, top_p=0.0, top_k=0, min_tokens=0,
        repetition_penalty=0.0,
    )  # fmt: skip
    assert (greedy.temperature, greedy.top_p, greedy.top_k, greedy.repetition_penalty) == (
        0.0, 1.0, -1, 1.0,
    )  # fmt: skip
