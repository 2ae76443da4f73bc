"""The one interface the faces (gRPC servicer, OpenAI routes) see: `Engine`.

vLLM's `EngineClient` pattern: the servicer translates protos to domain types and calls
these methods; it holds no generation logic. Implementations: `VllmEngine` (vLLM's
AsyncLLM), `HfEngine` (transformers, batched KV-cache decoding) and `ReplicaPool`
(several engines as Ray actors behind the same interface).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any, Protocol

from rlfleet_rollout.config import RolloutServiceConfig
from rlfleet_rollout.types import (
    EngineStatus,
    GenerateInput,
    PauseMode,
    Sample,
    TransferGroup,
    UpdateResult,
    WeightUpdate,
)


class Engine(Protocol):
    name: str
    """"vllm" or "hf" (a pool reports its replicas' engine)."""

    @property
    def weight_version(self) -> int: ...

    @property
    def vocab_size(self) -> int:
        """Rows of the embedding: valid token ids are [0, vocab_size)."""
        ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def eos_token_ids(self) -> tuple[int, ...]: ...

    async def start(self) -> None:
        """Load the model; generation works once this returns."""

    async def stop(self) -> None: ...

    def generate(self, request: GenerateInput) -> AsyncIterator[Sample]:
        """Yields each of the request's `n` samples as soon as it finishes (any order).
        Closing the iterator early aborts the samples still running."""
        ...

    async def abort(self, request_id: str) -> None: ...

    async def pause(self, mode: PauseMode) -> int:
        """Stop new starts (and handle in-flight samples per `mode`); returns the number
        of samples in flight when the pause took effect."""
        ...

    async def resume(self) -> None: ...

    async def init_weight_transfer(self, group: TransferGroup) -> int:
        """Join the weight group (blocks until the sender joins); returns ranks joined."""
        ...

    async def update_weights(self, update: WeightUpdate) -> UpdateResult:
        """Load new weights in place and make `update.version` current. Refuses (with
        FailedPrecondition) a version that is not newer than the current one."""
        ...

    def status(self) -> EngineStatus: ...


class EngineBase:
    """What every engine holds alike: its config and model, the weight version it serves and
    the token facts it reports once started (`_vocab_size`, `_eos`, set by `start`)."""

    name: str

    def __init__(self, config: RolloutServiceConfig, model_path: Path) -> None:
        self.config = config
        self.model_path = model_path
        self.tokenizer: Any = None
        self._version = 0
        self._vocab_size = 0
        self._eos: tuple[int, ...] = ()

    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def max_model_len(self) -> int:
        return self.config.engine_config.max_model_len

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self._eos


def eos_ids(tokenizer: Any, *model_configs: Any) -> tuple[int, ...]:
    """Every id that ends a sample: the tokenizer's EOS and each config's `eos_token_id`
    (an int, a list or absent), sorted."""
    eos: set[int] = set()
    if tokenizer.eos_token_id is not None:
        eos.add(int(tokenizer.eos_token_id))
    for source in model_configs:
        value: int | Iterable[int] | None = getattr(source, "eos_token_id", None)
        eos.update([value] if isinstance(value, int) else (value or []))
    return tuple(sorted(eos))


def resolve_dtype(dtype: str, on_gpu: bool) -> Any:
    """torch dtype for the config's `dtype` ("auto": float32 on CPU, bfloat16 on GPU)."""
    import torch

    if dtype == "auto":
        return torch.bfloat16 if on_gpu else torch.float32
    return getattr(torch, dtype)
