"""`rlfleet reward score --env E --response TEXT [--field k=v ...]`: score one response locally.

The `rlfleet` CLI (libs/cli) wires its `reward score` command to `score_command`, which
runs the same gateway as the service (worker pool and timeouts included) in this
process, scores one response and returns the result as a JSON-ready dict.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping
from typing import Any

from rlfleet_core.errors import InvalidArgument

from rlfleet_reward.config import PoolConfig, RewardServiceConfig, SandboxConfig
from rlfleet_reward.environments import ENVIRONMENT_NAMES
from rlfleet_reward.gateway import Gateway
from rlfleet_reward.text import split_reasoning
from rlfleet_reward.types import Overloaded, Sample


class ScoreCommandError(ValueError):
    """Bad command-line input; the message names the flag or field."""


def parse_fields(fields: Iterable[str] | Mapping[str, Any]) -> dict[str, Any]:
    """`["expected_answer=0.5", 'kwargs=[{"n": 1}]']` -> a row. Values are JSON when they
    parse as JSON (numbers, lists, objects, true/false/null), else plain strings."""
    if isinstance(fields, Mapping):
        return dict(fields)
    row: dict[str, Any] = {}
    for item in fields:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ScoreCommandError(
                f"--field {item!r}: expected key=value, e.g. expected_answer=42"
            )
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        row[key.strip()] = value
    return row


def score_command(
    env: str,
    response: str,
    fields: Iterable[str] | Mapping[str, Any] = (),
    *,
    num_tokens: int = 0,
    timeout_s: float = 30.0,
    sandbox_target: str | None = None,
) -> dict[str, Any]:
    """Score `response` with environment `env` and the row built from `fields`.

    Returns {"env", "reward", "reward_components", "failure_kind", "failure_reason",
    "mask_sample", "info", "latency_s"}; raises ScoreCommandError for bad input (unknown
    env, malformed field), naming it.
    """
    if env not in ENVIRONMENT_NAMES:
        raise ScoreCommandError(
            f"--env: unknown environment {env!r}; one of {', '.join(ENVIRONMENT_NAMES)}"
        )
    row = parse_fields(fields)
    enabled = [env]
    inner = row.get("inner_env")
    if isinstance(inner, str) and inner in ENVIRONMENT_NAMES and inner != env:
        enabled.append(inner)  # low_effort scores with the environment it wraps
    config = RewardServiceConfig(
        environments=enabled,
        timeout_s=timeout_s,
        pool=PoolConfig(workers=1),
        sandbox=SandboxConfig(target=sandbox_target),
    )
    text, reasoning = split_reasoning(response)
    sample = Sample(text, reasoning, num_tokens, output_text=response)  # as one message holds it
    return asyncio.run(_score(config, env, row, sample))


async def _score(
    config: RewardServiceConfig, env: str, row: dict[str, Any], sample: Sample
) -> dict[str, Any]:
    gateway = Gateway(config)
    try:
        gateway.prepare(env, row, [sample])  # refuse a bad row before starting workers
    except InvalidArgument as exc:
        raise ScoreCommandError(_flag_name(exc)) from None
    await gateway.start()
    try:
        score = await gateway.score(env, row, sample)
    except Overloaded as exc:  # cannot happen with one call; keep the contract explicit
        raise ScoreCommandError(str(exc)) from None
    finally:
        await gateway.stop()
    return {
        "env": env,
        "reward": score.reward,
        "reward_components": score.components,
        "failure_kind": score.failure_kind.wire_name,
        "failure_reason": score.failure_reason or None,
        "mask_sample": score.mask_sample,
        "info": score.info,
        "latency_s": round(score.latency_s, 4),
    }


def _flag_name(exc: InvalidArgument) -> str:
    if exc.field.startswith("row."):
        return f"--field {exc.message.removeprefix('row.')}"
    if exc.field == "response.num_tokens":
        return f"--num-tokens: {exc.message.split(': ', 1)[-1]}"
    return exc.message
