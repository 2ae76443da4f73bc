"""Settings of the judge client (`judge.*`) and of the `genrm_compare` environment
(`genrm.*`); documented in the service README ("Judge and GenRM")."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import Field, model_validator
from rlfleet_core.config import ConfigModel

# Our own wording of the RL-BFF idea: the judge weighs the responses against stated
# principles. `general` plays the part of NeMo-Gym genrm_compare's `default_principle`.
DEFAULT_PRINCIPLES: dict[str, str] = {
    "general": (
        "Judge which response better serves the user. Work out your own answer first and "
        "check both responses against it: correct mistakes, reward responses that are "
        "helpful (they do what was asked), relevant (every part bears on the request) and "
        "concise (no padding). Where the request is ambiguous, asking for clarification is "
        "better than guessing. Note important information a response leaves out."
    ),
    "math": (
        "The final answer must be correct; the derivation must be valid and easy to "
        "follow. A correct answer with a short clear argument beats a long one."
    ),
    "code": (
        "The code must be correct, runnable and solve the stated task, including edge "
        "cases; explanations should be brief and accurate."
    ),
    "safety": (
        "Refuse clearly harmful requests briefly and without lecturing; comply fully with "
        "safe requests, even ones that merely sound sensitive (no over-refusal)."
    ),
}


class JudgeConfig(ConfigModel):
    """The OpenAI-compatible judge (`judge.*`): a second rollout service's HTTP face
    (`/v1/chat/completions`) or any OpenAI-compatible endpoint."""

    base_url: str | None = None
    """Base URL up to and including `/v1`, e.g. `http://127.0.0.1:8052/v1`; None = no
    judge (judge environments answer JUDGE_ERROR)."""
    model: str = ""
    """`model` sent with each request ("" = the endpoint's default, as our rollout allows)."""
    api_key_env: str | None = None
    """Name of the environment variable holding the API key (sent as a Bearer token);
    None = no Authorization header."""
    fleet_token: bool = False
    """Send the fleet's shared token (RLFLEET_AUTH_TOKEN_FILE / RLFLEET_AUTH_TOKEN, as the
    gateway's own services use) as the Bearer token: for a judge that is a rollout service
    of the same fleet, which requires it (`rlfleet rl` sets this for the judge it starts).
    Never for an outside endpoint, which would learn the token; not with `api_key_env`."""
    request_timeout_s: float = Field(60.0, gt=0, le=3600)
    """Deadline of one HTTP attempt; the environment's budget lowers it."""
    connect_timeout_s: float = Field(5.0, gt=0, le=120)
    """Deadline of opening a connection (within `request_timeout_s`)."""
    max_retries: int = Field(2, ge=0, le=10)
    """Further attempts after a connection error, HTTP 5xx or 429 (never after another
    4xx, a malformed body or a timeout), with exponential backoff, within the budget."""
    backoff_s: float = Field(0.25, ge=0, le=30)
    """First backoff; each retry doubles it (with up to 50% random jitter)."""
    max_concurrency: int = Field(64, ge=1, le=4096)
    """Judge requests in flight at once from this gateway (all environments)."""
    cache_size: int = Field(4096, ge=0)
    """Judge answers kept, keyed by (model, messages, sampling params); 0 = no cache."""
    max_tokens: int = Field(1024, ge=1)
    """`max_tokens` of each judge call (NeMo-Gym's GenRM uses 16384: it reasons first)."""
    temperature: float = Field(0.6, ge=0, le=2)
    """Sampling temperature (NeMo-Gym's super3 RLHF GenRM setting)."""
    top_p: float = Field(0.95, gt=0, le=1)
    """Nucleus sampling (NeMo-Gym's super3 RLHF GenRM setting)."""
    seed: int | None = None
    """Sent as `seed` when set (reproducible sampling, where the endpoint honours it)."""
    prefill: bool = False
    """Write the start of each verdict for the judge, which continues it: the environment's
    opening (`genrm_compare`: `{"score_1": `; the label environments: `[[`) is sent as a
    last assistant message with `continue_final_message: true`, `add_generation_prompt:
    false` (vLLM's chat extension, which our rollout's OpenAI face honours; other endpoints
    may not) and parsed with the answer. For small judges that do not begin a verdict on
    their own; not for judges that reason first."""
    max_answer_chars: int = Field(1 << 20, ge=1024)
    """Largest judge reply body read; a bigger one is a failure, not a memory spike."""

    @model_validator(mode="after")
    def _key_is_set(self) -> JudgeConfig:
        if self.fleet_token and self.api_key_env:
            raise ValueError("fleet_token and api_key_env are exclusive: one Bearer token")
        # Checked at start-up, not at the first judge call hours into a run.
        if self.base_url and self.api_key_env and not os.environ.get(self.api_key_env):
            raise ValueError(
                f"api_key_env names {self.api_key_env}, which is not set in the environment"
            )
        return self


class GenRMConfig(ConfigModel):
    """The `genrm_compare` environment (`genrm.*`): pairwise GenRM comparison of a group.
    The arithmetic follows NeMo-Gym's resources_servers/genrm_compare/utils.py; defaults are
    its own (all adjustments off), super3's RLHF values are in the README."""

    comparison_strategy: Literal["circular", "all_pairs"] = "circular"
    """`circular`: i vs i+1 mod N (N pairs); `all_pairs`: N(N-1)/2 pairs. A row's
    `comparison_strategy` overrides it."""
    max_judge_calls_per_group: int = Field(4096, ge=1, le=1_000_000)
    """Most judge calls one ScoreGroup may need (pairs, times 2 with `swap_order`); a group
    that needs more is refused (INVALID_ARGUMENT naming this key) before any call, since
    `all_pairs` grows as N^2 (1,024 responses: 1,047,552 calls). circular needs N or 2N."""
    swap_order: bool = True
    """Judge each pair in both orders (2 calls a pair) so position bias cancels."""
    score_partial: bool = False
    """False: a response with any failed comparison fails (JUDGE_ERROR, with the reasons).
    True: it is scored from those of its comparisons that succeeded, when at least one did
    (`info.comparisons_failed` counts the rest); for weak judges whose verdicts often fail
    to parse. Position bias then cancels only where both orders of a pair succeeded."""
    prompt_format: Literal["text", "roles"] = "text"
    """`text`: one instruction + user message any chat model reads; `roles`: the Nemotron
    GenRM chat template's `principle` / `response_1` / `response_2` messages."""
    use_principle: bool = True
    """Send a principle (the row's `principles`, else `principles[domain]`)."""
    principles: dict[str, str] = Field(default_factory=lambda: dict(DEFAULT_PRINCIPLES))
    """Default principle per domain (row `domain`; `general` when the row names none)."""
    reasoning_bonus: float = Field(0.0, ge=0)
    """Added to the response with the shortest non-empty reasoning if it is a top scorer."""
    answer_bonus: float = Field(0.0, ge=0)
    """Added to the response with the shortest non-empty answer if it is a top scorer."""
    top_percentile: float = Field(0.2, gt=0, le=1)
    """Share of the group counted as top scorers for the two bonuses."""
    group_reasoning_length_penalty_coeff: float = Field(0.0, ge=0)
    """Weight of the zero-centred group-relative reasoning-length adjustment."""
    group_answer_length_penalty_coeff: float = Field(0.0, ge=0)
    """Weight of the zero-centred group-relative answer-length adjustment."""
    group_style_penalty_coeff: float = Field(0.0, ge=0)
    """Weight of the zero-centred style-density adjustment (headers, lists, bold, emoji)."""

    @model_validator(mode="after")
    def _general_principle(self) -> GenRMConfig:
        if self.use_principle and "general" not in self.principles:
            raise ValueError("principles must define `general` (used when a row names no domain)")
        return self
