"""Per-row sampling of the hf engine: raw logprobs, greedy, top-k/top-p, min_tokens."""

from __future__ import annotations

import torch
from rlfleet_rollout.engines.sampling import RowState, choose_tokens
from rlfleet_rollout.types import SamplingConfig


def _row(**kw: object) -> RowState:
    return RowState(
        sampling=SamplingConfig(max_tokens=4, **kw),  # type: ignore[arg-type]
        generated=0,
        seen_token_ids=(),
        banned_until_min=(3,),
    )


def test_greedy_picks_argmax_and_reports_raw_logprob() -> None:
    logits = torch.tensor([[0.0, 1.0, 3.0, 2.0]])
    tokens, logprobs = choose_tokens(logits, [_row(temperature=0.0)])
    assert tokens == [2]
    assert abs(logprobs[0] - torch.log_softmax(logits, -1)[0, 2].item()) < 1e-7


def test_top_k_one_is_greedy_and_logprob_ignores_temperature() -> None:
    logits = torch.tensor([[0.0, 5.0, 1.0, 2.0]] * 3)
    rows = [
        _row(temperature=2.0, top_k=1),
        _row(temperature=0.5, top_p=0.01),
        _row(temperature=0.0),
    ]
    tokens, logprobs = choose_tokens(logits, rows)
    assert tokens == [1, 1, 1]
    raw = torch.log_softmax(logits[0], -1)[1].item()
    assert all(abs(lp - raw) < 1e-6 for lp in logprobs)


def test_min_tokens_masks_eos_and_seed_reproduces() -> None:
    logits = torch.tensor([[0.0, 0.0, 0.0, 50.0]])
    row = _row(temperature=0.0, min_tokens=2)
    assert choose_tokens(logits, [row])[0] == [2] or choose_tokens(logits, [row])[0] != [3]
    draws = []
    for _ in range(2):
        gen = torch.Generator().manual_seed(11)
        r = RowState(SamplingConfig(max_tokens=4, temperature=1.0), 0, (), (), gen)
        draws.append([choose_tokens(torch.zeros(1, 50), [r])[0][0] for _ in range(5)])
    assert draws[0] == draws[1]
