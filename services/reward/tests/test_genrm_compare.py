"""genrm_compare and the judge client, pinned on hand-worked examples.

The judge here is a scripted double served over real HTTP (judge_double.py): the issue
allows one only for the arithmetic. Every expected number below is worked by hand (and
was cross-checked once against NeMo-Gym's genrm_compare/utils.py functions). The real
judge (SmolLM2 behind the rollout service) is tests/test_genrm_judge_services.py."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import pytest
from judge_double import ScriptedJudge, serve_judge
from rlfleet_reward.environments.genrm_compare import GenRMCompareEnvironment, GenRMSpec
from rlfleet_reward.judge.client import JudgeClient, JudgeError
from rlfleet_reward.judge.config import GenRMConfig, JudgeConfig
from rlfleet_reward.judge.genrm import (
    Adjustments,
    Comparison,
    Verdict,
    VerdictError,
    aggregate,
    comparison_pairs,
    length_adjustments,
    parse_verdict,
    style_adjustments,
    style_density,
)
from rlfleet_reward.types import FailureKind, RowError, Sample

ENV = GenRMCompareEnvironment()
ROW = {"responses_create_params": {"input": [{"role": "user", "content": "Say hi."}]}}


@dataclass
class Ctx:
    client: JudgeClient | None
    settings: GenRMConfig
    timeout_s: float = 10.0

    def judge(self) -> JudgeClient | None:
        return self.client

    def genrm(self) -> GenRMConfig:
        return self.settings


def samples(*qualities: int, reasoning: tuple[str, ...] = ()) -> list[Sample]:
    return [
        Sample(text=f"answer {k} quality={q}", reasoning_text=reasoning[k] if reasoning else "")
        for k, q in enumerate(qualities)
    ]


async def run(
    judge: ScriptedJudge, group: list[Sample], row: dict | None = None, **genrm: object
) -> list:
    async with serve_judge(judge) as url:
        client = JudgeClient(JudgeConfig(base_url=url, cache_size=0, backoff_s=0.01))
        try:
            spec = ENV.parse_row(row or ROW)
            return await ENV.run_group(spec, group, Ctx(client, GenRMConfig(**genrm)))
        finally:
            await client.close()


# --- pairs and call counts -------------------------------------------------------------


def test_pairs_circular_and_all_pairs() -> None:
    assert comparison_pairs("circular", 4) == [(0, 1), (1, 2), (2, 3), (3, 0)]
    assert len(comparison_pairs("circular", 8)) == 8
    assert comparison_pairs("all_pairs", 4) == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    assert len(comparison_pairs("all_pairs", 8)) == 28
    assert comparison_pairs("circular", 2) == [(0, 1)]  # not the same pair twice
    with pytest.raises(ValueError, match="at least 2"):
        comparison_pairs("circular", 1)


@pytest.mark.parametrize(
    ("strategy", "swap", "calls"),
    [
        ("circular", True, 2 * 6),
        ("circular", False, 6),
        ("all_pairs", True, 2 * 15),
        ("all_pairs", False, 15),
    ],
)
async def test_calls_counted_at_the_judge(strategy: str, swap: bool, calls: int) -> None:
    judge = ScriptedJudge()
    results = await run(
        judge, samples(5, 4, 3, 2, 1, 1), comparison_strategy=strategy, swap_order=swap
    )
    assert len(judge.requests) == calls
    assert all(not r.failed for r in results)
    # each call shows exactly two responses
    assert all(r["messages"][1]["content"].count("quality=") == 2 for r in judge.requests)


async def test_row_strategy_overrides_config() -> None:
    judge = ScriptedJudge()
    await run(judge, samples(1, 2, 3, 4), {**ROW, "comparison_strategy": "all_pairs"})
    assert len(judge.requests) == 2 * 6


# --- aggregation, ties, order swap ------------------------------------------------------


async def test_order_swap_cancels_position_bias_on_ties() -> None:
    # Qualities [4, 2, 2], circular: pairs (0,1) (1,2) (2,0), each judged both ways.
    # The judge ties 1 and 2 but ranks whichever it sees first "slightly better" (3), so the
    # tiebreaker moves the first up 0.5 and the second down 0.5 (3.5 - 3):
    #   0: 4,4,4,4 -> 4;  1: 2,2,(2.5 first),(1.5 second) -> 2;  2: 1.5,2.5,2,2 -> 2.
    results = await run(ScriptedJudge(), samples(4, 2, 2))
    assert [r.reward for r in results] == [4.0, 2.0, 2.0]
    assert [r.components for r in results] == [{"genrm": 4.0}, {"genrm": 2.0}, {"genrm": 2.0}]
    assert results[1].info["comparisons"] == "4" and results[1].info["group_tiebreaks"] == "2"
    # One order only: the bias stays. 1 saw (1,2) first: (2 + 2.5)/2; 2: (1.5 + 2)/2.
    one_way = await run(ScriptedJudge(), samples(4, 2, 2), swap_order=False)
    assert [r.reward for r in one_way] == [4.0, 2.25, 1.75]


def test_tie_broken_by_ranking() -> None:
    # A tie at 3 with ranking 1 (first much better): first 3 + 2.5, second 3 - 2.5.
    base, ties = aggregate([Comparison(0, 1, Verdict(3, 3, 1))], 2)
    assert (base, ties) == ([5.5, 0.5], 1)
    # A tie with ranking 3.5 (no preference): unchanged. No comparisons: None.
    assert aggregate([Comparison(0, 1, Verdict(3, 3, 3.5))], 3) == ([3.0, 3.0, None], 1)
    # Not a tie: the ranking is ignored.
    assert aggregate([Comparison(1, 0, Verdict(5, 2, 6))], 2) == ([2.0, 5.0], 0)


# --- length and style adjustments ------------------------------------------------------


def test_length_adjustments_by_hand() -> None:
    # Scores [4, 3, 3, 2]; answer lengths 10/20/30/40; reasoning lengths 0/5/5/8.
    # Top 20% of 4 -> k = max(1, int(0.8)) = 1: threshold 4.
    # Answer bonus 0.5: shortest answer is 0 (score 4 >= 4) -> +0.5.
    # Reasoning bonus 0.5: shortest non-empty is 1 (5 chars, first of two), score 3 < 4 -> none.
    # Answer weights: 1-(L-10)/30 = [1, 2/3, 1/3, 0], minus mean 0.5, times 0.35.
    # Reasoning weights: 1-L/8 = [1, .375, .375, 0], minus mean .4375, times 0.3.
    cfg = Adjustments(0.5, 0.5, 0.2, 0.3, 0.35)
    got = length_adjustments(
        [4, 3, 3, 2], ["", "x" * 5, "y" * 5, "z" * 8], ["a" * n for n in (10, 20, 30, 40)], cfg
    )
    want = [
        0.5 + 0.5 * 0.35 + 0.5625 * 0.3,
        (1 / 6) * 0.35 - 0.0625 * 0.3,
        -(1 / 6) * 0.35 - 0.0625 * 0.3,
        -0.5 * 0.35 - 0.4375 * 0.3,
    ]
    assert got == pytest.approx(want)
    assert sum(got) == pytest.approx(0.5)  # the group terms are zero-centred; the bonus is not


def test_length_adjustments_equal_lengths_and_stripping() -> None:
    cfg = Adjustments(group_answer_length_penalty_coeff=1.0)
    assert length_adjustments([1, 2], ["", ""], ["abc", "  abc\n"], cfg) == [0.0, 0.0]


def test_style_density_and_penalty_by_hand() -> None:
    styled = "# Title\n- a\n- b\n**bold** \U0001f600 x\n```\n# not counted\n- nor this\n```"
    # header, 2 bullets, bold, emoji = 5 elements over the 28 characters (stripped) outside
    # the code block: "# Title" 7 + "- a" 3 + "- b" 3 + "**bold** 😀 x" 12 + 3 newlines
    assert style_density(styled) == pytest.approx(5 / 28)
    assert style_density("plain") == 0.0 and style_density("   ") == 0.0
    # densities [5/28, 0]: weights [0, 1] - 0.5 -> [-0.5, 0.5], times 0.1
    assert style_adjustments([styled, "plain"], 0.1) == pytest.approx([-0.05, 0.05])


async def test_adjustments_are_reward_components() -> None:
    group = samples(5, 5, 1)
    group[1] = Sample(text=group[1].text + " and then a much longer tail of words")
    results = await run(ScriptedJudge(), group, group_answer_length_penalty_coeff=0.3)
    for r in results:
        assert set(r.components) == {"genrm", "length_adjustment"}
        assert r.reward == pytest.approx(sum(r.components.values()))
    assert sum(r.components["length_adjustment"] for r in results) == pytest.approx(0.0)
    assert results[0].reward > results[1].reward  # same judge score, the shorter wins


# --- the verdict: strict parsing ------------------------------------------------------


def test_parse_verdict_accepts_the_seed_format() -> None:
    assert parse_verdict('{"score_1": 4, "score_2": 2, "ranking": 2}') == Verdict(4, 2, 2)
    text = 'Thinking.\n```json\n{"score_1": 1, "score_2": 5.0, "ranking": 6}\n```'
    assert parse_verdict(text) == Verdict(1, 5, 6)
    # reasoning skipped; the last object with the keys wins
    text = '<think>{"score_1": 1, "score_2": 1, "ranking": 1}</think> {"a": 1} ' + (
        '{"score_1": 3, "score_2": 4, "ranking": 4}'
    )
    assert parse_verdict(text) == Verdict(3, 4, 4)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("Response 1 is better.", "no JSON object"),
        ('{"score_1": 4, "score_2": 2}', "ranking must be a number"),
        ('{"score_1": 9, "score_2": 2, "ranking": 2}', "score_1 must be within [1, 5]"),
        ('{"score_1": 4, "score_2": 2, "ranking": 0}', "ranking must be within [1, 6]"),
        ('{"score_1": true, "score_2": 2, "ranking": 2}', "score_1 must be a number"),
        ('{"score_1": "4", "score_2": 2, "ranking": 2}', "score_1 must be a number"),
        ('<think>{"score_1": 4, "score_2": 2, "ranking": 2}', "reasoning never ended"),
    ],
)
def test_parse_verdict_is_strict(text: str, reason: str) -> None:
    with pytest.raises(VerdictError, match=reason.replace("[", r"\[")):
        parse_verdict(text)


# --- failures: never a default score -----------------------------------------------------


async def test_garbage_judge_fails_every_response_with_reasons() -> None:
    judge = ScriptedJudge(answer=lambda _: "Both are fine, I like the first one.")
    results = await run(judge, samples(1, 2, 3))
    assert len(judge.requests) == 6
    for r in results:
        assert r.failure_kind is FailureKind.JUDGE_ERROR and r.mask_sample and r.reward == 0
        assert "4 of 4 judge comparisons failed" in r.failure_reason
        assert "not a verdict: no JSON object" in r.failure_reason


async def test_one_bad_comparison_fails_only_its_two_responses() -> None:
    def answer(text: str) -> str:  # garbage whenever responses 2 and 3 meet
        return "???" if "answer 2" in text and "answer 3" in text else verdict_like(text)

    from judge_double import verdict_by_quality as verdict_like

    results = await run(ScriptedJudge(answer=answer), samples(5, 1, 3, 3))
    assert [r.failed for r in results] == [False, False, True, True]
    assert "2 of 4 judge comparisons failed: 2 vs 3" in results[2].failure_reason
    # 0 met 1 and 3 (all parsed): 5 in all four; 1 met 0 and 2: 1 in all four
    assert [results[0].reward, results[1].reward] == [5.0, 1.0]


async def test_no_judge_configured() -> None:
    spec = ENV.parse_row(ROW)
    results = await ENV.run_group(spec, samples(1, 2), Ctx(None, GenRMConfig()))
    assert all("judge.base_url" in r.failure_reason for r in results)


# --- principles and prompts ------------------------------------------------------------


async def test_principles_from_row_else_domain_default() -> None:
    judge = ScriptedJudge()
    await run(judge, samples(1, 2), {**ROW, "principles": ["Be brief.", "Be kind."]})
    assert "- Be brief.\n- Be kind." in judge.requests[0]["messages"][1]["content"]
    judge = ScriptedJudge()
    await run(judge, samples(1, 2), {**ROW, "domain": "math"})
    assert GenRMConfig().principles["math"] in judge.requests[0]["messages"][1]["content"]
    results = await run(ScriptedJudge(), samples(1, 2), {**ROW, "domain": "poetry"})
    assert results[0].failure_kind is FailureKind.INVALID_ROW
    assert "row.domain" in results[0].failure_reason


async def test_roles_format_is_the_genrm_template_shape() -> None:
    judge = ScriptedJudge()
    await run(judge, samples(1, 2), prompt_format="roles")
    roles = [m["role"] for m in judge.requests[0]["messages"]]
    assert roles == ["user", "principle", "response_1", "response_2"]


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ({}, "responses_create_params.input"),
        (
            {"responses_create_params": {"input": [{"content": "x"}]}},
            "responses_create_params.input[0]",
        ),
        ({**ROW, "principles": []}, "principles"),
        ({**ROW, "principles": ["ok", ""]}, "principles[1]"),
        ({**ROW, "comparison_strategy": "swiss"}, "comparison_strategy"),
    ],
)
def test_bad_rows_name_the_field(row: dict, field: str) -> None:
    with pytest.raises(RowError) as caught:
        ENV.parse_row(row)
    assert caught.value.field == field


# --- the client: retries, deadlines, cache -------------------------------------------------


async def chat_once(judge: ScriptedJudge, timeout_s: float = 5.0, **cfg: object) -> tuple:
    async with serve_judge(judge) as url:
        client = JudgeClient(JudgeConfig(base_url=url, backoff_s=0.01, **cfg))
        try:
            try:
                return await client.chat([{"role": "user", "content": "x"}], timeout_s, str), None
            except JudgeError as exc:
                return None, str(exc)
        finally:
            await client.close()


async def test_retries_5xx_and_429_not_4xx() -> None:
    judge = ScriptedJudge(answer=lambda _: "fine", statuses=[503, 429])
    assert await chat_once(judge) == ("fine", None)
    assert len(judge.requests) == 3
    judge = ScriptedJudge(statuses=[400])
    answer, error = await chat_once(judge)
    assert answer is None and "HTTP 400" in error and len(judge.requests) == 1
    judge = ScriptedJudge(statuses=[500, 500, 500])
    _, error = await chat_once(judge, max_retries=2)
    assert "HTTP 500" in error and "after 3 attempts" in error and len(judge.requests) == 3


async def test_hanging_judge_fails_within_the_deadline() -> None:
    start = time.monotonic()
    answer, error = await chat_once(ScriptedJudge(hang=True), timeout_s=0.5)
    assert answer is None and "did not answer within" in error
    assert time.monotonic() - start < 3


async def test_unreachable_judge_is_retried_then_named() -> None:
    client = JudgeClient(JudgeConfig(base_url="http://127.0.0.1:9/v1", backoff_s=0.01))
    try:
        with pytest.raises(JudgeError, match=r"cannot reach the judge.*after 3 attempts"):
            await client.chat([{"role": "user", "content": "x"}], 5.0, str)
        assert client.calls == 3
    finally:
        await client.close()


async def test_cache_keyed_by_messages_and_sampling() -> None:
    judge = ScriptedJudge(answer=lambda _: "ok")
    async with serve_judge(judge) as url:
        client = JudgeClient(JudgeConfig(base_url=url, cache_size=2))
        other = JudgeClient(JudgeConfig(base_url=url, cache_size=2, temperature=0.0))
        try:
            hi = [{"role": "user", "content": "hi"}]
            await asyncio.gather(client.chat(hi, 5, str), other.chat(hi, 5, str))
            await client.chat(hi, 5, str)  # a hit
            await client.chat([{"role": "user", "content": "ho"}], 5, str)
            assert len(judge.requests) == 3
        finally:
            await client.close()
            await other.close()


def test_config_refuses_missing_key_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLFLEET_TEST_JUDGE_KEY", raising=False)
    with pytest.raises(ValueError, match="api_key_env names RLFLEET_TEST_JUDGE_KEY"):
        JudgeConfig(base_url="http://x/v1", api_key_env="RLFLEET_TEST_JUDGE_KEY")


async def test_api_key_is_sent_as_bearer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLFLEET_TEST_JUDGE_KEY", "k-123")
    judge = ScriptedJudge(answer=lambda _: "ok")
    assert await chat_once(judge, api_key_env="RLFLEET_TEST_JUDGE_KEY") == ("ok", None)
    assert judge.authorization == ["Bearer k-123"]


def test_spec_is_plain() -> None:
    spec = ENV.parse_row({**ROW, "principles": "One."})
    assert spec == GenRMSpec((("user", "Say hi."),), "One.", "general", None)


async def test_a_retried_group_asks_again_only_what_failed() -> None:
    # The trainer resends a group whose scores failed; cached verdicts are not asked again.
    from judge_double import verdict_by_quality

    garbled: list[str] = []

    def answer(text: str) -> str:
        if "answer 2" in text and "answer 0" in text and not garbled:
            garbled.append(text)
            return "no verdict"
        return verdict_by_quality(text)

    judge = ScriptedJudge(answer=answer)
    async with serve_judge(judge) as url:
        client = JudgeClient(JudgeConfig(base_url=url))
        ctx = Ctx(client, GenRMConfig())
        spec = ENV.parse_row(ROW)
        try:
            first = await ENV.run_group(spec, samples(3, 2, 1), ctx)
            assert [r.failed for r in first] == [True, False, True] and len(judge.requests) == 6
            again = await ENV.run_group(spec, samples(3, 2, 1), ctx)
        finally:
            await client.close()
    assert len(judge.requests) == 7  # only the garbled comparison went to the judge again
    assert [r.reward for r in again] == [3.0, 2.0, 1.0]
    # What each result tells the trainer the group asked the judge (its GenRM throughput):
    # failed and scored responses alike, cache hits not counted.
    assert [r.info["judge_calls"] for r in first] == ["6"] * 3
    assert [r.info["judge_calls"] for r in again] == ["1"] * 3


async def test_fleet_token_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The judge `rlfleet rl` starts is a rollout of the fleet and checks the fleet's token
    (`judge.fleet_token=true`); any other judge never sees it, even with a token set."""
    from rlfleet_core.auth import TOKEN_ENV, TOKEN_FILE_ENV, generate_token

    token = generate_token()
    monkeypatch.delenv(TOKEN_FILE_ENV, raising=False)
    monkeypatch.setenv(TOKEN_ENV, token)
    judge = ScriptedJudge(answer=lambda _: "ok")
    assert await chat_once(judge, fleet_token=True) == ("ok", None)
    assert await chat_once(judge) == ("ok", None)
    assert judge.authorization == [f"Bearer {token}", None]
    with pytest.raises(ValueError, match="fleet_token and api_key_env are exclusive"):
        JudgeConfig(base_url="http://x/v1", fleet_token=True, api_key_env=TOKEN_ENV)
