"""A scripted judge over real HTTP (aiohttp, loopback) for the GenRM arithmetic tests: it
reads `quality=<q>` in each response shown and answers a verdict from the two qualities,
so every reward is hand-computable. Only for arithmetic unit tests (issue 17)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

QUALITY = re.compile(r"quality=(\d)")


def verdict_by_quality(user: str) -> str:
    """score = quality; ranking 2 / 5 for a clear winner, 3 on equal quality (a judge
    biased towards whatever it sees first)."""
    first, second = (int(q) for q in QUALITY.findall(user)[:2])
    ranking = 2 if first > second else 5 if first < second else 3
    return json.dumps({"score_1": first, "score_2": second, "ranking": ranking})


@dataclass
class ScriptedJudge:
    answer: Callable[[str], str] = verdict_by_quality
    """Chat text -> the judge's answer text."""
    statuses: list[int] = field(default_factory=list)
    """HTTP statuses to answer first, one per request (then 200)."""
    hang: bool = False
    finish_reason: str | None = "stop"
    """The `finish_reason` answered (None: the key is left out)."""
    requests: list[dict[str, Any]] = field(default_factory=list)
    authorization: list[str | None] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        self.authorization.append(request.headers.get("Authorization"))
        if self.hang:
            await asyncio.sleep(3600)
        if self.statuses:
            status = self.statuses.pop(0)
            return web.json_response({"error": {"message": f"scripted {status}"}}, status=status)
        text = "\n".join(m["content"] for m in body["messages"])
        content = self.answer(text)
        choice: dict[str, Any] = {"message": {"role": "assistant", "content": content}}
        if self.finish_reason is not None:
            choice["finish_reason"] = self.finish_reason
        return web.json_response({"choices": [choice]})


@asynccontextmanager
async def serve_judge(judge: ScriptedJudge) -> AsyncIterator[str]:
    """Serves `judge` on a free loopback port; yields its base URL (…/v1)."""
    app = web.Application()
    app.router.add_post("/v1/chat/completions", judge.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        await runner.cleanup()
