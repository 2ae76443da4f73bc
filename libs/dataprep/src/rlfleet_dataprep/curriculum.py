"""The curriculum pass of `rlfleet data prep rl --curriculum-samples K`: measure how often
the starting model already solves each training prompt, drop the prompts it solves in all
K samples (they carry no GRPO signal: every advantage would be zero) and order the rest
from easiest to hardest by the measured pass rate.

It talks to the services over their public APIs only: K samples per prompt from an
OpenAI-compatible `/v1/chat/completions` (the rollout service, or any such server), scored
by the reward gateway's `ScoreGroup`. Without addresses, `rlfleet data prep` starts a
rollout and a reward service of its own for the pass and hands their addresses here.

The fleet token (RLFLEET_AUTH_TOKEN(_FILE)) goes only to a loopback rollout address
(where `rlfleet data prep` starts its own, and where a local fleet listens); to another
host only when the user says so (`--rollout-send-token`), since `--rollout-url` may name
any server. Redirects are never followed: they would carry the token elsewhere.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from rlfleet_contracts.reward_client import BlockingRewardClient, RewardFailed
from rlfleet_contracts.rows import DataError, Row, env_of, prompt_messages
from rlfleet_core.auth import AuthError, auth_headers, is_loopback, token_from_env

SOLVED = 1.0
"""A sample counts as solved at full reward (graded environments rarely give exactly 1
for a partly right answer)."""


@dataclass
class CurriculumOptions:
    samples: int
    """K: samples per prompt (>= 2: one sample cannot tell 'always' from 'once')."""
    temperature: float = 1.0
    max_tokens: int = 256
    timeout_s: float = 300.0
    """Deadline of each generate and score call."""

    def check(self) -> None:
        if self.samples < 2:
            raise DataError(f"--curriculum-samples ({self.samples}) must be >= 2")
        if self.max_tokens < 1:
            raise DataError(f"--curriculum-max-tokens ({self.max_tokens}) must be >= 1")
        if self.temperature <= 0:
            raise DataError(
                f"--curriculum-temperature ({self.temperature}) must be > 0 (greedy samples "
                "are all alike)"
            )


@dataclass(frozen=True)
class Measured:
    index: int
    """Row position in the training split before the pass."""
    rewards: tuple[float, ...]

    @property
    def pass_rate(self) -> float:
        return sum(r >= SOLVED for r in self.rewards) / len(self.rewards)

    @property
    def mean_reward(self) -> float:
        return sum(self.rewards) / len(self.rewards)

    @property
    def solved_all(self) -> bool:
        return all(r >= SOLVED for r in self.rewards)


Completion = tuple[str, int]
"""A sample's text and its number of generated tokens (for length-aware rewards)."""
Generate = Callable[[Row], list[Completion]]
Score = Callable[[Row, Sequence[Completion]], list[float]]


def measure(
    rows: Sequence[Row],
    generate: Generate,
    score: Score,
    concurrency: int = 8,
    advance: Callable[[int], Any] | None = None,
) -> list[Measured]:
    """K samples of each row, scored; results in row order."""

    def one(index: int) -> Measured:
        rewards = score(rows[index], generate(rows[index]))
        if advance:
            advance(1)
        return Measured(index, tuple(rewards))

    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        return list(pool.map(one, range(len(rows))))


def order_by_difficulty(rows: Sequence[Row], measured: Sequence[Measured]) -> tuple[list[Row], int]:
    """(kept rows, easiest first, each with `curriculum` stats; rows dropped as solved).

    Easiest = highest pass rate, then highest mean reward; ties keep the original order
    (a stable sort), so the result is a pure function of the measurements."""
    kept = [m for m in measured if not m.solved_all]
    kept.sort(key=lambda m: (-m.pass_rate, -m.mean_reward))
    out = [
        {
            **rows[m.index],
            "curriculum": {
                "pass_rate": m.pass_rate,
                "mean_reward": round(m.mean_reward, 6),
                "samples": len(m.rewards),
            },
        }
        for m in kept
    ]
    return out, len(measured) - len(kept)


# ----------------------------------------------------------------------------- services


SEND_TOKEN_FLAG = "--rollout-send-token"


def rollout_token(base_url: str, send_token_anywhere: bool = False) -> str | None:
    """The fleet token to send to the rollout at `base_url`: the environment's, when the
    address is loopback or the user allowed any host; else None (sent without one)."""
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise DataError(f"--rollout-url: expected http(s)://host:port, got {base_url!r}")
    try:
        token = token_from_env()
    except AuthError as exc:
        raise DataError(str(exc)) from None
    if token is None or not (send_token_anywhere or is_loopback(parts.hostname)):
        return None
    return token


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    """urllib would follow a redirect with every header, the token included."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> None:  # fmt: skip
        raise DataError(
            f"{req.get_method()} {req.full_url}: HTTP {code} redirects to {newurl}; "
            "redirects are not followed (the fleet token would go along): give the final "
            "address as --rollout-url"
        )


_OPENER = urllib.request.build_opener(_RefuseRedirects)


class ChatSampler:
    """K samples per row from an OpenAI-compatible server (`base_url` like
    http://127.0.0.1:8000); the model is the server's first `/v1/models` entry.
    `token`: the fleet token to send (None: none; see `rollout_token`)."""

    def __init__(self, base_url: str, options: CurriculumOptions, token: str | None) -> None:
        self.base_url = base_url.rstrip("/")
        self.options = options
        self.token = token
        models = self._call("GET", "/v1/models", None)
        try:
            self.model = str(models["data"][0]["id"])
        except (KeyError, IndexError, TypeError):
            raise DataError(f"{self.base_url}/v1/models lists no model") from None

    def _call(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.base_url + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json", **auth_headers(self.token or "")},
        )
        try:
            with _OPENER.open(request, timeout=self.options.timeout_s) as reply:
                return json.loads(reply.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:300]
            hint = ""
            if exc.code == 401 and self.token is None and token_from_env() is not None:
                hint = (
                    f" (the fleet token is sent only to loopback addresses; {SEND_TOKEN_FLAG} "
                    f"sends it to {urlsplit(self.base_url).hostname})"
                )
            raise DataError(
                f"{method} {self.base_url}{path}: HTTP {exc.code} {detail}{hint}"
            ) from None
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise DataError(f"{method} {self.base_url}{path}: {exc}") from None

    def __call__(self, row: Row) -> list[Completion]:
        body = {
            "model": self.model,
            "messages": prompt_messages(row),
            "n": self.options.samples,
            "temperature": self.options.temperature,
            "max_tokens": self.options.max_tokens,
        }
        reply = self._call("POST", "/v1/chat/completions", body)
        completions = [
            (
                str(c["message"].get("content") or ""),
                # rlfleet's rollout adds the token ids; other servers: usage is per call
                len(c["message"].get("generation_token_ids") or ()),
            )
            for c in reply.get("choices", [])
        ]
        if len(completions) != self.options.samples:
            raise DataError(
                f"row {row.get('id', '?')}: asked {self.options.samples} samples, "
                f"got {len(completions)}"
            )
        return completions


class GroupScorer:
    """Rewards from the reward gateway's ScoreGroup (gRPC, with a deadline per call)."""

    def __init__(self, target: str, timeout_s: float) -> None:
        self.client = BlockingRewardClient(target, timeout_s)

    def __call__(self, row: Row, completions: Sequence[Completion]) -> list[float]:
        try:
            scores = self.client.score_group(
                f"curriculum-{row.get('id', '?')}", env_of(row), row, completions
            )
        except RewardFailed as exc:
            raise DataError(f"row {row.get('id', '?')} (env {env_of(row)}): {exc}") from None
        return [score.reward for score in scores]

    def close(self) -> None:
        self.client.close()


@contextmanager
def curriculum_services(
    options: CurriculumOptions,
    *,
    rollout_url: str,
    reward_target: str,
    send_token_anywhere: bool = False,
) -> Iterator[tuple[Generate, Score]]:
    """(generate, score) over a running OpenAI-compatible server and reward gateway; the
    caller starts them when the user gave none (data prep stays free of the fleet).
    `send_token_anywhere`: send the fleet token to a rollout beyond loopback too."""
    token = rollout_token(rollout_url, send_token_anywhere)
    scorer = GroupScorer(reward_target, options.timeout_s)
    try:
        yield ChatSampler(rollout_url, options, token), scorer
    finally:
        scorer.close()
