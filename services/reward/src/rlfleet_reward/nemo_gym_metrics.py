"""NeMo-Gym's `/aggregate_metrics`: statistics over the verify responses a caller sends.

Same request and answer shape as nemo-gym 0.7's `SimpleResourcesServer.aggregate_metrics`
(`{"verify_responses": [...]}` -> `{group_level_metrics, agent_metrics, key_metrics,
perf_summary, repeat_level_metrics}`), so an agent's rollout collection reads ours as it
reads theirs. What is computed, as their base class does:

- Responses with `mask_sample: true` are left out of every quality statistic and counted
  under `coverage/*` (present only when something was masked); all masked -> only coverage.
- Every top-level number of a response (booleans as 0/1; keys starting with `_` skipped)
  plus the numbers of `response.usage` is a column; `mean/`, `max/`, `min/`, `median/` and
  `std/` (sample std, ddof 1) of each, per task (`_ng_task_index`, default 0) in
  `group_level_metrics` and over all in `agent_metrics`. A std over one value is omitted,
  or 0 when no column of that group has two values (pandas' `describe` as they use it).
- `agent_metrics.num_repeats`: distinct `_ng_rollout_index` values.
- pass@k over `accuracy` = reward, as their math/mcqa/code servers add it: `pass@{k}/accuracy`
  (combinatorial for 0/1 rewards, best of the first k otherwise), `pass@1[avg-of-{k}]/accuracy`
  (x100), `per_sample_aggregate` and `.../std_dev_across_runs`, `.../std_err_across_runs`.
- `key_metrics`: every `mean/*`, the highest-k pass@ entries, and coverage.

Not computed: majority@k and per-server extras (their servers read server-specific answer
fields), histograms, the group's `sample`, the `*_across_repeats/*` statistics and
`repeat_level_metrics` (always []), and `perf_summary` (always null).
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from rlfleet_core.errors import InvalidArgument

TASK_INDEX = "_ng_task_index"
ROLLOUT_INDEX = "_ng_rollout_index"
_STATS = ("mean", "max", "min", "median", "std")


def _index(response: Mapping[str, Any], key: str, where: str) -> int:
    value = response.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{where}.{key}", f"expected an integer, got {str(value)[:50]}")
    return value


def _columns(response: Mapping[str, Any]) -> dict[str, float]:
    """The numbers RewardProfiler reads from one response (usage numbers win on a clash)."""
    raw = dict(response)
    usage = raw.get("response", {}).get("usage") if isinstance(raw.get("response"), dict) else {}
    if isinstance(usage, dict):
        raw.update(usage)
    columns: dict[str, float] = {}
    for key, value in raw.items():
        if key.startswith("_"):
            continue
        if isinstance(value, bool):
            columns[key] = int(value)
        elif isinstance(value, int | float) and math.isfinite(value):
            columns[key] = value
    return columns


def _rollout_info(task: int, response: Mapping[str, Any]) -> dict[str, Any]:
    rollout = _index(response, ROLLOUT_INDEX, "")
    columns = {k: v for k, v in _columns(response).items() if k != "reward"}
    return {
        "rollout_id": f"{task}:{rollout}",
        TASK_INDEX: task,
        ROLLOUT_INDEX: rollout,
        "reward": response["reward"],
        **columns,
    }


def _describe(rows: list[dict[str, float]]) -> dict[str, float]:
    names = sorted({k for row in rows for k in row})
    out: dict[str, float] = {}
    stds: dict[str, float | None] = {}
    for name in names:
        values = [row[name] for row in rows if name in row]
        out[f"mean/{name}"] = statistics.fmean(values)
        out[f"max/{name}"] = float(max(values))
        out[f"min/{name}"] = float(min(values))
        out[f"median/{name}"] = float(statistics.median(values))
        stds[name] = statistics.stdev(values) if len(values) > 1 else None
    if all(v is None for v in stds.values()):
        # pandas: std is NaN for every column, so it is shown as 0 where no value is missing
        stds = {n: 0.0 for n in names if all(n in row for row in rows)}
    out.update({f"std/{n}": v for n, v in stds.items() if v is not None})
    return out


def _pass_at_k(tasks: list[list[float]]) -> dict[str, Any]:
    """compute_pass_majority_metrics' pass@k part for the score `accuracy` = reward."""
    metrics: dict[str, Any] = {}
    max_k = max(len(t) for t in tasks)
    for k in range(1, max_k + 1):
        passes, averages = [], []
        for values in tasks:
            if k <= len(values):
                if all(v in (0, 1) for v in values):
                    wrong = sum(1 for v in values if not v)
                    passes.append(
                        1.0 if wrong < k else 1.0 - math.comb(wrong, k) / math.comb(len(values), k)
                    )
                else:
                    passes.append(max(values[:k]))
            averages.append(sum(values[:k]) / len(values[:k]))
        if passes:
            metrics[f"pass@{k}/accuracy"] = 100.0 * sum(passes) / len(passes)
        metrics[f"pass@1[avg-of-{k}]/accuracy"] = 100.0 * sum(averages) / len(averages)
    runs = []
    for run in range(max_k):
        scores = [t[run] for t in tasks if run < len(t)]
        runs.append(100.0 * sum(scores) / len(scores))
    metrics["per_sample_aggregate"] = {"accuracy": runs}
    for k in range(2, max_k + 1):
        head = runs[:k]
        std_dev = statistics.stdev(head)
        metrics[f"pass@1[avg-of-{k}]/accuracy/std_dev_across_runs"] = std_dev
        metrics[f"pass@1[avg-of-{k}]/accuracy/std_err_across_runs"] = std_dev / math.sqrt(len(head))
    return metrics


def _highest_k(metrics: Mapping[str, Any], pattern: str) -> dict[str, Any]:
    """`pattern` ("pass@{k}") entries for `accuracy` at the highest k (their highest_k_metrics)."""
    regex = re.compile("^" + re.escape(pattern).replace(r"\{k\}", r"(\d+)") + "/accuracy$")
    found = {int(m.group(1)): key for key in metrics if (m := regex.match(key))}
    return {found[max(found)]: metrics[found[max(found)]]} if found else {}


def _coverage(responses: list[Mapping[str, Any]], scored: list[int]) -> dict[str, int]:
    masked = len(responses) - len(scored)
    if not masked:
        return {}
    tasks_all = {_index(r, TASK_INDEX, "") for r in responses}
    tasks_measured = {_index(responses[i], TASK_INDEX, "") for i in scored}
    return {
        "coverage/measured_rollouts": len(scored),
        "coverage/masked_rollouts": masked,
        "coverage/measured_tasks": len(tasks_measured),
        "coverage/fully_masked_tasks": len(tasks_all - tasks_measured),
    }


def aggregate_metrics(body: Any) -> dict[str, Any]:
    """The `/aggregate_metrics` answer for `body`; InvalidArgument names a bad field."""
    if not isinstance(body, dict) or not isinstance(body.get("verify_responses"), list):
        raise InvalidArgument("verify_responses", "required: a list of verify responses")
    responses: list[Mapping[str, Any]] = body["verify_responses"]
    empty: dict[str, Any] = {
        "group_level_metrics": [],
        "agent_metrics": {},
        "key_metrics": {},
        "perf_summary": None,
        "repeat_level_metrics": [],
    }
    if not responses:
        return empty
    scored = []
    for i, response in enumerate(responses):
        where = f"verify_responses[{i}]"
        if not isinstance(response, dict):
            raise InvalidArgument(where, "expected a verify response object")
        reward = response.get("reward")
        if isinstance(reward, bool) or not isinstance(reward, int | float):
            raise InvalidArgument(f"{where}.reward", "required: a number")
        _index(response, TASK_INDEX, where), _index(response, ROLLOUT_INDEX, where)
        if not response.get("mask_sample"):
            scored.append(i)
    coverage = _coverage(responses, scored)
    if not scored:
        return {**empty, "agent_metrics": dict(coverage), "key_metrics": dict(coverage)}

    by_task: dict[int, list[Mapping[str, Any]]] = defaultdict(list)
    for i in scored:
        by_task[_index(responses[i], TASK_INDEX, "")].append(responses[i])
    groups = []
    for task, members in sorted(by_task.items()):
        members = sorted(members, key=lambda r: _index(r, ROLLOUT_INDEX, ""))
        groups.append(
            {
                **_describe([_columns(r) for r in members]),
                TASK_INDEX: task,
                "num_rollouts": len(members),
                "expected_num_rollouts": len(members),
                "missing_num_rollouts": 0,
                "reward_profile_completion_pct": 100.0,
                "rollout_infos": [_rollout_info(task, r) for r in members],
            }
        )
    agent = _describe([_columns(responses[i]) for i in scored])
    agent.update(coverage)
    agent.update(_pass_at_k([[float(r["reward"]) for r in by_task[t]] for t in sorted(by_task)]))
    agent["num_repeats"] = len({_index(r, ROLLOUT_INDEX, "") for r in responses})
    key = {k: v for k, v in agent.items() if k.startswith("mean/")}
    key.update(_highest_k(agent, "pass@1[avg-of-{k}]"))
    key.update(_highest_k(agent, "pass@{k}"))
    key.update(coverage)
    return {**empty, "group_level_metrics": groups, "agent_metrics": agent, "key_metrics": key}
