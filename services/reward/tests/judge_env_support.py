"""The RunContext the judge-environment unit tests lend (scoring `verify` in-process)
and a helper that scores one response against a scripted judge (judge_double.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from judge_double import ScriptedJudge, serve_judge
from rlfleet_reward.environments import get_environment
from rlfleet_reward.judge.client import JudgeClient
from rlfleet_reward.judge.config import JudgeConfig
from rlfleet_reward.types import Sample, Score

TOOL_ENV = "single_step_tool_use_with_argument_comparison"


@dataclass
class Ctx:
    """RunContext as the gateway lends it, scoring `verify` in-process."""

    client: JudgeClient | None
    timeout_s: float = 10.0

    def judge(self) -> JudgeClient | None:
        return self.client

    async def verify(self, env: str, spec: Any, sample: Sample) -> Score:
        return get_environment(env).score(spec, sample)


async def score(
    env: str,
    row: dict[str, Any],
    sample: Sample | str,
    answer: Callable[[str], str] | None,
    prefill: bool = False,
) -> tuple[Score, ScriptedJudge]:
    """`env`'s Score of `sample` on `row`, the judge answering `answer(chat text)` (None:
    no judge configured)."""
    sample = Sample(sample) if isinstance(sample, str) else sample
    environment = get_environment(env)
    spec = environment.parse_row(row)
    judge = ScriptedJudge(answer=answer or (lambda _: ""))
    if answer is None:
        return await environment.run(spec, sample, Ctx(None)), judge  # type: ignore[arg-type]
    async with serve_judge(judge) as url:
        client = JudgeClient(
            JudgeConfig(base_url=url, cache_size=0, backoff_s=0.01, prefill=prefill)
        )
        try:
            return await environment.run(spec, sample, Ctx(client)), judge  # type: ignore[arg-type]
        finally:
            await client.close()
