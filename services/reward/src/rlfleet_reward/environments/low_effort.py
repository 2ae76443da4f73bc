"""`low_effort`: another environment's reward, discounted by generated length.

For the low-effort reasoning mode: a correct answer reached with fewer tokens earns
more. With c the wrapped environment's reward, n the generated tokens and B the budget:

    reward = c - λ · c · min(1, n / B)

so a wrong answer stays 0 (length never rewards being wrong) and a correct answer earns
between 1 - λ (at or past the budget) and 1 (no tokens). Components: the wrapped
environment's components (prefixed `inner:`) plus `length_penalty` (≤ 0); they sum to
the reward. A failure of the wrapped environment is passed through unchanged.

Row fields: the wrapped environment's fields, plus
- `inner_env` (required): the environment to wrap (any but `low_effort`).
- `token_budget` (optional, default 2048): B, in tokens (> 0).
- `length_penalty` (optional, default 0.5): λ, within [0, 1].
The response must carry `num_tokens` (> 0); without it length cannot be judged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from rlfleet_reward.environments.base import Environment, RunContext, optional_number, require_str
from rlfleet_reward.types import RowError, Sample, Score, scored


@dataclass(frozen=True)
class LowEffortSpec:
    inner_env: str
    inner_spec: Any
    token_budget: float
    length_penalty: float


def length_discount(
    correctness: float, num_tokens: int, token_budget: float, weight: float
) -> float:
    """The (negative) length component: -λ · c · min(1, n / B)."""
    return -weight * correctness * min(1.0, num_tokens / token_budget)


class LowEffortEnvironment(Environment):
    name: ClassVar[str] = "low_effort"
    description: ClassVar[str] = (
        "Wraps another environment; correct answers are discounted by generated token count."
    )
    required_fields: ClassVar[tuple[str, ...]] = ("inner_env",)
    optional_fields: ClassVar[tuple[str, ...]] = ("token_budget", "length_penalty")
    needs_num_tokens: ClassVar[bool] = True

    def parse_row(self, row: Mapping[str, Any]) -> LowEffortSpec:
        from rlfleet_reward.environments import ENVIRONMENT_NAMES, get_environment

        inner = require_str(row, "inner_env")
        if inner == self.name or inner not in ENVIRONMENT_NAMES:
            valid = ", ".join(n for n in ENVIRONMENT_NAMES if n != self.name)
            raise RowError(
                "inner_env", f"must name an environment to wrap ({valid}); got {inner!r}"
            )
        return LowEffortSpec(
            inner_env=inner,
            inner_spec=get_environment(inner).parse_row(row),
            token_budget=optional_number(row, "token_budget", 2048.0, low=1.0),
            length_penalty=optional_number(row, "length_penalty", 0.5, low=0.0, high=1.0),
        )

    async def run(self, spec: LowEffortSpec, sample: Sample, ctx: RunContext) -> Score:
        inner = await ctx.run_env(spec.inner_env, spec.inner_spec, sample)
        if inner.failed:
            return inner
        components = {f"inner:{k}": v for k, v in inner.components.items()}
        components["length_penalty"] = length_discount(
            inner.reward, sample.num_tokens, spec.token_budget, spec.length_penalty
        )
        return scored(
            components,
            **inner.info,
            inner_env=spec.inner_env,
            num_tokens=sample.num_tokens,
            inner_reward=inner.reward,
        )
