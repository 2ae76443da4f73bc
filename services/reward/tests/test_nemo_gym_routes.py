"""The resources-server routes a NeMo-Gym agent calls besides /verify: `/seed_session`,
`/close_session`, `/aggregate_metrics`, `/reverify_mode`, at the root and per environment, over real HTTP;
and the aggregation itself against NeMo-Gym's own `compute_aggregate_metrics` where the
side environment is available (RLFLEET_NEMO_GYM_PYTHON, RLFLEET_NEMO_GYM_SRC)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
from reward_support import (
    RewardServer,
    nemo_request,
    nemo_response,
    start_reward_server,
    stop_reward_server,
)
from rlfleet_reward.nemo_gym_metrics import aggregate_metrics


@pytest.fixture(scope="module")
def http(reward_server: RewardServer) -> httpx.Client:
    with httpx.Client(base_url=reward_server.http_url, timeout=60) as client:
        yield client


@pytest.mark.parametrize("prefix", ["", "/math", "/math_with_judge"])
def test_seed_session_answers_both_request_shapes(http: httpx.Client, prefix: str) -> None:
    # An agent's /run seeds with its own body (or none) and gets {} back ...
    assert http.post(f"{prefix}/seed_session", json={"anything": 1}).json() == {}
    reply = http.post(f"{prefix}/seed_session")
    assert reply.status_code == 200 and reply.json() == {}
    # ... an Environment Server seeds with a session id and gets it back.
    seed = {"resources_session_id": "s-1", "episode_id": "e", "task_id": {}, "task_data": {}}
    assert http.post(f"{prefix}/seed_session", json=seed).json() == {"resources_session_id": "s-1"}
    close = {"resources_session_id": "s-1", "episode_id": "e"}
    assert http.post(f"{prefix}/close_session", json=close).json() == {
        "resources_session_id": "s-1"
    }


@pytest.mark.parametrize("prefix", ["", "/code"])
def test_reverify_mode_is_stateless(http: httpx.Client, prefix: str) -> None:
    reply = http.get(f"{prefix}/reverify_mode")
    assert reply.status_code == 200 and reply.json() == "stateless"


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/seed_session", [1], ""),
        ("/seed_session", {"resources_session_id": 5}, "resources_session_id"),
        ("/nope/seed_session", {}, "env"),
        ("/close_session", {}, "resources_session_id"),
        ("/math/close_session", [], "resources_session_id"),
        ("/aggregate_metrics", {}, "verify_responses"),
        ("/aggregate_metrics", {"verify_responses": [1]}, "verify_responses[0]"),
        ("/aggregate_metrics", {"verify_responses": [{"x": 1}]}, "verify_responses[0].reward"),
        (
            "/math/aggregate_metrics",
            {"verify_responses": [{"reward": 1, "_ng_task_index": "a"}]},
            "verify_responses[0]._ng_task_index",
        ),
        ("/nope/aggregate_metrics", {"verify_responses": []}, "env"),
    ],
)
def test_bad_bodies_get_422_naming_the_field(
    http: httpx.Client, path: str, body: Any, field: str
) -> None:
    reply = http.post(path, json=body)
    assert reply.status_code == 422, reply.text
    assert reply.json()["field"] == field


def test_malformed_json_is_refused(http: httpx.Client) -> None:
    reply = http.post(
        "/aggregate_metrics", content=b"{nope", headers={"content-type": "application/json"}
    )
    assert reply.status_code == 422 and reply.json()["field"] == ""


def test_agent_flow_seed_verify_aggregate(reward_server: RewardServer) -> None:
    """What a NeMo-Gym agent's rollout collection does, over real HTTP with aiohttp (their
    client): per task and rollout, seed a session and verify; then aggregate the verify
    responses it got back."""
    tasks = [("7", ["\\boxed{7}", "\\boxed{8}"]), ("2", ["\\boxed{2}", "\\boxed{2}"])]

    async def collect() -> tuple[list[dict[str, Any]], dict[str, Any]]:
        async with aiohttp.ClientSession(
            base_url=reward_server.http_url, timeout=aiohttp.ClientTimeout(total=60)
        ) as session:
            verified = []
            for task, (expected, answers) in enumerate(tasks):
                for rollout, text in enumerate(answers):
                    async with session.post("/math_with_judge/seed_session", json={}) as r:
                        assert r.status == 200 and await r.json() == {}
                    body = nemo_request(
                        "q",
                        nemo_response(text, output_tokens=3 + rollout),
                        expected_answer=expected,
                        _ng_task_index=task,
                        _ng_rollout_index=rollout,
                    )
                    async with session.post("/math_with_judge/verify", json=body) as r:
                        assert r.status == 200
                        verified.append(await r.json())
            payload = {"verify_responses": verified}
            async with session.post("/math_with_judge/aggregate_metrics", json=payload) as r:
                assert r.status == 200
                return verified, await r.json()

    verified, metrics = asyncio.run(collect())
    assert [v["reward"] for v in verified] == [1.0, 0.0, 1.0, 1.0]
    assert [v["_ng_task_index"] for v in verified] == [0, 0, 1, 1]  # echoed back
    agent = metrics["agent_metrics"]
    assert agent["mean/reward"] == 0.75 and agent["num_repeats"] == 2
    assert agent["mean/output_tokens"] == 3.5
    assert agent["pass@1[avg-of-2]/accuracy"] == 75.0 and agent["pass@2/accuracy"] == 100.0
    assert [g["mean/reward"] for g in metrics["group_level_metrics"]] == [0.5, 1.0]
    assert metrics["key_metrics"]["mean/reward"] == 0.75
    assert metrics["perf_summary"] is None and metrics["repeat_level_metrics"] == []


def test_routes_need_the_token_when_one_is_set(tmp_path: Path) -> None:
    token = "dropin-test-token-0123456789abcdef"
    os.environ["RLFLEET_AUTH_TOKEN"] = token
    try:
        server = start_reward_server(tmp_path, ["pool.workers=1", "environments=[math]"], "auth")
    finally:
        del os.environ["RLFLEET_AUTH_TOKEN"]
    try:
        with httpx.Client(base_url=server.http_url, timeout=30) as client:
            for method, path in (
                ("POST", "/seed_session"),
                ("POST", "/math/seed_session"),
                ("POST", "/close_session"),
                ("POST", "/aggregate_metrics"),
                ("POST", "/math/aggregate_metrics"),
                ("GET", "/reverify_mode"),
            ):
                body = {"verify_responses": []} if "aggregate" in path else {}
                body = {"resources_session_id": "s"} if "close" in path else body
                kwargs: dict[str, Any] = {"json": body} if method == "POST" else {}
                assert client.request(method, path, **kwargs).status_code == 401, path
                authed = client.request(
                    method, path, headers={"authorization": f"Bearer {token}"}, **kwargs
                )
                assert authed.status_code == 200, (path, authed.text)
    finally:
        assert stop_reward_server(server) == 0, server.log()


# --- the aggregation, against NeMo-Gym's own ------------------------------------------

CASES: dict[str, list[dict[str, Any]]] = {
    "empty": [],
    "one": [{"reward": 1.0}],
    "groups": [
        {
            "reward": 1.0,
            "_ng_task_index": 0,
            "_ng_rollout_index": 0,
            "response": {"usage": {"output_tokens": 5, "input_tokens": 2}},
        },
        {
            "reward": 0.0,
            "_ng_task_index": 0,
            "_ng_rollout_index": 1,
            "response": {"usage": {"output_tokens": 9, "input_tokens": 2}},
        },
        {
            "reward": 1.0,
            "_ng_task_index": 1,
            "_ng_rollout_index": 0,
            "extracted": True,
            "response": {"usage": {"output_tokens": 4, "input_tokens": 3}},
        },
        {
            "reward": 1.0,
            "_ng_task_index": 1,
            "_ng_rollout_index": 1,
            "extracted": False,
            "response": {"usage": {"output_tokens": 6, "input_tokens": 3}},
        },
    ],
    "masked": [
        {"reward": 0.5, "_ng_task_index": 0},
        {"reward": 0.0, "_ng_task_index": 1, "mask_sample": True},
    ],
    "all_masked": [{"reward": 0.0, "mask_sample": True}],
}

# Ours leaves these out (nemo_gym_metrics.py says so); everything else must match.
_SKIPPED = ("_across_repeats/", "sample", "repeat_level_metrics")


def _comparable(part: Any) -> Any:
    if isinstance(part, dict):
        return {
            k: _comparable(v)
            for k, v in part.items()
            if not any(s in k for s in _SKIPPED) and not k.startswith(("pass@", "per_sample"))
        }
    if isinstance(part, list):
        return [_comparable(p) for p in part]
    return part


@pytest.mark.skipif(
    not (os.environ.get("RLFLEET_NEMO_GYM_PYTHON") and os.environ.get("RLFLEET_NEMO_GYM_SRC")),
    reason="needs NeMo-Gym's side environment (services/reward/parity/side_env.sh)",
)
def test_aggregation_matches_nemo_gym() -> None:
    script = (
        "import json, sys\n"
        "from nemo_gym.reward_profile import compute_aggregate_metrics\n"
        "cases = json.load(sys.stdin)\n"
        "print(json.dumps({k: compute_aggregate_metrics(v).model_dump() for k, v in cases.items()}))\n"
    )
    done = subprocess.run(
        [os.environ["RLFLEET_NEMO_GYM_PYTHON"], "-W", "ignore", "-c", script],
        input=json.dumps(CASES),
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.environ["RLFLEET_NEMO_GYM_SRC"]},
        timeout=300,
        check=True,
    )
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    for name, responses in CASES.items():
        ours = aggregate_metrics({"verify_responses": responses})
        assert_close(_comparable(ours), _comparable(theirs[name]), name)


def assert_close(ours: Any, theirs: Any, where: str) -> None:
    if isinstance(theirs, dict):
        assert isinstance(ours, dict) and sorted(ours) == sorted(theirs), where
        for key in theirs:
            assert_close(ours[key], theirs[key], f"{where}.{key}")
    elif isinstance(theirs, list):
        assert isinstance(ours, list) and len(ours) == len(theirs), where
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert_close(a, b, f"{where}[{i}]")
    elif isinstance(theirs, float):
        assert ours == pytest.approx(theirs), where
    else:
        assert ours == theirs, where
