"""One sample and one score across the proto line: what RewardService's Score calls
(grpc_face.py) and CloseEpisode (episodes/face.py) both translate, so both import it."""

from __future__ import annotations

from rlfleet_proto.v1 import reward_pb2

from rlfleet_reward.text import split_reasoning
from rlfleet_reward.types import Sample, Score


def sample_from_proto(response: reward_pb2.Response) -> Sample:
    """The proto's text is the final answer; a raw generation with <think> is split here."""
    text, reasoning = response.text, response.reasoning_text
    if not reasoning and ("<think>" in text or "</think>" in text):
        text, reasoning = split_reasoning(text)
    return Sample(
        text=text,
        reasoning_text=reasoning,
        num_tokens=max(0, response.num_tokens),
        output_text=response.text,  # as a NeMo-Gym message holding it would be read
    )


def result_to_proto(request_id: str, env: str, score: Score) -> reward_pb2.ScoreResult:
    return reward_pb2.ScoreResult(
        request_id=request_id,
        env=env,
        reward=score.reward,
        reward_components=score.components,
        failure_kind=reward_pb2.FailureKind.ValueType(score.failure_kind.value),
        failure_reason=score.failure_reason,
        mask_sample=score.mask_sample,
        info=score.info,
        latency_s=score.latency_s,
    )
