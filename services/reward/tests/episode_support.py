"""Helpers for the episode tests: a caller (stub + its client key) and scripted calls."""

from __future__ import annotations

import json
import secrets
from typing import Any

from rlfleet_proto.v1 import reward_pb2, reward_pb2_grpc


class Caller:
    """One client of the episode API, identified by its own random client key."""

    def __init__(self, stub: reward_pb2_grpc.RewardServiceStub, key: str | None = None) -> None:
        self.stub = stub
        key = secrets.token_urlsafe(24) if key is None else key
        self.metadata = (("x-rlfleet-client-key", key),) if key else ()

    def open(self, env: str, row: dict[str, Any] | str) -> reward_pb2.Episode:
        row_json = row if isinstance(row, str) else json.dumps(row)
        request = reward_pb2.OpenEpisodeRequest(request_id="t", env=env, row_json=row_json)
        return self.stub.OpenEpisode(request, timeout=60, metadata=self.metadata)

    def step(self, episode_id: str, *calls: tuple[str, Any]) -> reward_pb2.StepResult:
        """Each call: (tool name, arguments as an object, or a raw string sent as is)."""
        request = reward_pb2.StepRequest(
            episode_id=episode_id,
            calls=[
                reward_pb2.ToolCall(
                    call_id=f"c{i}",
                    name=name,
                    arguments_json=args if isinstance(args, str) else json.dumps(args),
                )
                for i, (name, args) in enumerate(calls)
            ],
        )
        return self.stub.Step(request, timeout=120, metadata=self.metadata)

    def close(
        self, episode_id: str, text: str = "", abandon: bool = False
    ) -> reward_pb2.ScoreResult:
        request = reward_pb2.CloseEpisodeRequest(
            episode_id=episode_id, response=reward_pb2.Response(text=text), abandon=abandon
        )
        return self.stub.CloseEpisode(request, timeout=120, metadata=self.metadata)
