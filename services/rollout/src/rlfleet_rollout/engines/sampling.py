"""Next-token choice for a batch of rows with per-row sampling parameters (hf engine).

Logprobs are the model's *raw* log-softmax of the token chosen, before temperature,
top-k/top-p, penalties or min-token masks: the same quantity vLLM returns in its default
`raw_logprobs` mode and the one a trainer recomputes from the same weights, so the
importance ratio compares like with like.

Shapes: B = rows in the batch, V = vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rlfleet_rollout.types import SamplingConfig


@dataclass
class RowState:
    """What sampling needs to know about one row at this step."""

    sampling: SamplingConfig
    generated: int
    """Tokens generated so far (for min_tokens)."""
    seen_token_ids: Sequence[int]
    """Prompt + generated ids (for the repetition penalty)."""
    banned_until_min: Sequence[int]
    """EOS and stop ids, masked while generated < min_tokens."""
    generator: torch.Generator | None = None

    @classmethod
    def of(
        cls,
        sampling: SamplingConfig,
        prompt: Sequence[int],
        generated: Sequence[int],
        eos: Sequence[int],
        generator: torch.Generator | None,
    ) -> RowState:
        """The state of a row with `prompt` that has `generated` so far (eos: the model's)."""
        penalised = sampling.repetition_penalty not in (0.0, 1.0)
        return cls(
            sampling=sampling,
            generated=len(generated),
            seen_token_ids=[*prompt, *generated] if penalised else (),
            banned_until_min=(*(() if sampling.ignore_eos else eos), *sampling.stop_token_ids),
            generator=generator,
        )


def choose_tokens(
    logits_BV: torch.Tensor, rows: Sequence[RowState]
) -> tuple[list[int], list[float]]:
    """(token id, raw logprob) per row."""
    logits_BV = logits_BV.float()
    raw_BV = torch.log_softmax(logits_BV, dim=-1)
    proc_BV = logits_BV.clone()
    for b, row in enumerate(rows):
        s = row.sampling
        if s.repetition_penalty not in (0.0, 1.0) and row.seen_token_ids:
            ids = torch.tensor(sorted(set(row.seen_token_ids)), device=proc_BV.device)
            vals = proc_BV[b, ids]
            proc_BV[b, ids] = torch.where(
                vals > 0, vals / s.repetition_penalty, vals * s.repetition_penalty
            )
        if row.generated < s.min_tokens and row.banned_until_min:
            proc_BV[b, list(row.banned_until_min)] = float("-inf")

    chosen: list[int] = [0] * len(rows)
    greedy = [b for b, r in enumerate(rows) if r.sampling.temperature <= 0]
    if greedy:
        picks = proc_BV[greedy].argmax(dim=-1).tolist()
        for b, tok in zip(greedy, picks, strict=True):
            chosen[b] = int(tok)
    sampled = [b for b, r in enumerate(rows) if r.sampling.temperature > 0]
    if sampled:
        probs_SV = _filtered_probs(proc_BV[sampled], [rows[b].sampling for b in sampled])
        for i, b in enumerate(sampled):
            gen = rows[b].generator
            chosen[b] = int(torch.multinomial(probs_SV[i], 1, generator=gen).item())
    index = torch.tensor(chosen, device=raw_BV.device).unsqueeze(-1)
    logprobs = raw_BV.gather(-1, index).squeeze(-1).tolist()
    return chosen, [float(x) for x in logprobs]


def _filtered_probs(logits_SV: torch.Tensor, params: Sequence[SamplingConfig]) -> torch.Tensor:
    """Temperature, then top-k, then top-p (vLLM's order), as probabilities."""
    device = logits_SV.device
    temp_S1 = torch.tensor([p.temperature for p in params], device=device).unsqueeze(-1)
    logits_SV = logits_SV / temp_S1
    vocab = logits_SV.shape[-1]
    top_k = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
    top_p = [p.top_p if 0 < p.top_p < 1 else 1.0 for p in params]
    if min(top_k) < vocab or min(top_p) < 1.0:
        sorted_SV, order_SV = logits_SV.sort(dim=-1, descending=True)
        rank_V = torch.arange(vocab, device=device)
        k_S1 = torch.tensor(top_k, device=device).unsqueeze(-1)
        sorted_SV = sorted_SV.masked_fill(rank_V >= k_S1, float("-inf"))
        probs_SV = sorted_SV.softmax(dim=-1)
        # Drop a token when the mass strictly before it already reaches top_p (the most
        # likely token always stays).
        before_SV = probs_SV.cumsum(dim=-1) - probs_SV
        p_S1 = torch.tensor(top_p, device=device).unsqueeze(-1)
        sorted_SV = sorted_SV.masked_fill(before_SV >= p_S1, float("-inf"))
        logits_SV = torch.full_like(logits_SV, float("-inf")).scatter(-1, order_SV, sorted_SV)
    return logits_SV.softmax(dim=-1)


def top_logprobs(logits_V: torch.Tensor, k: int) -> list[tuple[int, float]]:
    """The k most likely (token id, raw logprob) of one row, most likely first."""
    values, ids = torch.log_softmax(logits_V.float(), dim=-1).topk(k)
    return [(int(i), float(v)) for i, v in zip(ids.tolist(), values.tolist(), strict=True)]
