"""The low-effort schedule, applied as training prompts are issued.

Nemotron 3 Super puts a small share of its RLVR prompts in low-effort mode (2% early, of
math, STEM QA and competitive coding; 1% late, of math and STEM QA). The recipe's
`reasoning.low_effort.phases` say which share from which step; this module decides, for
prompt k of the stream, whether it is a low-effort prompt.

The decision is a pure function of (grpo.seed, k): a uniform draw u_k from a hash of the
two, and the phase in force at the step prompt k belongs to, ⌊k / P⌋ + 1 with P =
grpo.num_prompts_per_step. An eligible prompt (its environment is in the phase's `envs`)
is converted when u_k < fraction / share, share being the eligible rows' part of the data,
so the expected share of all prompts is `fraction`. A resumed run re-issues prompt k with
the same decision, so the ledger's exactly-once accounting still holds.

Why here and not in data prep: the published schedule changes with training progress
(early/late), and the trainer is the one place that knows the step of a prompt; data prep
still offers a fixed share (`--low-effort-fraction`) for a blend of its own.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rlfleet_contracts.reasoning import LOW_EFFORT_ENV, LowEffortConfig, to_low_effort
from rlfleet_contracts.rows import Row, env_of


def uniform_draw(seed: int, index: int) -> float:
    """A number in [0, 1) fixed by (seed, index): the same on every run and resume."""
    digest = hashlib.blake2b(f"low_effort:{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


@dataclass(frozen=True)
class LowEffortSchedule:
    config: LowEffortConfig
    seed: int
    prompts_per_step: int
    probabilities: tuple[float, ...]
    """Per phase: the chance that an eligible prompt is converted."""

    @classmethod
    def build(
        cls,
        config: LowEffortConfig,
        rows: Sequence[dict[str, Any]],
        default_env: str,
        seed: int,
        prompts_per_step: int,
    ) -> LowEffortSchedule:
        """A `ValueError` naming the phase when its `envs` match no row, or when the
        eligible rows are too few to make up its `fraction` of all prompts."""
        envs = [env_of(r) or default_env for r in rows]
        present = sorted(set(envs))
        probabilities = []
        for i, phase in enumerate(config.phases):
            eligible = sum(1 for e in envs if _eligible(e, phase.envs))
            share = eligible / len(envs) if envs else 0.0
            where = f"reasoning.low_effort.phases[{i}]"
            if phase.fraction > 0 and share == 0:
                raise ValueError(
                    f"{where}.envs {phase.envs}: no training row is in these environments "
                    f"(the rows' environments: {', '.join(present)}); fix envs or the data"
                )
            if share and phase.fraction > share + 1e-12:
                raise ValueError(
                    f"{where}.fraction ({phase.fraction}) exceeds the share of training rows "
                    f"in {phase.envs or 'any environment'} ({share:.4f}); lower the fraction "
                    "or widen envs"
                )
            probabilities.append(min(1.0, phase.fraction / share) if share else 0.0)
        return cls(config, seed, prompts_per_step, tuple(probabilities))

    def step_of(self, index: int) -> int:
        return index // self.prompts_per_step + 1

    def converts(self, index: int, env: str) -> bool:
        """Whether prompt `index` (a row of environment `env`) is a low-effort prompt."""
        step = self.step_of(index)
        chosen = None
        for i, phase in enumerate(self.config.phases):
            if phase.from_step <= step:
                chosen = i
        if chosen is None or not _eligible(env, self.config.phases[chosen].envs):
            return False
        return uniform_draw(self.seed, index) < self.probabilities[chosen]

    def apply(self, row: Row, index: int, env: str) -> Row:
        """The row as prompt `index` issues it: in low-effort form when scheduled."""
        if not self.converts(index, env):
            return row
        c = self.config
        return to_low_effort(
            row, c.token_budget, dict(c.chat_template_kwargs), c.length_penalty, inner_env=env
        )


def _eligible(env: str, envs: list[str]) -> bool:
    return env != LOW_EFFORT_ENV and (not envs or env in envs)
