"""`genrm_compare`: rewards a prompt's group of responses by pairwise comparison with a
generative reward model (an LLM judge), as NeMo-Gym's genrm_compare resources server does.

ScoreGroup only (the reward of one response depends on the others). The judge sees the
conversation, a principle (RL-BFF style) and two final answers (reasoning left out), and
answers `{"score_1": 1-5, "score_2": 1-5, "ranking": 1-6}`. Pairs are `circular` (i vs
i+1 mod N: N pairs) or `all_pairs` (N(N-1)/2); with `genrm.swap_order` each pair is judged
in both orders (2 calls a pair). A response's reward is the mean of its scores over its
comparisons (ties broken by the ranking), plus the optional length / style adjustments;
the arithmetic is in judge/genrm.py.

A comparison whose judge call fails (no answer in time, HTTP error, an answer that is not
a verdict) fails both responses in it: they get JUDGE_ERROR with the reasons, never a
default score. The rest of the group is scored from their own (all successful)
comparisons, and the group-relative adjustments are taken over them. With
`genrm.score_partial` a response is instead scored from the comparisons of it that
succeeded (failing only when none did); `info.comparisons_failed` counts the others.

Row fields:
- `responses_create_params.input` (required): the conversation the responses answer.
- `principles` (optional): a principle, or a list of 1-16, the judge weighs the responses
  by; else `genrm.principles[domain]`.
- `domain` (optional): the key of `genrm.principles` to use (default `general`).
- `comparison_strategy` (optional): `circular` or `all_pairs` (default `genrm.*`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from rlfleet_core.errors import InvalidArgument

from rlfleet_reward.environments.base import choice, optional_str
from rlfleet_reward.environments.group import GroupContext, GroupEnvironment
from rlfleet_reward.environments.judged import conversation_of, conversation_section, judge_chat
from rlfleet_reward.judge.client import JUDGE_PARSE_FAILURES, JudgeClient, JudgeError, Messages
from rlfleet_reward.judge.config import GenRMConfig
from rlfleet_reward.judge.fence import FENCE_RULE, fence, neutralize
from rlfleet_reward.judge.genrm import (
    Adjustments,
    Comparison,
    VerdictError,
    aggregate,
    comparison_pairs,
    length_adjustments,
    parse_verdict,
    style_adjustments,
)
from rlfleet_reward.types import FailureKind, RowError, Sample, Score, failure, scored

MAX_PRINCIPLES = 16
MAX_PRINCIPLE_CHARS = 8000
EMPTY_ANSWER = "None"
"""What the judge is shown for an empty answer (the seed's placeholder)."""

INSTRUCTIONS = (
    "You are an impartial judge comparing two AI assistant responses to the same "
    "conversation. Follow the principle given. Rate each response from 1 (poor) to 5 "
    "(excellent), then rank them from 1 to 6: 1 = Response 1 is much better, 2 = better, "
    "3 = slightly better, 4 = Response 2 is slightly better, 5 = better, 6 = much better. "
    "End your answer with exactly one JSON object on its own line, for example:\n"
    '{"score_1": 4, "score_2": 2, "ranking": 2}\n' + FENCE_RULE
)


VERDICT_OPENING = '{"score_1": '
"""How a verdict starts: written for the judge with `judge.prefill`."""

ANSWER_FORMAT = (
    'Answer with one JSON object: {"score_1": <1-5>, "score_2": <1-5>, "ranking": <1-6>}'
)


@dataclass(frozen=True)
class GenRMSpec:
    conversation: tuple[tuple[str, str], ...]
    principle: str | None
    domain: str
    strategy: str | None


def _principle(row: Mapping[str, Any]) -> str | None:
    value = row.get("principles")
    if value is None:
        return None
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_PRINCIPLES:
        raise RowError("principles", f"expected a string or a list of 1-{MAX_PRINCIPLES} strings")
    for k, item in enumerate(items):
        if not isinstance(item, str) or not item.strip():
            raise RowError(f"principles[{k}]", "expected a non-empty string")
        if len(item) > MAX_PRINCIPLE_CHARS:
            raise RowError(f"principles[{k}]", f"longer than {MAX_PRINCIPLE_CHARS} characters")
    return items[0] if len(items) == 1 else "\n".join(f"- {p}" for p in items)


def judge_messages(
    spec: GenRMSpec, principle: str | None, first: str, second: str, fmt: str
) -> Messages:
    """The judge's chat: `roles` is the Nemotron GenRM chat template's shape (NeMo-Gym's
    genrm_model appends `principle`, `response_1`, `response_2` messages); `text` spells
    the task out for any instruction-tuned model."""
    first = first if first.strip() else EMPTY_ANSWER
    second = second if second.strip() else EMPTY_ANSWER
    if fmt == "roles":
        # Each response is its own message, so the template delimits it; neutralized so
        # that it holds no special token, role marker or verdict (judge/fence.py).
        messages = [{"role": r, "content": c} for r, c in spec.conversation]
        if principle:
            messages.append({"role": "principle", "content": principle})
        messages.append({"role": "response_1", "content": neutralize(first)})
        messages.append({"role": "response_2", "content": neutralize(second)})
        return messages
    sections = [f"# Principle\n{principle}"] if principle else []
    sections += [
        conversation_section(spec.conversation),
        f"# Response 1\n{fence('RESPONSE_1', first)}",
        f"# Response 2\n{fence('RESPONSE_2', second)}",
    ]
    # The format again, last: small judges follow what they read last (SmolLM2-135M wrote
    # a parseable verdict 6 of 6 times with this line at temperature 0, 0 of 6 without).
    sections.append(ANSWER_FORMAT)
    return judge_chat(INSTRUCTIONS, "\n\n".join(sections))


class GenRMCompareEnvironment(GroupEnvironment):
    name: ClassVar[str] = "genrm_compare"
    description: ClassVar[str] = (
        "Pairwise GenRM (LLM judge) comparison of a prompt's responses; ScoreGroup only"
    )
    required_fields: ClassVar[tuple[str, ...]] = ("responses_create_params",)
    optional_fields: ClassVar[tuple[str, ...]] = ("principles", "domain", "comparison_strategy")

    def parse_row(self, row: Mapping[str, Any]) -> GenRMSpec:
        strategy = (
            choice(row, "comparison_strategy", ("circular", "all_pairs"), "circular")
            if row.get("comparison_strategy") is not None
            else None
        )
        return GenRMSpec(
            conversation=conversation_of(row),
            principle=_principle(row),
            domain=optional_str(row, "domain", "general"),
            strategy=strategy,
        )

    async def run_group(
        self, spec: GenRMSpec, samples: Sequence[Sample], ctx: GroupContext
    ) -> list[Score]:
        cfg = ctx.genrm()
        judge = ctx.judge()
        n = len(samples)
        if judge is None:
            reason = "no judge is configured on this gateway (set judge.base_url)"
            return [failure(FailureKind.JUDGE_ERROR, reason) for _ in samples]
        principle = spec.principle
        if principle is None and cfg.use_principle:
            if spec.domain not in cfg.principles:
                reason = (
                    f"row.domain: no principle for domain {spec.domain!r}; "
                    f"configured: {', '.join(sorted(cfg.principles))}"
                )
                return [failure(FailureKind.INVALID_ROW, reason) for _ in samples]
            principle = cfg.principles[spec.domain]
        if not cfg.use_principle:
            principle = None
        strategy = spec.strategy or cfg.comparison_strategy
        calls = judge_calls(strategy, n, cfg.swap_order)
        if calls > cfg.max_judge_calls_per_group:
            # Before any work: all_pairs grows as N^2 and the row chooses it.
            where = "row.comparison_strategy" if spec.strategy else "genrm.comparison_strategy"
            raise InvalidArgument(
                where,
                f"{strategy} over {n} responses needs {calls:,} judge calls, over "
                f"genrm.max_judge_calls_per_group ({cfg.max_judge_calls_per_group:,}): use "
                "circular or a smaller group",
            )
        deadline = time.monotonic() + ctx.timeout_s
        pairs = comparison_pairs(strategy, n)
        orders = [o for i, j in pairs for o in ([(i, j), (j, i)] if cfg.swap_order else [(i, j)])]
        # The prompts and their cache keys (JSON + SHA-256 of up to 2 MB a call) are CPU
        # work proportional to the group: built in a thread, off the event loop.
        prompts = await asyncio.to_thread(
            _prompts, judge, spec, principle, samples, orders, cfg.prompt_format
        )
        # Comparisons the judge is asked (a retried group finds the verdicts that parsed
        # in the cache): every result's `info.judge_calls`, the trainer's GenRM throughput.
        asked = sum(not judge.cached([], key=key) for _, key in prompts)
        outcomes = await asyncio.gather(
            *(
                self._compare(judge, i, j, messages, key, deadline)
                for (i, j), (messages, key) in zip(orders, prompts, strict=True)
            )
        )
        done = [c for c in outcomes if isinstance(c, Comparison)]
        problems: list[list[str]] = [[] for _ in samples]
        for (i, j), outcome in zip(orders, outcomes, strict=True):
            if isinstance(outcome, str):
                problems[i].append(f"{i} vs {j}: {outcome}")
                problems[j].append(f"{i} vs {j}: {outcome}")
        base, ties = aggregate(done, n)
        ok = [i for i in range(n) if base[i] is not None and (cfg.score_partial or not problems[i])]
        adjust = _adjustments(cfg)
        ok_base = [float(base[i] or 0.0) for i in ok]
        length = length_adjustments(
            ok_base, [samples[i].reasoning_text for i in ok], [samples[i].text for i in ok], adjust
        )
        style = style_adjustments([samples[i].text for i in ok], cfg.group_style_penalty_coeff)
        results: list[Score] = []
        for i in range(n):
            taken = sum(1 for c in done if i in (c.first, c.second))
            if i not in ok:
                total = taken + len(problems[i])
                shown = "; ".join(problems[i][:3])
                results.append(
                    failure(
                        FailureKind.JUDGE_ERROR,
                        f"{len(problems[i])} of {total} judge comparisons failed: {shown}",
                        verdict="judge_error",
                        comparisons_failed=len(problems[i]),
                        judge_calls=asked,
                    )
                )
                continue
            k = ok.index(i)
            components = {"genrm": ok_base[k]}
            if any(
                (
                    adjust.reasoning_bonus,
                    adjust.answer_bonus,
                    adjust.group_reasoning_length_penalty_coeff,
                    adjust.group_answer_length_penalty_coeff,
                )
            ):
                components["length_adjustment"] = length[k]
            if cfg.group_style_penalty_coeff > 0:
                components["style_adjustment"] = style[k]
            # [first, second, score_1, score_2, ranking] of each comparison it was in
            verdicts = [
                [c.first, c.second, c.verdict.score_1, c.verdict.score_2, c.verdict.ranking]
                for c in done
                if i in (c.first, c.second)
            ]
            results.append(
                scored(
                    components,
                    verdict="judged",
                    comparisons=taken,
                    group_tiebreaks=ties,
                    verdicts=json.dumps(verdicts, separators=(",", ":")),
                    judge_calls=asked,
                    comparisons_failed=len(problems[i]),
                )
            )
        return results

    async def _compare(
        self,
        judge: JudgeClient,
        first: int,
        second: int,
        messages: Messages,
        key: str,
        deadline: float,
    ) -> Comparison | str:
        """One judge call on (first, second): the comparison, or why there is none."""
        left = deadline - time.monotonic()
        if left <= 0:
            return "no time left in the budget for this comparison"
        try:
            verdict = await judge.chat(messages, left, parse_verdict, VERDICT_OPENING, key=key)
            return Comparison(first, second, verdict)
        except JudgeError as exc:
            return str(exc)
        except VerdictError as exc:
            JUDGE_PARSE_FAILURES.labels(self.name).inc()
            return f"the judge's answer is not a verdict: {exc}"


def judge_calls(strategy: str, n: int, swap_order: bool) -> int:
    """Judge calls a group of `n` needs (computed, not listed: N can be large)."""
    pairs = n * (n - 1) // 2 if strategy == "all_pairs" else (1 if n == 2 else n)
    return pairs * (2 if swap_order else 1)


def _prompts(
    judge: JudgeClient,
    spec: GenRMSpec,
    principle: str | None,
    samples: Sequence[Sample],
    orders: Sequence[tuple[int, int]],
    fmt: str,
) -> list[tuple[Messages, str]]:
    """(messages, cache key) of each comparison, in `orders`' order."""
    out = []
    for i, j in orders:
        messages = judge_messages(spec, principle, samples[i].text, samples[j].text, fmt)
        out.append((messages, judge.key_of(messages, VERDICT_OPENING)))
    return out


def _adjustments(cfg: GenRMConfig) -> Adjustments:
    # GenRMConfig holds each of Adjustments' settings under the same name.
    return Adjustments(**{f.name: getattr(cfg, f.name) for f in fields(Adjustments)})
