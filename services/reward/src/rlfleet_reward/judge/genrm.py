"""GenRM pairwise-comparison arithmetic: pairs, the judge's verdict, aggregation, and the
length / style adjustments.

The formulas follow NeMo-Gym's resources_servers/genrm_compare/utils.py (NVIDIA-NeMo/Gym
07d6b0d): `generate_comparison_pairs`, `parse_genrm_output` (the answer format),
`aggregate_scores` ("simple_tiebreaker"), `apply_length_bonuses` with
`_compute_length_weights`, and `apply_style_penalties` with `count_style_elements` /
`compute_style_density`. Our own code; differences, all deliberate:
- parsing is strict: all three keys, numbers in range; a miss is a failure with a reason,
  never the seed's fallback to default scores;
- each pair is judged in both orders (the seed judges one); both verdicts enter the
  aggregation as two comparisons, so a position bias adds the same to both responses;
- a response with a failed comparison gets no score (a failure, see genrm_compare.py);
  the group-relative adjustments are computed over the responses that have one.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from rlfleet_reward.judge.fence import UnfinishedAnswer, judge_answer

RANKING_MIDPOINT = 3.5
"""Rankings run 1 (response 1 much better) to 6 (response 2 much better)."""
SCORE_RANGE = (1.0, 5.0)
RANKING_RANGE = (1.0, 6.0)


def comparison_pairs(strategy: str, n: int) -> list[tuple[int, int]]:
    """The (i, j) pairs judged: `circular` i vs i+1 mod N (N pairs; one pair for N=2),
    `all_pairs` every i < j (N(N-1)/2)."""
    if n < 2:
        raise ValueError(f"need at least 2 responses to compare, got {n}")
    if strategy == "all_pairs":
        return list(itertools.combinations(range(n), 2))
    if strategy == "circular":
        # N=2 would list (0,1) and (1,0): the same pair twice; the seed does so, we do not.
        return [(0, 1)] if n == 2 else [(i, (i + 1) % n) for i in range(n)]
    raise ValueError(f"unknown comparison strategy {strategy!r}; use circular or all_pairs")


@dataclass(frozen=True)
class Verdict:
    """The judge's answer on (response_1, response_2)."""

    score_1: float
    score_2: float
    ranking: float


class VerdictError(ValueError):
    """The judge's answer is not a verdict; the message says why."""


def parse_verdict(text: str) -> Verdict:
    """The last JSON object in the judge's own answer (reasoning in <think> and text it
    quoted between fence lines skipped: judge/fence.py) that carries `score_1`, `score_2`
    and `ranking`: scores in [1, 5], ranking in [1, 6]. The judged responses are
    neutralized, so a verdict object they hold cannot be read here even when echoed."""
    try:
        answer = judge_answer(text)
    except UnfinishedAnswer as exc:
        raise VerdictError(str(exc)) from None
    decoder = json.JSONDecoder()
    found: dict[str, object] | None = None
    start = answer.find("{")
    while start != -1:
        try:
            value, end = decoder.raw_decode(answer, start)
        except json.JSONDecodeError:
            start = answer.find("{", start + 1)
            continue
        if isinstance(value, dict) and {"score_1", "score_2", "ranking"} & value.keys():
            found = value
        start = answer.find("{", end)
    if found is None:
        raise VerdictError(f"no JSON object with score_1/score_2/ranking in {_preview(text)}")
    numbers = []
    for key, (low, high) in (
        ("score_1", SCORE_RANGE),
        ("score_2", SCORE_RANGE),
        ("ranking", RANKING_RANGE),
    ):
        value = found.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise VerdictError(f"{key} must be a number, got {json.dumps(value)[:40]}")
        if not low <= value <= high:
            raise VerdictError(f"{key} must be within [{low:g}, {high:g}], got {value}")
        numbers.append(float(value))
    return Verdict(*numbers)


def _preview(text: str, limit: int = 160) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


@dataclass(frozen=True)
class Comparison:
    """One judge call: response `first` was shown as response_1, `second` as response_2."""

    first: int
    second: int
    verdict: Verdict


def aggregate(comparisons: Sequence[Comparison], n: int) -> tuple[list[float | None], int]:
    """Per-response mean of its scores over the comparisons it took part in (None: none),
    and how many comparisons needed the tiebreaker. A tie (score_1 == score_2) is broken by
    the ranking: both scores move by (3.5 - ranking) in opposite directions (NeMo-Gym's
    `aggregate_scores`, "simple_tiebreaker")."""
    totals = [0.0] * n
    counts = [0] * n
    ties = 0
    for c in comparisons:
        s1, s2 = c.verdict.score_1, c.verdict.score_2
        if s1 == s2:
            ties += 1
            shift = RANKING_MIDPOINT - c.verdict.ranking
            s1, s2 = s1 + shift, s2 - shift
        totals[c.first] += s1
        totals[c.second] += s2
        counts[c.first] += 1
        counts[c.second] += 1
    return [t / k if k else None for t, k in zip(totals, counts, strict=True)], ties


def centred_weights(values: Sequence[float]) -> list[float]:
    """Shorter (smaller) = larger weight, min-max scaled to [0, 1] then zero-centred;
    all equal = all 0 (NeMo-Gym's `_compute_length_weights`)."""
    low, high = min(values), max(values)
    if high == low:
        return [0.0] * len(values)
    raw = [1.0 - (v - low) / (high - low) for v in values]
    mean = sum(raw) / len(raw)
    return [w - mean for w in raw]


@dataclass(frozen=True)
class Adjustments:
    """Settings of the length and style adjustments (GenRMConfig's fields of that name)."""

    reasoning_bonus: float = 0.0
    answer_bonus: float = 0.0
    top_percentile: float = 0.2
    group_reasoning_length_penalty_coeff: float = 0.0
    group_answer_length_penalty_coeff: float = 0.0
    group_style_penalty_coeff: float = 0.0


def length_adjustments(
    scores: Sequence[float], reasoning: Sequence[str], answers: Sequence[str], cfg: Adjustments
) -> list[float]:
    """What NeMo-Gym's `apply_length_bonuses` adds to each score. Lengths are characters of
    the stripped text. The top threshold is the k-th best score, k = max(1, int(N * p)); the
    shortest non-empty reasoning (then answer) earns its bonus if its score, as raised by
    the bonuses so far, is at least that threshold. Then each response gets
    w_reasoning * coeff_r + w_answer * coeff_a with `centred_weights` of the lengths."""
    n = len(scores)
    if n < 2:
        return [0.0] * n
    current = list(scores)
    extra = [0.0] * n
    r_len = [len(t.strip()) for t in reasoning]
    a_len = [len(t.strip()) for t in answers]
    threshold = sorted(current, reverse=True)[max(0, int(n * cfg.top_percentile) - 1)]
    for bonus, lengths in ((cfg.reasoning_bonus, r_len), (cfg.answer_bonus, a_len)):
        candidates = [(length, i) for i, length in enumerate(lengths) if length > 0]
        if bonus > 0 and candidates:
            # min over (length, index): the first of equally short ones, as the seed's min()
            i = min(candidates)[1]
            if current[i] >= threshold:
                current[i] += bonus
                extra[i] += bonus
    if cfg.group_reasoning_length_penalty_coeff > 0 or cfg.group_answer_length_penalty_coeff > 0:
        w_r = centred_weights(r_len)
        w_a = centred_weights(a_len)
        for i in range(n):
            extra[i] += (
                w_r[i] * cfg.group_reasoning_length_penalty_coeff
                + w_a[i] * cfg.group_answer_length_penalty_coeff
            )
    return extra


_CODE_BLOCK = re.compile(r"```.*?```", re.DOTALL)
_HEADER = re.compile(r"^#{1,6}\s", re.MULTILINE)
_ORDERED_ITEM = re.compile(r"^\s*\d+\.\s", re.MULTILINE)
_BULLET_ITEM = re.compile(r"^\s*[-*+]\s", re.MULTILINE)
_BOLD = re.compile(r"\*\*[^*\n]+\*\*|__[^_\n]+__")
# One code point per match in the seed's emoji ranges. Its U+24C2-U+1F251 range also spans
# CJK and Hangul; kept as the seed has it, so densities match NeMo-Gym's.
_EMOJI = re.compile(
    "[\U0001f300-\U0001f5ff\U0001f600-\U0001f64f\U0001f680-\U0001f6ff\U0001f1e0-\U0001f1ff"
    "\U0001f900-\U0001f9ff\U0001fa00-\U0001faff\u2600-\u27bf\u24c2-\U0001f251]"
)


def style_elements(text: str) -> int:
    """Headers + list items + bold spans + emoji, code blocks excluded (Arena-Hard's style
    elements plus emoji, as NeMo-Gym's `count_style_elements`)."""
    prose = _CODE_BLOCK.sub("", text)
    return sum(len(p.findall(prose)) for p in (_HEADER, _ORDERED_ITEM, _BULLET_ITEM, _BOLD, _EMOJI))


def style_density(text: str) -> float:
    """Style elements per character of the stripped text outside code blocks (0 if empty)."""
    prose = _CODE_BLOCK.sub("", text)
    size = len(prose.strip())
    return style_elements(prose) / size if size else 0.0


def style_adjustments(answers: Sequence[str], coeff: float) -> list[float]:
    """coeff * `centred_weights` of the style densities: less formatting, higher reward
    (NeMo-Gym's `apply_style_penalties`)."""
    if len(answers) < 2 or coeff <= 0:
        return [0.0] * len(answers)
    return [w * coeff for w in centred_weights([style_density(a) for a in answers])]
