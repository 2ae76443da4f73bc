"""DPO on the GRPO policy backends: preference pairs → token batch → reference logprobs →
`backend.train_step(batch, recipe.dpo)`, and pairs built from scored tool-use samples.

A pair batch is a `TrainBatch` whose rows interleave each pair's chosen (row 2i) and
rejected (row 2i+1) sequence; the mask is 1 on the response tokens, so both go through the
backend's own forward and logprob path, the one GRPO trains with.

Reference logprobs (`dpo.reference`): `precomputed` scores every pair once with the policy
itself before its first step (its weights are then the starting weights), so no second
model is held; on CPU that is the cheaper option — one no-grad forward per pair in all
(a frozen copy also does one per pair *per step*, and doubles weight memory). `copy` asks
the backend's frozen reference (`keep_reference=True`), `none` is reference-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from rlfleet_contracts.preference import DPOConfig, PreferencePair

from rlfleet_trainer.backends.base import PolicyBackend
from rlfleet_trainer.batch import TrainBatch, Trajectory, build_train_batch

REFERENCE_MODES: tuple[str, ...] = ("precomputed", "copy", "none")

HALLUCINATION_VERDICTS: frozenset[str] = frozenset(
    {"wrong_name", "wrong_arguments", "malformed_call", "multiple_calls"}
)
"""tool_use verdicts (rlfleet_reward's environment) that mark a hallucinated call: a tool
that is not the one asked for (or none that exists), wrong or unparsable arguments, or
extra calls. `no_call` is a miss, not a hallucination, and is not used as rejected."""
CORRECT_VERDICT = "correct"


@dataclass
class TokenizedPair:
    prompt_ids: list[int]
    chosen_ids: list[int]
    rejected_ids: list[int]
    chosen_mask: list[int] | None = None
    rejected_mask: list[int] | None = None
    """Per response token: 1 = the policy's, 0 = the environment's (a multi-turn
    trajectory's tool results get no loss); None = all the policy's."""


def _render(tokenizer: Any, messages: list[dict[str, Any]], tools: list[Any], gen: bool) -> str:
    text: str = tokenizer.apply_chat_template(
        messages, tools=tools or None, tokenize=False, add_generation_prompt=gen
    )
    return text


def tokenize_pair(tokenizer: Any, pair: PreferencePair, max_length: int) -> TokenizedPair:
    """The chat-templated prompt (with its tools, ending in the assistant header) and each
    response's tokens as the template renders them after it (end-of-turn included).
    Responses are cut so prompt + response fit `max_length`."""
    prompt_text = _render(tokenizer, pair.prompt, pair.tools, gen=True)
    prompt_ids: list[int] = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    if len(prompt_ids) >= max_length:
        raise ValueError(
            f"prompt: {len(prompt_ids)} tokens leave no room for a response within "
            f"max_length {max_length}"
        )
    responses = []
    for name, messages in (("chosen", pair.chosen), ("rejected", pair.rejected)):
        full = _render(tokenizer, pair.prompt + messages, pair.tools, gen=False)
        if not full.startswith(prompt_text):
            raise ValueError(f"{name}: the chat template does not render the prompt as a prefix")
        ids = tokenizer(full[len(prompt_text) :], add_special_tokens=False)["input_ids"]
        responses.append(ids[: max_length - len(prompt_ids)])
    return TokenizedPair(prompt_ids, responses[0], responses[1])


def build_pair_batch(pairs: Sequence[TokenizedPair], pad_token_id: int = 0) -> TrainBatch:
    """Rows chosen_0, rejected_0, chosen_1, ...; mask 1 on response tokens."""
    rows = []
    for i, pair in enumerate(pairs):
        for j, (ids, mask) in enumerate(
            ((pair.chosen_ids, pair.chosen_mask), (pair.rejected_ids, pair.rejected_mask))
        ):
            rows.append(
                Trajectory(
                    prompt_id=f"pair{i}",
                    sample_index=j,
                    prompt_token_ids=pair.prompt_ids,
                    token_ids=ids,
                    generation_logprobs=[0.0] * len(ids),
                    truncated=False,
                    loss_mask=mask,
                )
            )
    return build_train_batch(rows, torch.ones(len(rows)), pad_token_id)


def attach_reference_logprobs(backend: PolicyBackend, batch: TrainBatch, mode: str) -> None:
    """Fill `batch.reference_logprobs_NT` by `mode` (module docstring). `precomputed` must
    run before the backend's first step: it scores with the current weights."""
    if mode == "precomputed":
        batch.reference_logprobs_NT = backend.logprobs(batch)
    elif mode == "copy":
        batch.reference_logprobs_NT = backend.logprobs(batch, reference=True)
    elif mode == "none":
        batch.reference_logprobs_NT = None
    else:
        raise ValueError(f"dpo.reference: unknown mode {mode!r}; valid: {REFERENCE_MODES}")


def dpo_step(backend: PolicyBackend, batch: TrainBatch, loss_config: DPOConfig) -> dict[str, float]:
    """One optimizer step on a pair batch (reference logprobs attached, or None for
    reference-free and SimPO): the backend's `train_step`, the same as GRPO's."""
    return backend.train_step(batch, loss_config)


def train_on_pairs(
    backend: PolicyBackend,
    pairs: Sequence[TokenizedPair],
    loss_config: DPOConfig,
    *,
    reference: str = "precomputed",
    pairs_per_step: int = 8,
    epochs: int = 1,
    pad_token_id: int = 0,
) -> list[dict[str, float]]:
    """`epochs` passes over `pairs` in order, `pairs_per_step` pairs per optimizer step; the
    metrics of every step. With `precomputed`, every batch is scored *before* the first
    step, so each pair's reference is the starting weights' (scoring a batch when it comes
    up would use weights already trained on the earlier ones)."""
    if pairs_per_step < 1 or epochs < 1:
        raise ValueError(f"pairs_per_step ({pairs_per_step}) and epochs ({epochs}) must be >= 1")
    batches = [
        build_pair_batch(pairs[start : start + pairs_per_step], pad_token_id)
        for start in range(0, len(pairs), pairs_per_step)
    ]
    if reference != "copy":  # a frozen copy scores each step's batch as it comes
        for batch in batches:
            attach_reference_logprobs(backend, batch, reference)
    steps = []
    for _ in range(epochs):
        for batch in batches:
            if reference == "copy":
                attach_reference_logprobs(backend, batch, reference)
            steps.append(dpo_step(backend, batch, loss_config))
    return steps


@dataclass
class ScoredSample:
    """One sampled response to a prompt as the reward gateway scored it."""

    text: str
    reward: float
    info: dict[str, Any] = field(default_factory=dict)


def pick_pairs(
    samples: Sequence[ScoredSample], max_pairs: int | None = None
) -> list[tuple[int, int]]:
    """(chosen, rejected) indices into one prompt's scored samples: chosen = a `correct`
    verdict (best reward first), rejected = a hallucinated one (`HALLUCINATION_VERDICTS`,
    lowest reward first). Each rejected sample is used once, chosen ones round-robin;
    samples with the same text are used once (the first). No correct or no hallucinated
    sample: no pair (there is nothing to prefer)."""
    first: dict[str, int] = {}
    for index, sample in enumerate(samples):
        first.setdefault(sample.text, index)
    unique = sorted(first.values())
    verdict = {i: samples[i].info.get("verdict") for i in unique}
    chosen = sorted(
        (i for i in unique if verdict[i] == CORRECT_VERDICT), key=lambda i: -samples[i].reward
    )
    rejected = sorted(
        (i for i in unique if verdict[i] in HALLUCINATION_VERDICTS), key=lambda i: samples[i].reward
    )
    if not chosen:
        return []
    return [(chosen[k % len(chosen)], bad) for k, bad in enumerate(rejected[:max_pairs])]


def tool_use_pairs(
    prompt: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    samples: Sequence[ScoredSample | tuple[str, float, dict[str, Any]]],
    max_pairs: int | None = None,
    metadata: dict[str, Any] | None = None,
) -> list[PreferencePair]:
    """Pairs (as preference rows) from one prompt's scored tool-use samples, chosen as
    `pick_pairs` does."""
    scored = [s if isinstance(s, ScoredSample) else ScoredSample(*s) for s in samples]
    return [
        PreferencePair(
            prompt=prompt,
            tools=tools,
            chosen=[{"role": "assistant", "content": scored[good].text}],
            rejected=[{"role": "assistant", "content": scored[bad].text}],
            metadata={
                **(metadata or {}),
                "chosen_reward": scored[good].reward,
                "rejected_reward": scored[bad].reward,
                "rejected_verdict": scored[bad].info.get("verdict"),
            },
        )
        for good, bad in pick_pairs(scored, max_pairs)
    ]
