"""The RewardService.ScoreGroup contract on the caller's side: what makes a reply usable,
and a small blocking client that returns typed scores or raises.

Every caller (the trainer, the curriculum pass of data prep) fails the whole group on any
failed score, never a silent 0: a wrong reward would train the model on noise."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from rlfleet_core.client import connect_sync
from rlfleet_proto.v1 import reward_pb2, reward_pb2_grpc


class ScoreGroupFailed(RuntimeError):
    """The call failed or its reply cannot be used; the message says why."""


@dataclass(frozen=True)
class GroupScore:
    reward: float
    masked: bool
    """The reward service asks to leave this sample out of the loss."""


def score_group_problem(reply: Any, expected: int) -> str | None:
    """Why a ScoreGroup reply cannot be used, or None: a count mismatch or the first
    failed score."""
    if len(reply.results) != expected:
        return f"{len(reply.results)} results for {expected} responses"
    for result in reply.results:
        if result.failure_kind != reward_pb2.FAILURE_KIND_NONE:
            kind = reward_pb2.FailureKind.Name(result.failure_kind)
            return f"{kind}: {result.failure_reason}"
    return None


class RewardClient:
    """`RewardClient(target, timeout_s).score_group(request_id, env, row, [(text, tokens)])`
    over a blocking channel, with a deadline per call."""

    def __init__(self, target: str, timeout_s: float) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self.channel = connect_sync(target, default_timeout_s=timeout_s)
        self.stub = reward_pb2_grpc.RewardServiceStub(self.channel)

    def score_group(
        self,
        request_id: str,
        env: str,
        row: dict[str, Any],
        responses: Sequence[tuple[str, int]],
    ) -> list[GroupScore]:
        """Scores of `responses` (text, generated tokens) in order; raises
        ScoreGroupFailed on an RPC error or an unusable reply."""
        request = reward_pb2.ScoreGroupRequest(
            request_id=request_id,
            env=env,
            row_json=json.dumps(row),
            responses=[reward_pb2.Response(text=t, num_tokens=n) for t, n in responses],
        )
        try:
            reply = self.stub.ScoreGroup(request, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            raise ScoreGroupFailed(
                f"ScoreGroup on {self.target}: {exc.code().name} {exc.details()}"
            ) from None
        problem = score_group_problem(reply, len(responses))
        if problem:
            raise ScoreGroupFailed(problem)
        return [GroupScore(float(r.reward), bool(r.mask_sample)) for r in reply.results]

    def close(self) -> None:
        self.channel.close()
