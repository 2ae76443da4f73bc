"""The judge client: OpenAI-compatible chat completions, with deadlines, bounded retries,
a concurrency limit and an answer cache.

aiohttp, not httpx: it is already this service's dependency (its load generator), and
httpx's async pool was measured to collapse past ~16 concurrent requests (pyproject.toml).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import random
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

import aiohttp
from prometheus_client import Counter
from rlfleet_core.auth import auth_headers
from rlfleet_core.metrics import REGISTRY

from rlfleet_reward.judge.config import JudgeConfig

logger = logging.getLogger(__name__)

JUDGE_CALLS = Counter(
    "rlfleet_reward_judge_calls",
    "Judge requests by outcome: ok, cache_hit, timeout, connect_error, http_<status>, "
    "malformed, truncated (finish_reason not stop) (HTTP attempts; a retried call counts "
    "each attempt).",
    ["outcome"],
    registry=REGISTRY,
)
JUDGE_PARSE_FAILURES = Counter(
    "rlfleet_reward_judge_parse_failures",
    "Judge answers that did not parse as a verdict, by environment.",
    ["env"],
    registry=REGISTRY,
)


class JudgeError(RuntimeError):
    """The judge gave no usable answer; the message is the reason (status, timeout...)."""


Messages = list[dict[str, str]]
T = TypeVar("T")


class JudgeClient:
    """Chat completions against `config.base_url`; one per gateway, shared by every
    environment (so `max_concurrency` bounds the judge's load from this process)."""

    def __init__(self, config: JudgeConfig) -> None:
        if not config.base_url:
            raise ValueError("judge.base_url is not set")
        self.config = config
        self.url = config.base_url.rstrip("/") + "/chat/completions"
        self._headers = {"Content-Type": "application/json"}
        if config.api_key_env:
            key = os.environ.get(config.api_key_env)
            if not key:
                raise ValueError(
                    f"judge.api_key_env names {config.api_key_env}, which is not set or empty"
                )
            self._headers["Authorization"] = f"Bearer {key}"
        if config.fleet_token:  # our own rollout in the fleet: it checks the fleet's token
            self._headers.update(auth_headers())
        self._slots = asyncio.Semaphore(config.max_concurrency)
        self._cache: OrderedDict[str, str] = OrderedDict()
        self._session: aiohttp.ClientSession | None = None
        self.calls = 0
        """HTTP attempts made (for tests and reports; the metric has the outcomes)."""

    def _prefill(self, opening: str) -> str:
        """What of the verdict's `opening` is written for the judge (none unless
        `judge.prefill`)."""
        return opening if self.config.prefill else ""

    def _body(self, messages: Messages, opening: str = "") -> dict[str, Any]:
        c = self.config
        prefill = self._prefill(opening)
        if prefill:  # the verdict's start, which the judge continues (vLLM's chat extension)
            messages = [*messages, {"role": "assistant", "content": prefill}]
        body: dict[str, Any] = {
            "model": c.model,
            "messages": messages,
            "max_tokens": c.max_tokens,
            "temperature": c.temperature,
            "top_p": c.top_p,
            "n": 1,
        }
        if c.seed is not None:
            body["seed"] = c.seed
        if prefill:
            body["add_generation_prompt"] = False
            body["continue_final_message"] = True
        return body

    @staticmethod
    def cache_key(body: dict[str, Any]) -> str:
        """Model + messages + every sampling parameter: a change in any is a new call."""
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()

    def key_of(self, messages: Messages, opening: str = "") -> str:
        """`cache_key` of `chat(messages, ..., opening)` (pure: may run in a thread)."""
        return self.cache_key(self._body(messages, opening))

    def cached(self, messages: Messages, opening: str = "", key: str | None = None) -> bool:
        """Whether `chat(messages, ...)` would be answered from the cache, without a call."""
        return (key or self.key_of(messages, opening)) in self._cache

    async def chat(
        self,
        messages: Messages,
        timeout_s: float,
        parse: Callable[[str], T],
        opening: str = "",
        key: str | None = None,
    ) -> T:
        """`parse` of the judge's answer text (choices[0].message.content; after `opening`,
        the verdict's start, when `judge.prefill` wrote it for the judge) within
        `timeout_s`, or JudgeError saying why not (also for an answer that did not end
        with finish_reason `stop`). `key`: `cache_key` of this call, when the caller
        computed it off the event loop. Only answers `parse` accepts are cached:
        a retried group asks again what failed instead of replaying the failure."""
        deadline = time.monotonic() + timeout_s
        body = self._body(messages, opening)
        prefill = self._prefill(opening)
        key = key or self.cache_key(body)
        if key in self._cache:
            self._cache.move_to_end(key)
            JUDGE_CALLS.labels("cache_hit").inc()
            return parse(self._cache[key])
        try:
            async with asyncio.timeout(timeout_s):
                async with self._slots:
                    text = prefill + await self._with_retries(body, deadline)
        except TimeoutError:
            JUDGE_CALLS.labels("timeout").inc()
            raise JudgeError(f"the judge did not answer within {timeout_s:.1f}s") from None
        result = parse(text)  # raises before caching an answer the caller cannot use
        if self.config.cache_size:
            self._cache[key] = text
            while len(self._cache) > self.config.cache_size:
                self._cache.popitem(last=False)
        return result

    async def _with_retries(self, body: dict[str, Any], deadline: float) -> str:
        backoff = self.config.backoff_s
        attempt = 0
        while True:
            attempt += 1
            try:
                return await self._post(body, deadline)
            except _Retryable as exc:
                if attempt > self.config.max_retries:
                    raise JudgeError(f"{exc} (after {attempt} attempts)") from None
                pause = backoff * (1 + random.random() / 2)
                if time.monotonic() + pause >= deadline:
                    raise JudgeError(f"{exc} (no time left to retry)") from None
                logger.info("judge attempt %d failed (%s); retrying in %.2fs", attempt, exc, pause)
                await asyncio.sleep(pause)
                backoff *= 2

    async def _post(self, body: dict[str, Any], deadline: float) -> str:
        c = self.config
        left = deadline - time.monotonic()
        if left <= 0:
            raise JudgeError("the budget ran out before the judge could be asked")
        timeout = aiohttp.ClientTimeout(
            total=min(c.request_timeout_s, left), connect=min(c.connect_timeout_s, left)
        )
        self.calls += 1
        try:
            async with self._client().post(
                self.url, json=body, headers=self._headers, timeout=timeout
            ) as response:
                raw = await response.content.read(c.max_answer_chars + 1)
                status = response.status
        except TimeoutError:
            JUDGE_CALLS.labels("timeout").inc()
            raise JudgeError(
                f"the judge did not answer within {timeout.total:.1f}s ({self.url})"
            ) from None
        except aiohttp.ClientError as exc:
            JUDGE_CALLS.labels("connect_error").inc()
            raise _Retryable(f"cannot reach the judge at {self.url}: {exc}") from None
        if status != 200:
            JUDGE_CALLS.labels(f"http_{status}").inc()
            detail = raw[:300].decode("utf-8", "replace")
            message = f"the judge answered HTTP {status}: {detail}"
            if status == 429 or status >= 500:
                raise _Retryable(message)
            raise JudgeError(message)
        if len(raw) > c.max_answer_chars:
            JUDGE_CALLS.labels("malformed").inc()
            raise JudgeError(
                f"the judge's reply is over judge.max_answer_chars ({c.max_answer_chars})"
            )
        try:
            choice = json.loads(raw)["choices"][0]
            content = choice["message"]["content"]
            finish = choice.get("finish_reason")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            JUDGE_CALLS.labels("malformed").inc()
            raise JudgeError(
                f"the judge's reply is not a chat completion: {raw[:200].decode('utf-8', 'replace')!r}"
            ) from None
        if not isinstance(content, str):
            JUDGE_CALLS.labels("malformed").inc()
            raise JudgeError(f"the judge's message content is {type(content).__name__}, not text")
        if finish != "stop":
            # An answer cut off by max_tokens (or of unknown ending) may stop mid-thought,
            # before the judge's conclusion: a label it was still weighing is no verdict.
            JUDGE_CALLS.labels("truncated").inc()
            shown = "missing" if finish is None else repr(finish)[:40]
            hint = f" (judge.max_tokens is {c.max_tokens})" if finish == "length" else ""
            raise JudgeError(f"the judge's answer did not end (finish_reason {shown}){hint}")
        JUDGE_CALLS.labels("ok").inc()
        return content

    def _client(self) -> aiohttp.ClientSession:
        # Made on first use: a session belongs to the event loop it was made in.
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.config.max_concurrency)
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


class _Retryable(Exception):
    """A failure worth another attempt: no connection, HTTP 5xx or 429."""
