"""The structured-output `/verify` hot path (issue 28): what a request costs besides its
check is gone without changing what is refused or scored. Speed itself is measured in
bench/reward.py (`*_vs_nemo_gym` rows), not here: these tests check the mechanisms.

- `JsonCheck` counts a clean body without building a field path per value, and gives the
  exact walk's counts and errors on every value (the quick walk defers to it on anything
  it could refuse);
- POST /verify and /{env}/verify are plain Starlette routes at the front of the table,
  not FastAPI routes (dependency solving for a bare Request);
- the service freezes what start-up built out of the garbage collector's full passes.
"""

from __future__ import annotations

import asyncio
import gc
import json
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from rlfleet_core.errors import InvalidArgument
from rlfleet_reward import limits as limits_module
from rlfleet_reward.config import LimitsConfig, RewardServiceConfig
from rlfleet_reward.http_face import add_routes
from rlfleet_reward.limits import JsonCheck, loads
from rlfleet_reward.service import RewardService
from starlette.routing import Route

_LIMITS = LimitsConfig()


def _verify_body(text: str = '{"id": 1}') -> dict[str, Any]:
    return {
        "schema_str": json.dumps({"type": "object", "properties": {"id": {"type": "integer"}}}),
        "responses_create_params": {"input": [{"role": "user", "content": "q"}]},
        "response": {
            "id": "r",
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                }
            ],
            "usage": {"output_tokens": 3, "details": None, "ratio": 0.5, "ok": True},
        },
    }


def test_clean_body_is_checked_without_field_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    # The exact walk clips every key into its path: 26 values cost more than the check.
    calls = 0
    real_clip = limits_module.clip

    def counting_clip(text: str, limit: int = 100) -> str:
        nonlocal calls
        calls += 1
        return real_clip(text, limit)

    monkeypatch.setattr(limits_module, "clip", counting_clip)
    check = JsonCheck(_LIMITS)
    chars = check.check(_verify_body(), "")
    assert calls == 0
    reference = JsonCheck(_LIMITS)
    reference.walk(_verify_body(), "", 0)
    assert (check.nodes, chars) == (reference.nodes, reference.chars)


# Values the quick walk must hand to the exact one (or count exactly as it does).
_CASES: list[tuple[str, str]] = [
    ("clean", json.dumps(_verify_body())),
    ("unicode", json.dumps({"k\u00e9": ["\u00e9t\u00e9", {"\u4e2d": "\u6587"}]})),
    ("surrogate-value", '{"a": {"b": ["ok", "\\ud800"]}}'),
    ("surrogate-key", '{"a": [{"\\udfff": 1}]}'),
    ("nan", '{"a": [1.5, NaN]}'),
    ("infinity-deep", '{"a": {"b": {"c": -Infinity}}}'),
    ("big-int", '{"a": [' + "9" * 1001 + "]}"),
    ("big-int-ok", '{"a": [' + "9" * 1000 + "]}"),
    ("too-deep", "[" * 33 + "]" * 33),
    ("deep-ok", "[" * 32 + "]" * 32),
    ("field-items", json.dumps({"x": {"instruction_id_list": list(range(257))}})),
    ("field-items-elsewhere", json.dumps({"x": {"other": list(range(300))}})),
    ("json-items", json.dumps({"x": list(range(10_001))})),
    ("scalar-top", '"\\ud800"'),
    ("scalar-ok", "3"),
    ("empty", "{}"),
    ("bools-nulls", '[true, false, null, {"a": null}]'),
]


def _outcome(limits: LimitsConfig, text: str, exact: bool) -> tuple[Any, ...]:
    check = JsonCheck(limits)
    check.nodes = 7  # counts carry across calls of one request
    try:
        value = loads(text, "", limits)
        if exact:
            before = check.chars
            check.walk(value, "body", 0)
            chars = check.chars - before
        else:
            chars = check.check(value, "body")
    except InvalidArgument as exc:
        return (type(exc).__name__, exc.field, exc.message)
    return ("ok", check.nodes, chars)


@pytest.mark.parametrize(("name", "text"), _CASES, ids=[c[0] for c in _CASES])
def test_quick_walk_agrees_with_the_exact_walk(name: str, text: str) -> None:
    assert _outcome(_LIMITS, text, exact=False) == _outcome(_LIMITS, text, exact=True)


def test_node_limit_across_calls_agrees() -> None:
    tight = LimitsConfig(max_json_nodes=100)
    text = json.dumps([[i, i] for i in range(40)])  # 121 nodes: over from the 14th array
    assert _outcome(tight, text, exact=False) == _outcome(tight, text, exact=True)
    assert _outcome(tight, text, exact=False)[0] == "TooLarge"
    small = json.dumps([[1, 2]] * 30)  # 91 nodes + 7 already counted: within
    assert _outcome(tight, small, exact=False) == ("ok", 98, 0)


def test_verify_routes_are_plain_routes_at_the_front() -> None:
    app = FastAPI()
    config = RewardServiceConfig(environments=["structured_outputs"])
    service = RewardService(config)
    add_routes(app, service.gateway)
    first = app.router.routes[:2]
    assert [(type(r), r.path) for r in first] == [(Route, "/verify"), (Route, "/{env}/verify")]
    assert not any(isinstance(r, APIRoute) and r.path.endswith("/verify") for r in app.routes)
    client = TestClient(app)
    # Still the same answers: a scored body, a refused one, a wrong method. (The check
    # runs in the pool here: the test client's loop is not on the main thread.)
    assert client.get("/verify").status_code == 405
    refused = client.post("/structured_outputs/verify", content=b"[1,")
    assert refused.status_code == 422 and refused.json()["field"] == ""
    unknown = client.post("/nope/verify", json=_verify_body())
    assert unknown.status_code == 422 and unknown.json()["field"] == "env"


def test_service_start_freezes_startup_objects() -> None:
    config = RewardServiceConfig.model_validate(
        {"environments": ["structured_outputs"], "pool": {"workers": 1}}
    )
    service = RewardService(config)
    gc.unfreeze()
    try:

        async def start_and_stop() -> int:
            await service.start()
            frozen = gc.get_freeze_count()
            await service.stop()
            return frozen

        assert asyncio.run(start_and_stop()) > 0
    finally:
        gc.unfreeze()
