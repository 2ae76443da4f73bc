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


def sampling_from_proto(s: rollout_pb2.SamplingParams, vocab_size: int) -> SamplingConfig:
    if s.max_tokens <= 0:
        raise InvalidArgument("sampling.max_tokens", f"must be > 0, got {s.max_tokens}")
    # NaN passes every comparison, so finiteness is checked first.
    if not math.isfinite(s.temperature) or s.temperature < 0:
        raise InvalidArgument("sampling.temperature", f"must be >= 0, got {s.temperature}")
    if not 0 <= s.top_p <= 1:
        raise InvalidArgument("sampling.top_p", f"must be within [0, 1], got {s.top_p}")
    if s.top_k < -1:
        raise InvalidArgument("sampling.top_k", f"must be -1, 0 (off) or > 0, got {s.top_k}")
    if s.min_tokens < 0 or s.min_tokens > s.max_tokens:
        raise InvalidArgument(
            "sampling.min_tokens",
            f"must be within [0, max_tokens={s.max_tokens}], got {s.min_tokens}",
        )
    if not math.isfinite(s.repetition_penalty) or s.repetition_penalty < 0:
        raise InvalidArgument(
            "sampling.repetition_penalty",
            f"must be >= 0 (0 or 1 = off), got {s.repetition_penalty}",
        )
    if any(not stop for stop in s.stop):
        raise InvalidArgument("sampling.stop", "stop strings must not be empty")
    check_token_ids("sampling.stop_token_ids", s.stop_token_ids, vocab_size)
    return SamplingConfig(
        max_tokens=s.max_tokens,
        temperature=s.temperature,
        top_p=s.top_p if 0 < s.top_p <= 1 else 1.0,
        top_k=s.top_k if s.top_k > 0 else -1,
        min_tokens=s.min_tokens,
        stop=tuple(s.stop),
        stop_token_ids=tuple(s.stop_token_ids),
        ignore_eos=s.ignore_eos,
        seed=s.seed if s.HasField("seed") else None,
        repetition_penalty=s.repetition_penalty if s.repetition_penalty > 0 else 1.0,
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
