"""Domain types shared by the engines and the faces (gRPC, OpenAI HTTP).

They mirror the proto messages but carry no protobuf, so engines are testable without
a server and the two faces translate to and from the same objects.
"""

from __future__ import annotations

import collections
import enum
import threading
import time
from dataclasses import dataclass, field
from typing import Any


class FinishReason(enum.StrEnum):
    STOP = "stop"
    """EOS, a stop token or a stop string."""
    LENGTH = "length"
    """max_tokens or the model's context reached: truncated."""
    ABORT = "abort"


class PauseMode(enum.StrEnum):
    KEEP = "keep"
    """Freeze requests in flight with their KV cache; they continue on resume."""
    WAIT = "wait"
    """Let requests in flight finish; start no new ones."""
    ABORT = "abort"
    """Abort requests in flight (they finish with FinishReason.ABORT)."""


@dataclass(frozen=True)
class SamplingConfig:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None
    repetition_penalty: float = 1.0
    top_logprobs: int = 0
    """Also return the k most likely tokens at each position (raw logprobs; 0 = none)."""

    def for_sample(self, index: int) -> SamplingConfig:
        """Sample `index` of a group gets seed + index, so a seeded group is reproducible
        and its samples still differ."""
        if self.seed is None:
            return self
        return SamplingConfig(**{**self.__dict__, "seed": self.seed + index})


@dataclass(frozen=True)
class GenerateInput:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    n: int
    sampling: SamplingConfig
    return_text: bool = False


@dataclass
class Sample:
    request_id: str
    index: int
    prompt_token_ids: tuple[int, ...]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    weight_version_first: int
    weight_version_last: int
    generation_time_s: float
    text: str = ""
    replica: str = ""
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    """Per position, the `sampling.top_logprobs` most likely (token id, raw logprob),
    most likely first; empty when none were asked for."""


@dataclass(frozen=True)
class WeightUpdate:
    """A new set of weights. Exactly one of `plan` (receive over the weight group) or
    `tensors` (already here: gRPC stream or shared file) is set."""

    version: int
    plan: Any = None
    """rlfleet_weights.plan.BucketPlan for a collective transfer."""
    tensors: dict[str, Any] | None = None
    recompute_kv_cache: bool = False


@dataclass(frozen=True)
class UpdateResult:
    version: int
    bytes_received: int
    transfer_time_s: float
    apply_time_s: float


@dataclass(frozen=True)
class TransferGroup:
    """Where the weight group meets; each engine worker joins at rank_offset + i."""

    backend: str
    master_address: str
    master_port: int
    world_size: int
    rank_offset: int
    timeout_s: float


@dataclass
class EngineStatus:
    weight_version: int
    paused: bool
    requests_waiting: int
    requests_running: int
    tokens_per_s: float
    tokens_generated: int
    num_replicas: int = 1
    """Replicas in rotation (a pool takes out those a failed update left diverged)."""
    serving: bool = True
    """False while the engine refuses to generate: a failed update may have left its
    model a mix of two versions (vllm), or no replica is in rotation (pool)."""
    not_serving_reason: str = ""
    """Why, while `serving` is False (the service's health reports it)."""


class ThroughputMeter:
    """Generated tokens: a running total and tokens/s over a sliding window.

    Thread-safe: the hf engine counts from its decode thread."""

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self.total = 0
        self._events: collections.deque[tuple[float, int]] = collections.deque()
        self._lock = threading.Lock()

    def add(self, tokens: int) -> None:
        now = time.monotonic()
        with self._lock:
            self.total += tokens
            self._events.append((now, tokens))
            self._trim(now)

    def _trim(self, now: float) -> None:
        while self._events and self._events[0][0] < now - self.window_s:
            self._events.popleft()

    def rate(self) -> float:
        now = time.monotonic()
        with self._lock:
            self._trim(now)
            if not self._events:
                return 0.0
            span = max(now - self._events[0][0], 1.0)
            return sum(t for _, t in self._events) / span


@dataclass
class InFlight:
    """Book-keeping of requests an engine is working on (for Pause's answer and status)."""

    running: dict[str, int] = field(default_factory=dict)
    """request id -> samples not finished yet."""

    def add(self, request_id: str, n: int) -> None:
        self.running[request_id] = self.running.get(request_id, 0) + n

    def done(self, request_id: str) -> None:
        left = self.running.get(request_id, 0) - 1
        if left <= 0:
            self.running.pop(request_id, None)
        else:
            self.running[request_id] = left

    @property
    def samples(self) -> int:
        return sum(self.running.values())
