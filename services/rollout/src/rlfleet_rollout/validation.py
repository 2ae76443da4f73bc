"""Proto requests → domain types, refusing bad input with INVALID_ARGUMENT naming the field.

Checked here, once, for every engine: an engine never sees an empty prompt, an id
outside the vocabulary or a non-positive `max_tokens` (vLLM would reject some of these
deep inside with a less helpful message; the hf engine would index out of range).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence

from rlfleet_core.errors import InvalidArgument
from rlfleet_proto.v1 import rollout_pb2

from rlfleet_rollout.types import GenerateInput, SamplingConfig


def check_token_ids(field: str, ids: Sequence[int], vocab_size: int) -> None:
    for pos, token in enumerate(ids):
        if not 0 <= token < vocab_size:
            raise InvalidArgument(
                field,
                f"token id {token} at position {pos} is outside the vocabulary [0, {vocab_size})",
            )


def check_prompt(ids: Sequence[int], vocab_size: int, max_model_len: int, field: str) -> None:
    if not ids:
        raise InvalidArgument(field, "must not be empty (send the token ids of the prompt)")
    check_token_ids(field, ids, vocab_size)
    if len(ids) >= max_model_len:
        raise InvalidArgument(
            field,
            f"{len(ids)} tokens leave no room to generate within max_model_len {max_model_len}",
        )


MIN_TEMPERATURE = 1e-2
"""A positive temperature below this is raised to it, as vLLM does (its `_MAX_TEMP`):
logits divided by a tinier one overflow float32 to inf, and the softmax turns to NaN."""
MAX_TEMPERATURE = 1e3
MAX_REPETITION_PENALTY = 1e3
"""Far above any useful value and far inside float32: a larger one (a JSON double such as
1e300 becomes inf in float32) turns logits into inf, 0 * inf and so NaN."""
SEED_RANGE = (-(1 << 63), (1 << 63) - 1)
"""vLLM's (int64); torch's generators overflow beyond 2**64."""


def _finite_within(field: str, value: float, low: float, high: float, what: str) -> None:
    # NaN passes every comparison, so finiteness is checked first.
    if not isinstance(value, int | float) or not math.isfinite(value) or not low <= value <= high:
        raise InvalidArgument(field, f"must be {what}, got {value}")


def checked_sampling(
    prefix: str,
    *,
    max_tokens: int,
    temperature: float,
    top_p: float,
    top_k: int,
    min_tokens: int,
    repetition_penalty: float,
    stop: tuple[str, ...] = (),
    stop_token_ids: tuple[int, ...] = (),
    ignore_eos: bool = False,
    seed: int | None = None,
    top_logprobs: int = 0,
) -> SamplingConfig:
    """The one check of sampling values for every face (gRPC: prefix "sampling.", HTTP:
    ""): each refusal names the field; 0 means "off" for top_p, top_k and the penalty."""
    if max_tokens <= 0:
        raise InvalidArgument(f"{prefix}max_tokens", f"must be > 0, got {max_tokens}")
    _finite_within(
        f"{prefix}temperature",
        temperature,
        0.0,
        MAX_TEMPERATURE,
        f"within [0, {MAX_TEMPERATURE:g}] (0 = greedy)",
    )
    _finite_within(f"{prefix}top_p", top_p, 0.0, 1.0, "within [0, 1]")
    if top_k < -1:
        raise InvalidArgument(f"{prefix}top_k", f"must be -1, 0 (off) or > 0, got {top_k}")
    if min_tokens < 0 or min_tokens > max_tokens:
        raise InvalidArgument(
            f"{prefix}min_tokens",
            f"must be within [0, max_tokens={max_tokens}], got {min_tokens}",
        )
    _finite_within(
        f"{prefix}repetition_penalty",
        repetition_penalty,
        0.0,
        MAX_REPETITION_PENALTY,
        f"within [0, {MAX_REPETITION_PENALTY:g}] (0 or 1 = off)",
    )
    if seed is not None and not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise InvalidArgument(f"{prefix}seed", f"must be a 64-bit signed integer, got {seed}")
    if any(not s for s in stop):
        raise InvalidArgument(f"{prefix}stop", "stop strings must not be empty")
    return SamplingConfig(
        max_tokens=max_tokens,
        temperature=max(temperature, MIN_TEMPERATURE) if temperature > 0 else 0.0,
        top_p=top_p if 0 < top_p <= 1 else 1.0,
        top_k=top_k if top_k > 0 else -1,
        min_tokens=min_tokens,
        stop=stop,
        stop_token_ids=stop_token_ids,
        ignore_eos=ignore_eos,
        seed=seed,
        repetition_penalty=repetition_penalty if repetition_penalty > 0 else 1.0,
        top_logprobs=top_logprobs,
    )


def sampling_from_proto(s: rollout_pb2.SamplingParams, vocab_size: int) -> SamplingConfig:
    check_token_ids("sampling.stop_token_ids", s.stop_token_ids, vocab_size)
    return checked_sampling(
        "sampling.",
        max_tokens=s.max_tokens,
        temperature=s.temperature,
        top_p=s.top_p,
        top_k=s.top_k,
        min_tokens=s.min_tokens,
        repetition_penalty=s.repetition_penalty,
        stop=tuple(s.stop),
        stop_token_ids=tuple(s.stop_token_ids),
        ignore_eos=s.ignore_eos,
        seed=s.seed if s.HasField("seed") else None,
    )


def generate_input_from_proto(
    request: rollout_pb2.GenerateRequest,
    *,
    vocab_size: int,
    max_model_len: int,
    max_samples: int,
) -> GenerateInput:
    if not 1 <= request.n <= max_samples:
        raise InvalidArgument("n", f"must be within [1, {max_samples}], got {request.n}")
    check_prompt(request.prompt_token_ids, vocab_size, max_model_len, "prompt_token_ids")
    return GenerateInput(
        request_id=request.request_id or uuid.uuid4().hex,
        prompt_token_ids=tuple(request.prompt_token_ids),
        n=request.n,
        sampling=sampling_from_proto(request.sampling, vocab_size),
        return_text=request.return_text,
    )
