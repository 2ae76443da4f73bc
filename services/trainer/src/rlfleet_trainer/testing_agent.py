"""TEST DOUBLE of the reward gateway's episode RPCs (OpenEpisode, Step, CloseEpisode), for
the multi-turn tests: `DoubleEpisodes` is `testing.DoubleReward` plus a tiny deterministic
tool world, served over real gRPC by `testing.serve_doubles(..., reward=DoubleEpisodes())`
or on its own by `serve_servicer`; and `ScriptedRollout`, a rollout double replaying
scripted model turns.

The world: a key-value store. Tools `set_value(key, value)`, `add(key, amount)` (numbers),
`get_value(key)`, and `submit()` (ends the episode). The row's `goal` (a JSON object) is the
end state to reach: CloseEpisode gives reward 1.0 when the store equals it, else 0.0. A row
may hold `initial` (the store's start). Bad arguments and unknown tools are error results,
as the real gateway's are, and CloseEpisode's info counts the calls by kind
(`calls/<kind>`, the gateway's names). It is not the real reward service (services/reward).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc import aio
from rlfleet_core.auth import CLIENT_KEY_HEADER, grpc_client_key
from rlfleet_proto.v1 import reward_pb2, rollout_pb2, rollout_pb2_grpc

from rlfleet_trainer.testing import DoubleReward

KV_TOOLS = (
    reward_pb2.ToolSpec(
        name="set_value",
        description="Set key to value.",
        parameters_json=json.dumps(
            {
                "type": "object",
                "properties": {"key": {"type": "string"}, "value": {}},
                "required": ["key", "value"],
            }
        ),
    ),
    reward_pb2.ToolSpec(
        name="add",
        description="Add amount to the number at key (0 if unset).",
        parameters_json=json.dumps(
            {
                "type": "object",
                "properties": {"key": {"type": "string"}, "amount": {"type": "number"}},
                "required": ["key", "amount"],
            }
        ),
    ),
    reward_pb2.ToolSpec(
        name="get_value",
        description="The value at key.",
        parameters_json=json.dumps(
            {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}
        ),
    ),
    reward_pb2.ToolSpec(name="submit", description="End the task.", parameters_json="{}"),
)


def tool_call(name: str, **arguments: Any) -> str:
    """One Hermes-format tool call, as a scripted model turn writes it."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def kv_rows(n: int) -> list[dict[str, Any]]:
    """n rows of the `kv` episode environment, each asking for a = 3."""
    return [
        {
            "id": f"kv{i}",
            "env": "kv",
            "responses_create_params": {"input": [{"role": "user", "content": f"a=3 ({i})"}]},
            "goal": {"a": 3},
        }
        for i in range(n)
    ]


@dataclass
class KvEpisode:
    env: str
    goal: dict[str, Any]
    store: dict[str, Any] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    """(name, arguments_json) of every call Step ran."""
    kinds: dict[str, int] = field(default_factory=dict)
    """Calls by kind: ok, unknown_tool, invalid_arguments, tool_error."""


def run_tool(store: dict[str, Any], name: str, arguments_json: str) -> tuple[str, str]:
    """(content, kind) of one call on `store`; every kind but `ok` is an error result."""
    try:
        args = json.loads(arguments_json or "{}")
    except json.JSONDecodeError:
        return "arguments are not JSON", "invalid_arguments"
    if not isinstance(args, dict):
        return "arguments must be an object", "invalid_arguments"
    key = args.get("key")
    if name == "submit":
        return "submitted", "ok"
    if name not in {"set_value", "add", "get_value"}:
        return f"unknown tool {name!r}", "unknown_tool"
    if not isinstance(key, str):
        return f"{name}: key must be a string", "invalid_arguments"
    if name == "set_value" and "value" in args:
        store[key] = args["value"]
        return "ok", "ok"
    if name == "add" and isinstance(args.get("amount"), int | float):
        current = store.get(key, 0)
        if not isinstance(current, int | float):
            return f"add: {key} is not a number", "tool_error"
        store[key] = current + args["amount"]
        return json.dumps(store[key]), "ok"
    if name == "get_value":
        return json.dumps(store.get(key)), "ok"
    return f"{name}: bad arguments", "invalid_arguments"


class DoubleEpisodes(DoubleReward):
    def __init__(self, tools: tuple[str, ...] | None = None) -> None:
        """`tools`: the names of KV_TOOLS an episode offers (default all; fewer make a
        shorter prompt)."""
        super().__init__()
        self.tools = [t for t in KV_TOOLS if tools is None or t.name in tools]
        self.episodes: dict[str, KvEpisode] = {}
        self.closed: dict[str, KvEpisode] = {}
        self.abandoned: list[str] = []
        self.scored: list[str] = []
        self.responses: dict[str, reward_pb2.Response] = {}
        """Episode id -> the last turn CloseEpisode got."""
        self.step_faults: list[grpc.StatusCode] = []
        """Status codes the next Step calls end with, one each."""
        self.owners: dict[str, str] = {}
        """Episode id -> the client key that opened it (as the gateway, every later call on
        the episode must send the same key: keyless is INVALID_ARGUMENT, another NOT_FOUND)."""
        self._ids = itertools.count()

    async def OpenEpisode(
        self, request: reward_pb2.OpenEpisodeRequest, context: aio.ServicerContext[Any, Any]
    ) -> reward_pb2.Episode:
        try:
            row = json.loads(request.row_json)
            goal, initial = row["goal"], row.get("initial", {})
            if not isinstance(goal, dict) or not isinstance(initial, dict):
                raise TypeError
        except (json.JSONDecodeError, KeyError, TypeError):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "row_json: needs a `goal` object")
            raise AssertionError from None  # unreachable
        episode_id = f"ep{next(self._ids)}"
        self.owners[episode_id] = await self._client_key(context)
        self.episodes[episode_id] = KvEpisode(request.env, goal, dict(initial))
        return reward_pb2.Episode(episode_id=episode_id, tools=self.tools, idle_timeout_s=60.0)

    @staticmethod
    async def _client_key(context: aio.ServicerContext[Any, Any]) -> str:
        key = grpc_client_key(context)
        if not key:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"{CLIENT_KEY_HEADER}: is required for sessions"
            )
        return str(key)

    async def _episode(self, episode_id: str, context: aio.ServicerContext[Any, Any]) -> KvEpisode:
        key = await self._client_key(context)
        if episode_id not in self.episodes or self.owners.get(episode_id) != key:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"episode_id: no episode {episode_id}")
        return self.episodes[episode_id]

    async def Step(
        self, request: reward_pb2.StepRequest, context: aio.ServicerContext[Any, Any]
    ) -> reward_pb2.StepResult:
        episode = await self._episode(request.episode_id, context)
        if self.step_faults:
            await context.abort(self.step_faults.pop(0), "double told to fail this call")
        results, done = [], False
        for call in request.calls:
            episode.calls.append((call.name, call.arguments_json))
            content, kind = run_tool(episode.store, call.name, call.arguments_json)
            episode.kinds[kind] = episode.kinds.get(kind, 0) + 1
            error = kind != "ok"
            done = done or (call.name == "submit" and not error)
            results.append(
                reward_pb2.ToolResult(
                    call_id=call.call_id, name=call.name, content=content, error=error
                )
            )
        return reward_pb2.StepResult(results=results, done=done)

    async def CloseEpisode(
        self, request: reward_pb2.CloseEpisodeRequest, context: aio.ServicerContext[Any, Any]
    ) -> reward_pb2.ScoreResult:
        episode = await self._episode(request.episode_id, context)
        self.closed[request.episode_id] = self.episodes.pop(request.episode_id)
        if request.abandon:
            self.abandoned.append(request.episode_id)
            return reward_pb2.ScoreResult(request_id=request.episode_id, env=episode.env)
        self.scored.append(request.episode_id)
        self.responses[request.episode_id] = request.response
        return reward_pb2.ScoreResult(
            request_id=request.episode_id,
            env=episode.env,
            reward=float(episode.store == episode.goal),
            info={f"calls/{kind}": str(n) for kind, n in episode.kinds.items()},
        )


class ScriptedRollout(rollout_pb2_grpc.RolloutServiceServicer):
    """A rollout double that replays scripts of model turns (Generate only, n=1).

    Sample k (the `/k/` part of the trainer's request id `<prompt>/<k>/t<turn>`; 0 for a
    single-turn request, whose n samples are all the same) follows `scripts[k % len(scripts)]`; its next turn is the first of the script's responses not
    yet found, in order, in the decoded prompt, so the double keeps no state per
    trajectory. Each turn is the response's token ids plus the stop token; each token's
    logprob is `token_logprob(id)`, so tests can check the logprobs line up with the ids.
    """

    def __init__(self, tokenizer: Any, scripts: list[list[str]], stop_token: str) -> None:
        self.tokenizer = tokenizer
        self.scripts = scripts
        self.stop_id = int(tokenizer.convert_tokens_to_ids(stop_token))
        self.version = 0
        self.bump_version_each_call = False
        """Publish a new weight version after every Generate (in-flight updates)."""
        self.delay_s = 0.0
        self.requests: list[rollout_pb2.GenerateRequest] = []
        self.updates: list[int] = []

    @staticmethod
    def token_logprob(token_id: int) -> float:
        return -((token_id % 89) + 1) / 100

    def next_response(self, script: list[str], prompt: str) -> str | None:
        position = 0
        for response in script:
            found = prompt.find(response, position)
            if found < 0:
                return response
            position = found + len(response)
        return None

    async def Generate(
        self, request: rollout_pb2.GenerateRequest, context: aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[rollout_pb2.GenerateResult]:
        self.requests.append(request)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        parts = request.request_id.split("/")
        sample = int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else 0
        prompt = self.tokenizer.decode(request.prompt_token_ids, skip_special_tokens=False)
        response = self.next_response(self.scripts[sample % len(self.scripts)], prompt)
        if response is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "script exhausted")
            raise AssertionError  # unreachable
        ids = [*self.tokenizer.encode(response, add_special_tokens=False), self.stop_id]
        finish = rollout_pb2.FINISH_REASON_STOP
        if len(ids) > request.sampling.max_tokens:
            ids, finish = ids[: request.sampling.max_tokens], rollout_pb2.FINISH_REASON_LENGTH
        version = self.version
        if self.bump_version_each_call:
            self.version += 1
        for index in range(request.n):  # a single-turn group: n copies of the turn
            yield rollout_pb2.GenerateResult(
                request_id=request.request_id,
                sample_index=index,
                token_ids=ids,
                logprobs=[self.token_logprob(t) for t in ids],
                finish_reason=finish,
                weight_version_first=version,
                weight_version_last=version,
            )

    async def GetStatus(
        self, request: rollout_pb2.GetStatusRequest, context: aio.ServicerContext[Any, Any]
    ) -> rollout_pb2.RolloutStatus:
        return rollout_pb2.RolloutStatus(weight_version=self.version, engine="scripted")

    async def StreamWeights(
        self,
        request_iterator: AsyncIterator[rollout_pb2.WeightChunk],
        context: aio.ServicerContext[Any, Any],
    ) -> rollout_pb2.UpdateWeightsResponse:
        """Takes the update's version (it has no weights to load)."""
        version = None
        async for message in request_iterator:
            if message.HasField("header"):
                version = message.header.weight_version
        if version is None or version <= self.version:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"bad version {version}")
            raise AssertionError  # unreachable
        self.version = version
        self.updates.append(version)
        return rollout_pb2.UpdateWeightsResponse(weight_version=version)

    async def Pause(self, request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
        return rollout_pb2.PauseResponse()

    async def Resume(self, request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
        return rollout_pb2.ResumeResponse()
