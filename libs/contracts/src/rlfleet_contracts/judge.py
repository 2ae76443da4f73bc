"""The recipe's `judge` section: the LLM judge of a stage's judge environments
(`genrm_compare`), either a model the launcher serves beside the policy (a second rollout
service, `model`) or an OpenAI-compatible endpoint that already runs (`base_url`).

The launcher turns it into the reward gateway's `judge.*` / `genrm.*` settings
(`rlfleet_pipeline.stage.judge_overrides`); the trainer never reads it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator
from rlfleet_core.config import ConfigModel
from rlfleet_core.models import check_model_reference


class JudgeModelConfig(ConfigModel):
    """Where the judge runs and how the gateway asks it. Unset (`model` and `base_url`
    both None): the stage has no judge and starts none."""

    model: str | None = None
    """The judge model, served by a second rollout service the launcher starts (`rlfleet
    rl` locally: service `judge`): a bundled name, a local HF folder or a Hugging Face id.
    With `base_url` set it is only the `model` name sent in each request."""
    engine: Literal["vllm", "hf"] | None = None
    """The judge rollout's engine; None = the stage's (`rlfleet rl --engine`)."""
    max_model_len: int | None = Field(None, ge=16)
    """The judge rollout's `engine_config.max_model_len` (prompt + verdict, in tokens);
    None = the rollout's default (1,024)."""
    base_url: str | None = None
    """An OpenAI-compatible endpoint up to and including `/v1` (`http://host:8000/v1`):
    the gateway asks it and no judge is started."""
    api_key_env: str | None = None
    """With `base_url`: the environment variable holding its API key (the gateway's
    `judge.api_key_env`; the variable must be set where the gateway runs)."""
    temperature: float = Field(0.6, ge=0, le=2)
    """Judge sampling temperature (NeMo-Gym's super3 RLHF GenRM setting)."""
    top_p: float = Field(0.95, gt=0, le=1)
    """Judge nucleus sampling (NeMo-Gym's super3 RLHF GenRM setting)."""
    max_tokens: int = Field(1024, ge=1)
    """Tokens the judge may write per comparison (a reasoning GenRM needs thousands)."""
    request_timeout_s: float = Field(60.0, gt=0, le=3600)
    """Deadline of one judge call (the gateway's `judge.request_timeout_s`)."""
    prefill: bool = False
    """Write the start of each verdict for the judge (the gateway's `judge.prefill`: a
    prefill it continues, through vLLM's `continue_final_message`, which our rollout's
    OpenAI face honours). For small judges that do not begin a verdict on their own."""
    genrm: dict[str, Any] = Field(default_factory=dict)
    """The gateway's `genrm.*` settings (comparison strategy, order swap, prompt format,
    length and style adjustments; services/reward/README.md, "Judge and GenRM").
    Checked by the gateway's own config model at `rlfleet rl --dry-run` and at start."""

    @model_validator(mode="after")
    def _check_model(self) -> JudgeModelConfig:
        if self.model is not None and self.base_url is None:
            check_model_reference(self.model)
        if self.base_url is not None and not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url {self.base_url!r}: expected http(s)://host:port/v1")
        return self

    @property
    def served(self) -> bool:
        """The launcher starts a judge model instance (a model and no external endpoint)."""
        return self.model is not None and self.base_url is None

    @property
    def configured(self) -> bool:
        return self.model is not None or self.base_url is not None
