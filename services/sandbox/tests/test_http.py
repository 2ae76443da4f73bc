"""The NeMo-Skills-compatible HTTP face, with the request shapes its clients send."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from sandbox_testlib import Harness, make_config, serving


async def execute(
    harness: Harness,
    code: str,
    language: str = "python3",
    headers: dict[str, str] | None = None,
    **fields: object,
) -> httpx.Response:
    """POST /execute with `code` in `language` and any other body `fields`."""
    body = {"generated_code": code, "language": language, **fields}
    return await harness.http.post("/execute", json=body, headers=headers)


async def test_execute_python3_shapes(sandbox: Harness) -> None:
    response = await execute(sandbox, "print(input()[::-1])", timeout=5, std_input="abc")
    assert response.status_code == 200
    body = response.json()
    assert {k: body[k] for k in ("process_status", "stdout", "stderr")} == {
        "process_status": "completed",
        "stdout": "cba\n",
        "stderr": "",
    }
    error = (await execute(sandbox, "1/0", language="python")).json()
    assert error["process_status"] == "error" and "ZeroDivisionError" in error["stderr"]
    slow = (await execute(sandbox, "while True: pass", timeout=0.3)).json()
    assert slow["process_status"] == "timeout"


async def test_memory_kill_is_not_reported_as_completed(sandbox: Harness) -> None:
    body = (await execute(sandbox, "x = bytearray(64 << 30)")).json()
    assert body["process_status"] == "error" and body["status"] == "MEMORY"


async def test_bash_and_unsupported_language(sandbox: Harness) -> None:
    body = (await execute(sandbox, "echo $((6*7))", language="bash")).json()
    assert body["stdout"] == "42\n" and body["process_status"] == "completed"
    response = await execute(sandbox, "theorem x : True := trivial", language="lean4")
    assert response.status_code == 400
    body = response.json()
    assert body["process_status"] == "failed"
    assert "language: 'lean4' is not supported" in body["stderr"] and "python3" in body["stderr"]
    missing = await sandbox.http.post("/execute", json={"language": "python3"})
    assert missing.status_code == 422
    negative = await sandbox.http.post("/execute", json={"generated_code": "1", "timeout": -1})
    assert negative.status_code == 400 and negative.json()["stderr"].startswith(
        "timeout: must be >= 0"
    )


async def test_ipython_session_in_body_three_calls_then_delete(sandbox: Harness) -> None:
    async def call(code: str) -> dict[str, Any]:
        response = await execute(sandbox, code, "ipython", session_id="rollout-7", timeout=5)
        body: dict[str, Any] = response.json()
        return body

    assert (await call("counter = 1"))["process_status"] == "completed"
    await call("counter += 1")
    third = await call("counter * 21")
    assert third["stdout"] == "42\n"
    listed = (await sandbox.http.get("/sessions")).json()["sessions"]
    assert [s["session_id"] for s in listed] == ["rollout-7"] and listed[0]["calls"] == 3
    assert (await sandbox.http.delete("/sessions/rollout-7")).json() == {
        "session_id": "rollout-7",
        "closed": True,
    }
    assert (await sandbox.http.delete("/sessions/rollout-7")).status_code == 404
    after = await call("print(counter)")
    assert after["process_status"] == "error" and "NameError" in after["stderr"]  # a fresh session


async def test_session_id_in_header(sandbox: Harness) -> None:
    headers = {"X-Session-ID": "hdr-1"}
    for code in ("a = [1]", "a.append(2)"):
        await execute(sandbox, code, "ipython", headers=headers)
    body = (
        await execute(sandbox, "print(a)", "ipython", headers=headers, traceback_verbosity="Plain")
    ).json()
    assert body["stdout"] == "[1, 2]\n"
    # Without a session id, ipython runs one-shot: nothing is remembered.
    stateless = (await execute(sandbox, "print(a)", "ipython")).json()
    assert "NameError" in stateless["stderr"]


async def test_health_and_session_cap_over_http() -> None:
    async with serving(
        make_config(sessions={"max_sessions": 1, "reap_interval_s": 0.1})
    ) as harness:
        assert (await harness.http.get("/health")).json()["status"] == "healthy"
        first = await execute(harness, "1", "ipython", session_id="one")
        assert first.status_code == 200
        second = await execute(harness, "1", "ipython", session_id="two")
        assert second.status_code == 429
        assert (
            second.json()["process_status"] == "failed"
            and "max_sessions" in second.json()["stderr"]
        )
        bad = await execute(harness, "1", "ipython", session_id="no spaces")
        assert bad.status_code == 400


async def test_concurrent_http_calls(sandbox: Harness) -> None:
    responses = await asyncio.gather(*(execute(sandbox, f"print({i} ** 2)") for i in range(8)))
    assert [r.json()["stdout"] for r in responses] == [f"{i**2}\n" for i in range(8)]
