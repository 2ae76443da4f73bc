"""TEST DOUBLES of the rollout and reward services, for the trainer's own tests and its
benchmark: small but real gRPC servers implementing `RolloutService` and `RewardService`
from the protos, so the trainer is exercised over the wire exactly as in production.

- `DoubleRollout`: samples from a HF causal LM (ancestral sampling from
  softmax(logits / temperature), per-token *raw* logprobs as rlfleet's engines report), streams each sample, takes weights by StreamWeights
  or a shared safetensors file, refuses versions that are not newer.
- `DoubleReward`: reward = share of the response's characters found in the row's
  `target_chars` (default "e"), a dense, learnable signal for a random tiny model.

They are not the real services (services/rollout, services/reward); the cross-service
tests in tests/test_learning_*.py use those.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import torch
from grpc import aio
from rlfleet_contracts.recipe import RecipeConfig
from rlfleet_core.config import load_config
from rlfleet_core.server import BaseService, ServiceConfig, ServiceDefinition, start_service
from rlfleet_proto.v1 import reward_pb2, reward_pb2_grpc, rollout_pb2, rollout_pb2_grpc
from rlfleet_weights.plan import dtype_name
from safetensors.torch import load_file

from rlfleet_trainer.batch import TrainBatch, Trajectory, build_train_batch

# prctl option: a signal for the child when its parent dies (Linux).
PR_SET_PDEATHSIG = 1


class DoubleRollout(rollout_pb2_grpc.RolloutServiceServicer):
    def __init__(self, model_path: Path, seed: int = 0, delay_per_token_s: float = 0.0) -> None:
        from transformers import AutoModelForCausalLM

        self.model_path = model_path
        self.model = AutoModelForCausalLM.from_pretrained(model_path)
        self.model.eval()  # type: ignore[no-untyped-call]
        self.eos_ids = {int(self.model.config.eos_token_id)}
        self.version = 0
        self.lock = threading.Lock()
        self.generator = torch.Generator().manual_seed(seed)
        self.delay_per_token_s = delay_per_token_s
        self.tokens_generated = 0
        self.updates: list[int] = []
        self.pauses: list[int] = []
        self.resumes = 0
        self.faults: dict[str, list[grpc.StatusCode]] = {}
        """Prompt id -> status codes the next Generate calls for it end with, one each
        (tests of retries; a retry's request id `<id>/retry<k>` counts as its prompt's)."""
        self.midstream_faults: dict[str, list[grpc.StatusCode]] = {}
        """Like `faults`, but the stream ends with the status after its first sample."""
        self.request_ids: list[str] = []
        self.max_tokens: dict[str, int] = {}
        """Request id -> the `sampling.max_tokens` it asked for."""
        self.seeds: dict[str, int | None] = {}
        """Request id -> the `sampling.seed` it asked for (None: unseeded)."""

    # --- generation -----------------------------------------------------------------------

    def _sample(self, prompt: list[int], n: int, params: Any) -> list[dict[str, Any]]:
        """n samples of up to max_tokens, stopping each at EOS; KV-cached decoding."""
        temperature = params.temperature
        with self.lock, torch.no_grad():
            version = self.version
            ids = torch.tensor([prompt] * n)
            out = self.model(input_ids=ids, use_cache=True)
            past, logits = out.past_key_values, out.logits[:, -1]
            tokens: list[list[int]] = [[] for _ in range(n)]
            logprobs: list[list[float]] = [[] for _ in range(n)]
            done = [False] * n
            for _ in range(params.max_tokens):
                # Like rlfleet's engines: sample from softmax(z/τ), report raw log-softmax(z).
                logp = torch.log_softmax(logits.float(), dim=-1)
                if temperature > 0:
                    probs = torch.softmax(logits.float() / temperature, dim=-1)
                    nxt = torch.multinomial(probs, 1, generator=self.generator)[:, 0]
                else:
                    nxt = logp.argmax(-1)
                for i in range(n):
                    if not done[i]:
                        tokens[i].append(int(nxt[i]))
                        logprobs[i].append(float(logp[i, nxt[i]]))
                        done[i] = int(nxt[i]) in self.eos_ids
                if all(done):
                    break
                out = self.model(input_ids=nxt[:, None], past_key_values=past, use_cache=True)
                past, logits = out.past_key_values, out.logits[:, -1]
        if self.delay_per_token_s:
            time.sleep(self.delay_per_token_s * max(len(t) for t in tokens))
        self.tokens_generated += sum(len(t) for t in tokens)
        return [
            {"tokens": t, "logprobs": lp, "stopped": d, "version": version}
            for t, lp, d in zip(tokens, logprobs, done, strict=True)
        ]

    async def Generate(
        self, request: rollout_pb2.GenerateRequest, context: aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[rollout_pb2.GenerateResult]:
        if request.n < 1 or request.sampling.max_tokens < 1:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "n and max_tokens must be > 0")
        self.request_ids.append(request.request_id)
        self.max_tokens[request.request_id] = request.sampling.max_tokens
        sampling = request.sampling
        self.seeds[request.request_id] = sampling.seed if sampling.HasField("seed") else None
        faults = self.faults.get(request.request_id.split("/")[0])
        if faults:
            await context.abort(faults.pop(0), "double told to fail this call")
        started = time.monotonic()
        samples = await asyncio.to_thread(
            self._sample, list(request.prompt_token_ids), request.n, request.sampling
        )
        midstream = self.midstream_faults.get(request.request_id.split("/")[0])
        for index, s in enumerate(samples):
            if index == 1 and midstream:
                await context.abort(midstream.pop(0), "double told to fail mid-stream")
            yield rollout_pb2.GenerateResult(
                request_id=request.request_id,
                sample_index=index,
                prompt_token_ids=request.prompt_token_ids,
                token_ids=s["tokens"],
                logprobs=s["logprobs"],
                finish_reason=rollout_pb2.FINISH_REASON_STOP
                if s["stopped"]
                else rollout_pb2.FINISH_REASON_LENGTH,
                weight_version_first=s["version"],
                weight_version_last=s["version"],
                generation_time_s=time.monotonic() - started,
                replica="double-0",
            )

    # --- weights --------------------------------------------------------------------------

    def _load(self, version: int, state: dict[str, torch.Tensor]) -> None:
        with self.lock:
            if version <= self.version:
                raise ValueError(f"weight_version {version} is not newer than {self.version}")
            self.model.load_state_dict(state, strict=True)
            self.version = version
            self.updates.append(version)

    async def StreamWeights(
        self,
        request_iterator: AsyncIterator[rollout_pb2.WeightChunk],
        context: aio.ServicerContext[Any, Any],
    ) -> rollout_pb2.UpdateWeightsResponse:
        started = time.monotonic()
        header: rollout_pb2.UpdateWeightsRequest | None = None
        buffers: dict[str, bytearray] = {}
        async for message in request_iterator:
            if message.HasField("header"):
                header = message.header
            else:
                buffers.setdefault(message.tensor.name, bytearray()).extend(message.tensor.data)
        if header is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "first message must be a header")
            raise AssertionError  # unreachable
        state = {}
        for spec in header.tensors:
            dtype = getattr(torch, dtype_name(spec.dtype))
            raw = bytes(buffers.get(spec.name, b""))
            flat = (
                torch.frombuffer(bytearray(raw), dtype=dtype)
                if raw
                else torch.zeros(0, dtype=dtype)
            )
            state[spec.name] = flat.reshape(list(spec.shape)).clone()
        try:
            await asyncio.to_thread(self._load, header.weight_version, state)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        return rollout_pb2.UpdateWeightsResponse(
            weight_version=self.version,
            bytes_received=sum(len(b) for b in buffers.values()),
            transfer_time_s=time.monotonic() - started,
        )

    async def UpdateWeights(
        self, request: rollout_pb2.UpdateWeightsRequest, context: aio.ServicerContext[Any, Any]
    ) -> rollout_pb2.UpdateWeightsResponse:
        if request.transport != rollout_pb2.WEIGHT_TRANSPORT_SHARED_FILE:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "double takes SHARED_FILE only")
        try:
            await asyncio.to_thread(
                self._load, request.weight_version, load_file(request.file_path)
            )
        except ValueError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        return rollout_pb2.UpdateWeightsResponse(weight_version=self.version)

    async def GetStatus(
        self, request: rollout_pb2.GetStatusRequest, context: aio.ServicerContext[Any, Any]
    ) -> rollout_pb2.RolloutStatus:
        return rollout_pb2.RolloutStatus(
            weight_version=self.version,
            engine="double",
            model=str(self.model_path),
            tokens_generated=self.tokens_generated,
        )

    async def Pause(self, request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
        self.pauses.append(int(request.mode))
        return rollout_pb2.PauseResponse()

    async def Resume(self, request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
        self.resumes += 1
        return rollout_pb2.ResumeResponse()


def random_batch(seed: int = 0, n: int = 4) -> tuple[list[Trajectory], TrainBatch]:
    """`n` trajectories of random token ids (vocab 512) with prompts and responses of
    different lengths (a padded batch), groups of 2 with opposite advantages, and their
    TrainBatch: the backend tests' fixed batch."""
    gen = torch.Generator().manual_seed(seed)
    trajs = []
    for i in range(n):
        prompt = torch.randint(3, 512, (3 + i,), generator=gen).tolist()
        response = torch.randint(3, 512, (2 + (i * 2) % 5,), generator=gen).tolist()
        trajs.append(
            Trajectory(
                prompt_id=f"p{i // 2}",
                sample_index=i % 2,
                prompt_token_ids=prompt,
                token_ids=response,
                generation_logprobs=[-6.2] * len(response),
                truncated=False,
                reward=float(i % 2),
                advantage=1.0 if i % 2 else -1.0,
            )
        )
    return trajs, build_train_batch(trajs, torch.ones(n))


def letter_rows(n: int = 12) -> list[dict[str, Any]]:
    """`n` prompt rows for `DoubleReward` (reward = share of "e" in the answer)."""
    return [
        {
            "id": f"r{i}",
            "responses_create_params": {"input": [{"role": "user", "content": f"write e {i}"}]},
            "env": "letters",
            "target_chars": "e",
        }
        for i in range(n)
    ]


class DoubleReward(reward_pb2_grpc.RewardServiceServicer):
    def __init__(self) -> None:
        self.calls = 0
        self.calls_by_id: collections.Counter[str] = collections.Counter()
        self.envs: dict[str, str] = {}
        """Request id -> the environment it was scored as."""
        self.fail_prompt_ids: set[str] = set()
        """ScoreGroup for these request ids answers with a failure (tests of drops)."""
        self.faults: dict[str, list[grpc.StatusCode | dict[int, int]]] = {}
        """Request id -> what its next ScoreGroup calls do, one entry each: end with that
        status code, or fail those samples with that FailureKind (tests of retries)."""

    @staticmethod
    def reward(text: str, row: dict[str, Any]) -> float:
        targets = set(row.get("target_chars", "e"))
        return sum(ch in targets for ch in text) / max(len(text), 1)

    async def ScoreGroup(
        self, request: reward_pb2.ScoreGroupRequest, context: aio.ServicerContext[Any, Any]
    ) -> reward_pb2.ScoreGroupResult:
        self.calls += 1
        self.calls_by_id[request.request_id] += 1
        self.envs[request.request_id] = request.env
        faults = self.faults.get(request.request_id)
        fault = faults.pop(0) if faults else {}
        if isinstance(fault, grpc.StatusCode):
            await context.abort(fault, "double told to fail this call")
            raise AssertionError  # unreachable
        if request.request_id in self.fail_prompt_ids:
            fault = dict.fromkeys(
                range(len(request.responses)), reward_pb2.FAILURE_KIND_VERIFIER_ERROR
            )
        row = json.loads(request.row_json)
        results = []
        for i, response in enumerate(request.responses):
            if i in fault:
                results.append(
                    reward_pb2.ScoreResult(
                        request_id=f"{request.request_id}/{i}",
                        env=request.env,
                        failure_kind=fault[i],  # type: ignore[arg-type]
                        failure_reason="double told to fail",
                    )
                )
                continue
            results.append(
                reward_pb2.ScoreResult(
                    request_id=f"{request.request_id}/{i}",
                    env=request.env,
                    reward=self.reward(response.text, row),
                )
            )
        return reward_pb2.ScoreGroupResult(request_id=request.request_id, results=results)


class _Service(BaseService):
    def __init__(self, config: ServiceConfig, servicer: Any, add: Any) -> None:
        self.servicer, self.add = servicer, add

    def add_to_server(self, server: aio.Server) -> None:
        self.add(self.servicer, server)


def _make_service(config: ServiceConfig, servicer: Any, add: Any) -> _Service:
    return _Service(config, servicer, add)


def doubles_recipe(model: Path, rollout: str, reward: str, *overrides: str) -> RecipeConfig:
    """A recipe against the doubles: `model` at short sequences, trained against the
    doubles' targets; `overrides` (a test's own settings) after."""
    return load_config(
        RecipeConfig,
        overrides=[
            f"policy.model={model}",
            "policy.max_total_sequence_length=128",
            f"services.rollout={rollout}",
            f"services.reward={reward}",
            *overrides,
        ],
    )


@contextlib.asynccontextmanager
async def serve_servicer(servicer: Any) -> AsyncIterator[str]:
    """Serve a reward or rollout double on a free loopback port; yields its target."""
    if isinstance(servicer, reward_pb2_grpc.RewardServiceServicer):
        add: Any = reward_pb2_grpc.add_RewardServiceServicer_to_server
        name, full_name = "reward-double", "rlfleet.v1.RewardService"
    else:
        add = rollout_pb2_grpc.add_RolloutServiceServicer_to_server
        name, full_name = "rollout-double", "rlfleet.v1.RolloutService"
    definition = ServiceDefinition(
        name=name,
        package="rlfleet-trainer",
        grpc_services=(full_name,),
        config_model=ServiceConfig,
        factory=functools.partial(_make_service, servicer=servicer, add=add),
    )
    config = ServiceConfig.model_validate(
        {"server": {"port": 0, "max_timeout_s": 3600.0, "grace_s": 0.5}}
    )
    running = await start_service(definition, config)
    try:
        yield f"127.0.0.1:{running.grpc_port}"
    finally:
        running.stop_event.set()
        await running.done


@contextlib.asynccontextmanager
async def serve_doubles(
    model_path: Path,
    seed: int = 0,
    delay_per_token_s: float = 0.0,
    reward: DoubleReward | None = None,
) -> AsyncIterator[tuple[str, str, DoubleRollout, DoubleReward]]:
    """Start both doubles on free loopback ports; yields (rollout target, reward target,
    rollout servicer, reward servicer). `reward`: a reward double of the caller's (e.g.
    testing_agent.DoubleEpisodes, which also serves episodes)."""
    rollout = DoubleRollout(model_path, seed, delay_per_token_s)  # type: ignore[abstract]
    reward = reward or DoubleReward()  # type: ignore[abstract]
    async with serve_servicer(rollout) as rollout_target, serve_servicer(reward) as reward_target:
        yield rollout_target, reward_target, rollout, reward


def spawn_python(
    args: list[str], core: int | None, env: dict[str, str], **kwargs: Any
) -> subprocess.Popen[str]:
    """`python ARGS` in a child pinned to `core` (if any) that ends when this process dies."""

    def pin() -> None:
        if core is not None:
            os.sched_setaffinity(0, {core})
        with contextlib.suppress(Exception):  # Linux: the child ends if the bench dies
            ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)

    return subprocess.Popen(
        [sys.executable, *args],
        env={**os.environ, **env},
        preexec_fn=pin,  # two syscalls in the child before exec
        text=True,
        **kwargs,
    )


def stop_process(process: subprocess.Popen[str]) -> None:
    """Close its stdin (a double serving until then ends), terminate, wait."""
    if process.stdin is not None:
        process.stdin.close()
    process.terminate()
    process.wait(timeout=30)


async def _serve_reward_until_stdin_closes(model_path: Path) -> None:
    async with serve_doubles(model_path) as (_, reward, _, _):
        print(reward, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


if __name__ == "__main__":
    # The reward double in a process of its own (bench/grpo.py): prints its target, then
    # serves until its stdin closes.
    asyncio.run(_serve_reward_until_stdin_closes(Path(sys.argv[1])))
