"""Reward parity with NeMo-Gym's own resources servers (issue 13), through the real gateway.

The recorded tests replay services/reward/parity/recorded/<env>.jsonl — generated requests
across each environment's failure categories, with the reward NeMo-Gym 0.7's server gave
each (parity/record.py) — over HTTP `/{env}/verify` and gRPC ScoreStream, and require every
reward to be the same. The live test scores freshly generated requests (another seed) with
NeMo-Gym itself, where its side environment is given (RLFLEET_NEMO_GYM_PYTHON/_SRC).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import httpx
import pytest
from parity_support import row_fields
from reward_support import RewardServer
from rlfleet_proto.v1 import reward_pb2, reward_pb2_grpc

PARITY_DIR = Path(__file__).resolve().parents[1] / "parity"
sys.path.insert(0, str(PARITY_DIR))

from generate import GENERATORS  # noqa: E402
from record import RECORDED, reference_rewards, side_env_missing  # noqa: E402

ENVS = ("math", "structured_outputs")
LIVE_COUNT = int(os.environ.get("RLFLEET_PARITY_LIVE_COUNT", "200"))


def _recorded(env: str) -> list[dict[str, Any]]:
    lines = (RECORDED / f"{env}.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


async def _http_rewards(url: str, entries: list[dict[str, Any]]) -> list[Any]:
    # aiohttp, not httpx: httpx's async pool stalls past ~16 concurrent requests.
    limit = asyncio.Semaphore(32)

    async def one(session: aiohttp.ClientSession, entry: dict[str, Any]) -> Any:
        async with (
            limit,
            session.post(f"{url}/{entry['env']}/verify", json=entry["request"]) as reply,
        ):
            if reply.status != 200:
                return f"HTTP {reply.status}: {(await reply.text())[:200]}"
            body = await reply.json()
        if body["failure_kind"]:
            return f"{body['failure_kind']}: {body['failure_reason']}"
        return body["reward"]

    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        return await asyncio.gather(*(one(session, entry) for entry in entries))


def _proto_response(response: dict[str, Any]) -> reward_pb2.Response:
    """What a gRPC client holds for a Responses object: message text and reasoning."""
    text, reasoning = [], []
    for item in response["output"]:
        parts = item.get("content") or []
        if item["type"] == "message":
            text += [p["text"] for p in parts if p["type"] == "output_text"]
        elif item["type"] == "reasoning":
            reasoning += [p["text"] for p in item.get("summary") or []]
    return reward_pb2.Response(text="".join(text), reasoning_text="\n".join(reasoning))


def _grpc_rewards(
    stub: reward_pb2_grpc.RewardServiceStub, entries: list[dict[str, Any]]
) -> list[Any]:
    def requests() -> Any:
        for i, entry in enumerate(entries):
            row = {k: v for k, v in entry["request"].items() if k != "response"}
            yield reward_pb2.ScoreRequest(
                request_id=str(i),
                env=entry["env"],
                row_json=json.dumps(row),
                response=_proto_response(entry["request"]["response"]),
            )

    rewards: list[Any] = [None] * len(entries)
    for result in stub.ScoreStream(requests(), timeout=300):
        i = int(result.request_id)
        rewards[i] = result.failure_reason if result.failure_kind else result.reward
    return rewards


def _differences(entries: list[dict[str, Any]], ours: list[Any]) -> list[str]:
    out = []
    for entry, reward in zip(entries, ours, strict=True):
        if reward != entry["reward"]:
            output = json.dumps(entry["request"]["response"]["output"], ensure_ascii=False)
            fields = row_fields(entry["request"])
            out.append(
                f"{entry['case']}: ours {reward!r}, NeMo-Gym {entry['reward']}\n"
                f"    row {json.dumps(fields, ensure_ascii=False)[:300]}\n    output {output[:400]}"
            )
    return out


def _assert_same(entries: list[dict[str, Any]], ours: list[Any]) -> None:
    diffs = _differences(entries, ours)
    assert not diffs, (
        f"{len(diffs)} of {len(entries)} rewards differ from NeMo-Gym's:\n" + "\n".join(diffs)
    )


@pytest.mark.parametrize("env", ENVS)
def test_recorded_fixture_covers_every_category(env: str) -> None:
    entries = _recorded(env)
    assert len(entries) >= 500
    generated = GENERATORS[env](0, len(entries))
    stale = [
        g["case"] for g, e in zip(generated, entries, strict=True) if g["request"] != e["request"]
    ]
    assert not stale, (
        f"the fixture is stale ({len(stale)} requests): re-record it (parity/README.md)"
    )
    assert len(Counter(entry["case"].split("/")[0] for entry in entries)) >= 30
    rewards = Counter(entry["reward"] for entry in entries)
    assert rewards[0.0] > 50 and rewards[1.0] > 50, rewards


@pytest.mark.parametrize("env", ENVS)
def test_recorded_rewards_match_over_http(reward_server: RewardServer, env: str) -> None:
    entries = _recorded(env)
    _assert_same(entries, asyncio.run(_http_rewards(reward_server.http_url, entries)))


@pytest.mark.parametrize("env", ENVS)
def test_recorded_rewards_match_over_grpc(
    stub: reward_pb2_grpc.RewardServiceStub, env: str
) -> None:
    # The proto carries no function_call items: tool_call-mode rows need the HTTP face.
    entries = [e for e in _recorded(env) if e["request"].get("response_mode") != "tool_call"]
    _assert_same(entries, _grpc_rewards(stub, entries))


@pytest.mark.skipif(
    side_env_missing() is not None, reason=f"NeMo-Gym side env: {side_env_missing()}"
)
@pytest.mark.parametrize("env", ENVS)
def test_live_rewards_match_nemo_gym(reward_server: RewardServer, env: str) -> None:
    lines = GENERATORS[env](12345, LIVE_COUNT)
    rewards = reference_rewards(lines)
    entries = [{**line, "reward": reward} for line, reward in zip(lines, rewards, strict=True)]
    _assert_same(entries, asyncio.run(_http_rewards(reward_server.http_url, entries)))


def _verify(http_url: str, env: str, row: dict[str, Any], text: str) -> dict[str, Any]:
    from reward_support import nemo_request, nemo_response

    reply = httpx.post(
        f"{http_url}/{env}/verify", json=nemo_request("q", nemo_response(text), **row), timeout=60
    )
    assert reply.status_code == 200, reply.text
    return dict(reply.json())


@pytest.mark.parametrize(
    ("row", "text", "default", "lenient"),
    [
        ({"expected_answer": "4"}, "4", 0.0, 1.0),  # the tiny pipeline's bare answers
        ({"expected_answer": "4"}, "The answer is 4.", 0.0, 1.0),
        ({"expected_answer": "4"}, r"**\boxed{4", 0.0, 0.0),
        ({"expected_answer": "4"}, r"\boxed{4} then \boxed{5", 0.0, 1.0),
        ({"expected_answer": "4"}, r"<think>\boxed{4}</think>", 1.0, 0.0),
        ({"expected_answer": "4"}, r"\boxed{4}", 1.0, 1.0),
    ],
)
def test_math_lenient_extraction_is_opt_in(
    reward_server: RewardServer, row: dict[str, Any], text: str, default: float, lenient: float
) -> None:
    body = _verify(reward_server.http_url, "math", row, text)
    assert body["reward"] == default, body["verifier_info"]
    body = _verify(reward_server.http_url, "math", {**row, "extraction": "lenient"}, text)
    assert body["reward"] == lenient, body["verifier_info"]


SCHEMA = json.dumps(
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}}
)


@pytest.mark.parametrize(
    ("text", "default", "lenient"),
    [
        ('```json\n{"a": 1, "b": "x"}\n```', 0.0, 1.0),
        ('{"a": 1}', 0.0, 1.0),  # NeMo-Gym makes every listed property required
        ('{"a": 1, "b": "x", "c": 2}', 0.0, 1.0),  # ... and allows no others
        ('{"a": 1, "b": "x"}', 1.0, 1.0),
    ],
)
def test_structured_lenient_extraction_is_opt_in(
    reward_server: RewardServer, text: str, default: float, lenient: float
) -> None:
    row = {"schema_str": SCHEMA}
    body = _verify(reward_server.http_url, "structured_outputs", row, text)
    assert body["reward"] == default, body["verifier_info"]
    body = _verify(
        reward_server.http_url, "structured_outputs", {**row, "extraction": "lenient"}, text
    )
    assert body["reward"] == lenient, body["verifier_info"]


def test_lenient_is_refused_for_other_formats(stub: reward_pb2_grpc.RewardServiceStub) -> None:
    from reward_support import score_request

    row = {"schema_str": SCHEMA, "schema_type": "yaml", "extraction": "lenient"}
    with pytest.raises(grpc.RpcError) as err:
        stub.Score(score_request("structured_outputs", row, "a: 1"), timeout=30)
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "row.extraction" in (err.value.details() or "")
