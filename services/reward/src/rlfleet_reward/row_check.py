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
from rlfleet_reward.gateway import Gateway


@functools.cache
def _gateway() -> Gateway:
    # Never started: prepare() only parses. spawn keeps this process's multiprocessing
    # defaults untouched (forkserver would record a preload list in the caller's process).
    return Gateway(RewardServiceConfig(pool=PoolConfig(workers=1, start_method="spawn")))


def check_row(row: dict[str, Any]) -> list[str]:
    """'field: problem' strings for `row` (empty if the gateway would accept it)."""
    ref = env_ref(row)
    if ref is None:
        return ["env: missing (set `env`, `agent_ref.name` or `task_source`, or a default env)"]
    gateway = _gateway()
    if ref.env not in gateway.enabled:
        return [unknown_env_problem(ref, gateway.enabled)]
    try:
        gateway.prepare(ref.env, row, [])
    except InvalidArgument as exc:
        return [exc.message.removeprefix("row.")]
    return []
