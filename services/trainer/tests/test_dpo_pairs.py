"""The DPO stage's definitions: a trajectory's calls by outcome (the gateway's counts plus
the calls the trainer could not read), its verdict, the hallucination rate, the pairs
picked from a prompt's trajectories, and a pair batch whose tool results get no loss."""

from __future__ import annotations

import pytest
from rlfleet_trainer.agent.calls import (
    call_counts,
    hallucination_rate,
    is_hallucinated,
    trajectory_verdict,
)
from rlfleet_trainer.dpo import ScoredSample, TokenizedPair, build_pair_batch, pick_pairs

CLEAN = {"calls/ok": "2", "calls/tool_error": "1", "calls/unknown_tool": "0"}


def test_call_counts_add_the_trainers_malformed_calls_to_the_gateways() -> None:
    counts = call_counts({**CLEAN, "state_matches": "true"}, malformed=2)
    assert counts == {
        "ok": 2,
        "malformed": 2,
        "unknown_tool": 0,
        "invalid_arguments": 0,
        "tool_error": 1,
        "after_end": 0,
    }
    assert call_counts({}, 0) == dict.fromkeys(counts, 0)  # an episode without calls
    with pytest.raises(ValueError, match=r"calls/ok='x': expected a count"):
        call_counts({"calls/ok": "x"}, 0)


@pytest.mark.parametrize(
    ("info", "malformed", "verdict"),
    [
        (CLEAN, 0, "correct"),  # a tool's own refusal (no such account) is no hallucination
        ({"calls/tool_error": "1"}, 0, "correct"),
        ({}, 0, "no_call"),
        ({}, 1, "malformed_call"),  # unreadable, e.g. <tool_call> cut by the token limit
        ({**CLEAN, "calls/unknown_tool": "1"}, 0, "wrong_name"),
        ({**CLEAN, "calls/invalid_arguments": "3"}, 0, "wrong_arguments"),
        # several kinds: the first of malformed, unknown tool, invalid arguments
        ({"calls/unknown_tool": "1", "calls/invalid_arguments": "1"}, 1, "malformed_call"),
        ({"calls/unknown_tool": "1", "calls/invalid_arguments": "1"}, 0, "wrong_name"),
    ],
)
def test_trajectory_verdict(info: dict[str, str], malformed: int, verdict: str) -> None:
    counts = call_counts(info, malformed)
    assert trajectory_verdict(counts) == verdict
    assert is_hallucinated(counts) == (verdict not in ("correct", "no_call"))


def test_hallucination_rate_is_the_share_of_trajectories_with_a_hallucinated_call() -> None:
    """Five trajectories: two hallucinated (one with two bad calls still counts once), one
    clean, one with no call, one refused by the tool: 2 / 5 = 0.4. No call is in the
    denominator: a policy that stops calling tools lowers the rate, which is why the
    report also gives the valid-call rate."""
    trajectories = [
        call_counts({"calls/unknown_tool": "2"}, 0),
        call_counts({}, 1),
        call_counts(CLEAN, 0),
        call_counts({}, 0),
        call_counts({"calls/tool_error": "1"}, 0),
    ]
    assert hallucination_rate(trajectories) == pytest.approx(0.4)
    assert hallucination_rate([]) == 0.0


def _sample(text: str, reward: float, info: dict[str, str], malformed: int = 0) -> ScoredSample:
    return ScoredSample(text, reward, {"verdict": trajectory_verdict(call_counts(info, malformed))})


def test_pairs_prefer_valid_calls_over_hallucinated_ones() -> None:
    """Chosen: all calls valid, best reward first, round-robin; rejected: a hallucinated
    trajectory, lowest reward first, each once; duplicates (same text) and no-call
    trajectories are never used; `max_pairs` caps a prompt's pairs."""
    samples = [
        _sample("valid, unsolved", 0.0, {"calls/ok": "1"}),
        _sample("unknown tool", 0.0, {"calls/unknown_tool": "1"}),
        _sample("no call", 0.0, {}),
        _sample("valid, solved", 1.0, {"calls/ok": "2"}),
        _sample("bad arguments", 0.0, {"calls/invalid_arguments": "1"}),
        _sample("unknown tool", 0.0, {"calls/unknown_tool": "1"}),  # same text: used once
        _sample("unreadable", 0.0, {}, malformed=1),
    ]
    assert pick_pairs(samples) == [(3, 1), (0, 4), (3, 6)]
    assert pick_pairs(samples, max_pairs=1) == [(3, 1)]
    assert pick_pairs([s for s in samples if s.info["verdict"] != "correct"]) == []
    assert pick_pairs([samples[0], samples[2], samples[3]]) == []  # nothing hallucinated


def test_pair_batch_masks_the_environments_tokens() -> None:
    """A multi-turn pair: model tokens 1, tool-result tokens 0; the mask keeps that per
    response token (prediction positions start one before the response)."""
    pair = TokenizedPair([5, 6], [7, 8, 9, 10], [11, 12], [1, 0, 0, 1], [1, 1])
    batch = build_pair_batch([pair])
    assert batch.mask_NT.tolist() == [[0.0, 1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 1.0, 0.0, 0.0]]
    unmasked = build_pair_batch([TokenizedPair([5, 6], [7, 8, 9, 10], [11, 12])])
    assert unmasked.mask_NT[0].tolist() == [0.0, 1.0, 1.0, 1.0, 1.0]
