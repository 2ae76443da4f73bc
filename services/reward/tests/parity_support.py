"""Replay parity cases (services/reward/parity) through a running reward service over its
NeMo-Gym HTTP face and list every request whose reward differs from NeMo-Gym's."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import httpx

PARITY_DIR = Path(__file__).resolve().parents[1] / "parity"
if str(PARITY_DIR) not in sys.path:
    sys.path.insert(0, str(PARITY_DIR))

import record_mir  # noqa: E402

LIVE_SKIP_REASON = (
    "set RLFLEET_NEMO_GYM_PYTHON and RLFLEET_NEMO_GYM_SRC to a NeMo-Gym side environment "
    "(services/reward/parity/side_env.sh) to compare against NeMo-Gym live"
)


def live_available() -> bool:
    return bool(
        os.environ.get("RLFLEET_NEMO_GYM_PYTHON") and os.environ.get("RLFLEET_NEMO_GYM_SRC")
    )


def row_fields(request: dict[str, Any]) -> dict[str, Any]:
    """A verify request's row fields: all but the response and the prompt."""
    return {k: v for k, v in request.items() if k not in ("response", "responses_create_params")}


def load_recorded(env: str) -> list[dict[str, Any]]:
    path = record_mir.RECORDED / f"{env}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def _score_all(base_url: str, env: str, requests: list[dict[str, Any]]) -> list[Any]:
    limit = asyncio.Semaphore(32)
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:

        async def one(body: dict[str, Any]) -> Any:
            async with limit:
                reply = await client.post(f"/{env}/verify", json=body)
            if reply.status_code != 200:
                return f"HTTP {reply.status_code}: {reply.text[:300]}"
            data = reply.json()
            return (data["reward"], data.get("verifier_info"), data.get("failure_reason"))

        return await asyncio.gather(*(one(r) for r in requests))


def differences(base_url: str, env: str, cases: list[dict[str, Any]]) -> list[str]:
    """One line per case where rlfleet's reward is not exactly NeMo-Gym's `reward`."""
    ours = asyncio.run(_score_all(base_url, env, [c["request"] for c in cases]))
    lines = []
    for i, (case, got) in enumerate(zip(cases, ours, strict=True)):
        if isinstance(got, tuple) and got[0] == case["reward"]:
            continue
        text = json.dumps(case["request"]["response"].get("output"))
        row = row_fields(case["request"])
        lines.append(
            f"#{i} {case['category']}: nemo-gym {case['reward']} (extracted {case.get('extracted')!r}), "
            f"rlfleet {got}\n    text={text[:300]!r}\n    row={json.dumps(row)[:600]}"
        )
    return lines


# NeMo-Gym's example rows (data/<rows>) with the responses of its example rollouts.
EXAMPLES = {
    "mcqa": [
        ("example.jsonl", "example_rollouts.jsonl"),
        ("example_with_template_metadata.jsonl", "example_rollouts_with_template_metadata.jsonl"),
    ],
    "instruction_following": [("example.jsonl", "example_rollouts.jsonl")],
    "reasoning_gym": [("example.jsonl", "example_rollouts.jsonl")],
}


def example_cases(env: str) -> list[dict[str, Any]]:
    """NeMo-Gym's example rows, unchanged, each with its example rollout's response and
    the reward NeMo-Gym gives it now."""
    data = Path(os.environ["RLFLEET_NEMO_GYM_SRC"]) / "resources_servers" / env / "data"
    cases = []
    for rows_file, rollouts_file in EXAMPLES[env]:
        rows = [json.loads(x) for x in (data / rows_file).read_text().splitlines() if x.strip()]
        rollouts = [
            json.loads(x) for x in (data / rollouts_file).read_text().splitlines() if x.strip()
        ]
        for i, (row, rollout) in enumerate(zip(rows, rollouts, strict=True)):
            request = {**row, "response": rollout["response"]}
            cases.append(
                {
                    "category": f"{rows_file}#{i}",
                    "request": request,
                    "reference": {"server": env, "request": request},
                }
            )
    for case, result in zip(cases, record_mir.reference_results(cases), strict=True):
        case["reward"], case["extracted"] = result["reward"], result.get("extracted")
    return cases
