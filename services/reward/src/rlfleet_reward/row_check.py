"""`check_row`: a data row checked exactly as the gateway checks it before scoring, for
`rlfleet data prep` (through `SERVICE.check_row`, in the CLI's own process — no service
needs to run for a plain prep).

The row's environment is resolved as everywhere else (`rlfleet_contracts.rows.env_ref`:
`env`, NeMo-Gym's `agent_ref.name` or `task_source`, agent names mapped), then the same
`Gateway.prepare` the faces call parses it with that environment's `parse_row`.
"""

from __future__ import annotations

import functools
from typing import Any

from rlfleet_contracts.rows import env_ref, unknown_env_problem
from rlfleet_core.errors import InvalidArgument

from rlfleet_reward.config import PoolConfig, RewardServiceConfig
from rlfleet_reward.episodes import EPISODE_ENVIRONMENT_NAMES, get_episode_environment
from rlfleet_reward.episodes.tools import row_tools
from rlfleet_reward.gateway import Gateway
from rlfleet_reward.types import RowError


@functools.cache
def _gateway() -> Gateway:
    # Never started: prepare() only parses. spawn keeps this process's multiprocessing
    # defaults untouched (forkserver would record a preload list in the caller's process).
    return Gateway(RewardServiceConfig(pool=PoolConfig(workers=1, start_method="spawn")))


def _episode_problems(env: str, row: dict[str, Any]) -> list[str]:
    """The problems OpenEpisode would find in `row` for multi-turn environment `env`."""
    episode_env = get_episode_environment(env)
    try:
        episode_env.parse_row(row)
        row_tools(row, episode_env.tools)
    except RowError as exc:
        return [f"{exc.field}: {exc.problem}"]
    return []


def check_row(row: dict[str, Any]) -> list[str]:
    """'field: problem' strings for `row` (empty if the gateway would accept it). A row
    for a multi-turn environment (episodes/) passes when OpenEpisode would accept it;
    `tool_use` names both a single-turn and a multi-turn environment, and either will do."""
    ref = env_ref(row)
    if ref is None:
        return ["env: missing (set `env`, `agent_ref.name` or `task_source`, or a default env)"]
    gateway = _gateway()
    episode_problems = None
    if ref.env in EPISODE_ENVIRONMENT_NAMES:
        episode_problems = _episode_problems(ref.env, row)
        if not episode_problems or ref.env not in gateway.enabled:
            return episode_problems
    if ref.env not in gateway.enabled:
        return [unknown_env_problem(ref, gateway.enabled)]
    try:
        gateway.prepare(ref.env, row, [])
    except InvalidArgument as exc:
        problem = exc.message.removeprefix("row.")
        extra = [f"or, as multi-turn {ref.env}: {p}" for p in episode_problems or ()]
        return [problem, *extra]
    return []
