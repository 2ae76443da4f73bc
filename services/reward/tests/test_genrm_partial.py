"""Two settings for weak judges, pinned on the scripted judge (judge_double.py):
`genrm.score_partial` (a response scored from the comparisons of it that parsed) and
`judge.prefill` (the verdict's opening written for the judge, continued by it)."""

from __future__ import annotations

import json

from judge_double import ScriptedJudge, serve_judge, verdict_by_quality
from rlfleet_reward.environments.genrm_compare import GenRMCompareEnvironment
from rlfleet_reward.judge.client import JudgeClient
from rlfleet_reward.judge.config import GenRMConfig, JudgeConfig
from rlfleet_reward.types import FailureKind, Sample

ENV = GenRMCompareEnvironment()
ROW = {"responses_create_params": {"input": [{"role": "user", "content": "Say hi."}]}}
PREFIX = '{"score_1": '


class Ctx:
    timeout_s = 10.0

    def __init__(self, client: JudgeClient, settings: GenRMConfig) -> None:
        self.client, self.settings = client, settings

    def judge(self) -> JudgeClient:
        return self.client

    def genrm(self) -> GenRMConfig:
        return self.settings


def samples(*qualities: int) -> list[Sample]:
    return [Sample(text=f"answer {k} quality={q}") for k, q in enumerate(qualities)]


async def run(
    judge: ScriptedJudge, group: list[Sample], prefill: bool = False, **genrm: object
) -> list:
    async with serve_judge(judge) as url:
        config = JudgeConfig(base_url=url, cache_size=0, backoff_s=0.01, prefill=prefill)
        client = JudgeClient(config)
        try:
            return await ENV.run_group(ENV.parse_row(ROW), group, Ctx(client, GenRMConfig(**genrm)))
        finally:
            await client.close()


def garbage_when_2_meets_3(text: str) -> str:
    return "???" if "answer 2" in text and "answer 3" in text else verdict_by_quality(text)


async def test_partial_scores_from_the_comparisons_that_parsed() -> None:
    strict = await run(ScriptedJudge(answer=garbage_when_2_meets_3), samples(5, 1, 3, 3))
    assert [r.failed for r in strict] == [False, False, True, True]
    results = await run(
        ScriptedJudge(answer=garbage_when_2_meets_3), samples(5, 1, 3, 3), score_partial=True
    )
    # 2 met 1 (both orders parsed: 3 each time) and 3 (both failed): 3.0 from two verdicts;
    # 3 met 0 (parsed: 3, 3) and 2 (failed): 3.0. 0 and 1 lost nothing: 5 and 1.
    assert [r.reward for r in results] == [5.0, 1.0, 3.0, 3.0]
    assert [r.info["comparisons"] for r in results] == ["4", "4", "2", "2"]
    assert [r.info["comparisons_failed"] for r in results] == ["0", "0", "2", "2"]
    assert len(json.loads(results[2].info["verdicts"])) == 2


async def test_partial_still_fails_a_response_no_comparison_scored() -> None:
    results = await run(
        ScriptedJudge(answer=lambda _: "no verdict"), samples(1, 2), score_partial=True
    )
    for r in results:
        assert r.failure_kind is FailureKind.JUDGE_ERROR and r.mask_sample and r.reward == 0
        assert "2 of 2 judge comparisons failed" in r.failure_reason


async def test_prefill_is_an_opening_the_judge_continues() -> None:
    def continuation(text: str) -> str:  # the judge writes only what follows the prefill
        full = verdict_by_quality(text)
        assert full.startswith(PREFIX)
        return full[len(PREFIX) :]

    judge = ScriptedJudge(answer=continuation)
    results = await run(judge, samples(4, 2), prefill=True, swap_order=False)
    assert [r.reward for r in results] == [4.0, 2.0]
    (request,) = judge.requests
    assert request["messages"][-1] == {"role": "assistant", "content": PREFIX}
    assert request["continue_final_message"] is True
    assert request["add_generation_prompt"] is False


async def test_no_prefix_sends_no_extension_fields() -> None:
    judge = ScriptedJudge()
    await run(judge, samples(4, 2), swap_order=False)
    (request,) = judge.requests
    assert request["messages"][-1]["role"] == "user"
    assert "continue_final_message" not in request and "add_generation_prompt" not in request
