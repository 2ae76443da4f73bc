"""Helpers of the rollout tests that update an engine's weights and check what it then
serves: seeded weights, an HF reference for logprobs, the gloo and streamed update calls,
and a weight sender in a process of its own (`weight_sender.py`) to kill or stall midway.

Imports torch and transformers: the pool tests import it inside their scenario (their
own interpreter), not at collection.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import torch
from rlfleet_core.client import connect
from rlfleet_core.ports import pick_free_port
from rlfleet_core.testing import running_service
from rlfleet_proto.v1 import rollout_pb2, rollout_pb2_grpc
from rlfleet_weights.collective import GroupSpec, WeightGroup
from rlfleet_weights.grpc_stream import DEFAULT_CHUNK_BYTES, iter_weight_chunks
from rlfleet_weights.plan import specs_of
from transformers import AutoModelForCausalLM

Weights = dict[str, torch.Tensor]

HF_POOL = ["engine=hf", "model=tiny", "replicas=2", "ray_num_cpus=2", "ray_start_timeout_s=180"]
"""Two hf replicas as Ray actors; start-up bounded for a loaded 2-core host."""

SENDER_SCRIPT = Path(__file__).with_name("weight_sender.py")


def pretrained_weights(model_path: Path | str) -> Weights:
    return dict(AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).state_dict())


def noisy_weights(base: Mapping[str, torch.Tensor], seed: int) -> Weights:
    """`base` plus seeded noise, large enough to change greedy output."""
    gen = torch.Generator().manual_seed(seed)
    return {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in base.items()}


class Reference:
    """The model in float32 on the host: the logprobs an engine must report after `prompt`
    for the weights it serves."""

    def __init__(self, model_path: Path, prompt: list[int]) -> None:
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        self.prompt = prompt
        self.base: Weights = {k: v.clone() for k, v in self.model.state_dict().items()}
        """The pretrained weights (the model itself is reloaded by every `logprobs`)."""

    @torch.no_grad()
    def logprobs(self, weights: Mapping[str, torch.Tensor], tokens: list[int]) -> list[float]:
        self.model.load_state_dict(weights)
        logits = self.model(input_ids=torch.tensor([self.prompt + tokens])).logits[0]
        logp = torch.log_softmax(logits.float(), dim=-1)
        return [float(logp[len(self.prompt) - 1 + i, t]) for i, t in enumerate(tokens)]


def assert_close(got: Sequence[float], want: Sequence[float], tol: float = 1e-4) -> None:
    worst = max(abs(a - b) for a, b in zip(got, want, strict=True))
    assert worst < tol, f"max |Δlogprob| {worst:.2e} >= {tol}"


def assert_served_on(
    results: Sequence[Any], reference: Reference, weights: Weights, version: int
) -> None:
    """Every sample generated on `version` from start to end, with `weights`' logprobs."""
    for r in results:
        assert r.weight_version_first == r.weight_version_last == version, (
            r.replica,
            r.weight_version_first,
            r.weight_version_last,
            version,
        )
        try:
            assert_close(list(r.logprobs), reference.logprobs(weights, list(r.token_ids)))
        except AssertionError as exc:
            raise AssertionError(f"replica {r.replica}: {exc}") from None


@asynccontextmanager
async def rollout_stub(overrides: list[str]) -> AsyncIterator[Any]:
    """A rollout service started with `overrides`, and a stub on it."""
    # Imported here: weight_sender.py imports this module and needs none of the service.
    from rlfleet_rollout.service import SERVICE

    async with (
        running_service(SERVICE, overrides) as running,
        connect(f"127.0.0.1:{running.grpc_port}", default_timeout_s=120) as channel,
    ):
        yield rollout_pb2_grpc.RolloutServiceStub(channel)


async def greedy_samples(
    stub: Any,
    prompt: list[int],
    *,
    calls: int,
    n: int = 2,
    max_tokens: int = 16,
    timeout_s: float = 180,
) -> list[Any]:
    """The samples of `calls` concurrent greedy Generate calls of `n` samples each (with
    several replicas in rotation the least-loaded pick spreads them)."""

    async def one(i: int) -> list[Any]:
        request = rollout_pb2.GenerateRequest(
            request_id=f"r{i}-{uuid.uuid4().hex[:8]}",
            prompt_token_ids=prompt,
            n=n,
            sampling=rollout_pb2.SamplingParams(
                max_tokens=max_tokens, temperature=0.0, ignore_eos=True
            ),
        )
        return [r async for r in stub.Generate(request, timeout=timeout_s)]

    batches = await asyncio.gather(*(one(i) for i in range(calls)))
    return [r for batch in batches for r in batch]


async def polled_status(stub: Any) -> Any:
    """GetStatus once the pool has polled its replicas again (every 0.5 s)."""
    await asyncio.sleep(0.6)
    return await stub.GetStatus(rollout_pb2.GetStatusRequest(), timeout=30)


async def stream_weights(
    stub: Any,
    version: int,
    weights: Mapping[str, torch.Tensor],
    *,
    timeout_s: float,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> Any:
    """A whole update to `version` over StreamWeights; its reply."""
    header = rollout_pb2.UpdateWeightsRequest(weight_version=version)
    chunks = list(iter_weight_chunks(header, weights, chunk_bytes=chunk_bytes))

    async def source() -> AsyncIterator[rollout_pb2.WeightChunk]:
        for chunk in chunks:
            yield chunk

    return await stub.StreamWeights(source(), timeout=timeout_s)


async def join_gloo_group(
    stub: Any, port: int, *, world_size: int, group_timeout_s: float, deadline_s: float
) -> Any:
    """The engine's workers join the gloo weight group whose rank 0 listens on loopback
    `port`, at ranks 1 and up; InitWeightTransfer's reply."""
    return await stub.InitWeightTransfer(
        rollout_pb2.InitWeightTransferRequest(
            transport=rollout_pb2.WEIGHT_TRANSPORT_GLOO,
            master_address="127.0.0.1",
            master_port=port,
            world_size=world_size,
            rank_offset=1,
            timeout_s=group_timeout_s,
        ),
        timeout=deadline_s,
    )


async def form_gloo_group(
    stub: Any, *, group_timeout_s: float, deadline_s: float
) -> tuple[WeightGroup, Any]:
    """A two-rank gloo group: this process at rank 0, the engine's worker at rank 1; the
    group and InitWeightTransfer's reply. Rank 0 joins in a thread: it blocks until the
    engine has joined too."""
    port = pick_free_port()
    box: dict[str, WeightGroup] = {}

    def sender_join() -> None:
        box["group"] = WeightGroup(GroupSpec("127.0.0.1", port, 2, 0, "gloo", group_timeout_s))

    joiner = threading.Thread(target=sender_join)
    joiner.start()
    reply = await join_gloo_group(
        stub, port, world_size=2, group_timeout_s=group_timeout_s, deadline_s=deadline_s
    )
    joiner.join()
    return box["group"], reply


def gloo_update_request(
    version: int, weights: Mapping[str, torch.Tensor], bucket_bytes: int
) -> rollout_pb2.UpdateWeightsRequest:
    """UpdateWeights to `version`, the tensors of `weights` coming over the gloo group."""
    return rollout_pb2.UpdateWeightsRequest(
        weight_version=version,
        transport=rollout_pb2.WEIGHT_TRANSPORT_GLOO,
        tensors=specs_of(weights),
        bucket_bytes=bucket_bytes,
    )


class Sender:
    """`weight_sender.py` (rank 0 of a gloo group of `world_size`) in a session of its own,
    killed as a group on exit. `then="hang"`: it stops for good after half of the buckets;
    `then="finish"`: it sends the rest after `go()`."""

    def __init__(
        self,
        *,
        world_size: int,
        bucket_bytes: int,
        group_timeout_s: float,
        model_path: Path,
        seed: int = 2,
        then: str = "hang",
    ) -> None:
        self.port = pick_free_port()
        self.world_size = world_size
        self.group_timeout_s = group_timeout_s
        args = [self.port, world_size, seed, bucket_bytes, group_timeout_s, model_path, then]
        self.proc = subprocess.Popen(
            [sys.executable, str(SENDER_SCRIPT), *map(str, args)],
            stdin=subprocess.PIPE if then == "finish" else None,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    async def said(self, want: str, timeout_s: float) -> None:
        """Wait (bounded) for the sender's next line, which must be `want`."""

        def read_line() -> None:
            box: list[str] = []
            reader = threading.Thread(
                target=lambda: box.append(self.proc.stdout.readline()),  # type: ignore[union-attr]
                daemon=True,
            )
            reader.start()
            reader.join(timeout_s)
            assert box and box[0].strip() == want, f"sender said {box!r}, wanted {want!r}"

        await asyncio.to_thread(read_line)

    async def engine_joins(self, stub: Any, deadline_s: float) -> Any:
        """Once the sender is up, the engine joins its group (InitWeightTransfer's reply)."""
        await self.said("ready", 120)
        return await join_gloo_group(
            stub,
            self.port,
            world_size=self.world_size,
            group_timeout_s=self.group_timeout_s,
            deadline_s=deadline_s,
        )

    def go(self) -> None:
        self.proc.stdin.write("go\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)

    def __enter__(self) -> Sender:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.kill()
        self.proc.wait()
