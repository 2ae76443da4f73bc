"""The hf engine: transformers + torch, batched decoding with a KV cache.

For machines without vLLM and as a fallback. One decode thread owns the model: it takes
up to `max_num_seqs` waiting samples, prefills them together (left-padded, past any prefix
held from earlier samples: hf_prefix.py), then decodes them step by step with the KV
cache, sampling each row with its own parameters. New samples start at the next batch
(static batching: simple and exact; vLLM's continuous batching is for throughput).

Weight updates land *between* two decode steps: the decode thread holds `_model_lock`
for each forward pass, and the update copies the new tensors under the same lock. Rows
in flight keep their KV cache (computed with the old weights) unless the update asks to
recompute it; each sample reports the first and last weight version it was decoded
under. Tensors are received (a broadcast into staging tensors) before the lock is taken,
so a slow transfer does not stall generation and a failed one changes nothing.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rlfleet_weights.base import GroupReceiver
from rlfleet_weights.names import checkpoint_views

from rlfleet_rollout.config import RolloutServiceConfig
from rlfleet_rollout.engines.base import EngineBase, eos_ids, resolve_dtype
from rlfleet_rollout.engines.hf_prefix import NO_HIT, PrefixCache, prefill
from rlfleet_rollout.engines.hf_weights import HfWeights
from rlfleet_rollout.engines.requests import sample_sampling, token_budget
from rlfleet_rollout.engines.sampling import RowState, choose_tokens, top_logprobs
from rlfleet_rollout.types import (
    EngineStatus,
    FinishReason,
    GenerateInput,
    InFlight,
    PauseMode,
    Sample,
    SamplingConfig,
    ThroughputMeter,
)

logger = logging.getLogger(__name__)


@dataclass
class _Row:
    """One sample being generated."""

    request: GenerateInput
    index: int
    sampling: SamplingConfig
    deliver: Any
    """Callable(Sample) that hands the finished sample to the caller's event loop."""
    max_new: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    finish: FinishReason | None = None
    text: str = ""
    version_first: int = 0
    started: float = 0.0
    generator: torch.Generator | None = None


class HfEngine(EngineBase, HfWeights):
    name = "hf"

    def __init__(self, config: RolloutServiceConfig, model_path: Path) -> None:
        super().__init__(config, model_path)
        self.replica = "hf-0"
        self._cond = threading.Condition()
        self._model_lock = threading.Lock()
        self._update_lock = asyncio.Lock()
        self._pending: list[_Row] = []
        self._running: list[_Row] = []
        self._aborted: set[str] = set()
        self._accepting = True
        self._frozen = False
        self._recompute = False
        self._stopping = False
        self._inflight = InFlight()
        self._meter = ThroughputMeter()
        self._receiver: GroupReceiver | None = None
        self._staged_plan: Any = None
        self._staging: dict[str, torch.Tensor] = {}
        self._thread: threading.Thread | None = None
        self.model: Any = None
        self._last_logits_only: dict[str, int] = {}
        cfg = config.engine_config
        self._prefix = PrefixCache(cfg.prefix_cache_bytes) if cfg.enable_prefix_caching else None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        await asyncio.to_thread(self._load)
        self._thread = threading.Thread(target=self._decode_loop, name="hf-decode", daemon=True)
        self._thread.start()

    def _load(self) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        cfg = self.config.engine_config
        want_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
        self.device = torch.device("cuda" if want_cuda else "cpu")
        dtype = resolve_dtype(cfg.dtype, want_cuda)
        self.model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=dtype)
        self.model.to(self.device).eval()
        # Only the last position's logits are sampled from. Without this a prefill builds
        # logits for every position: [batch, prompt, vocab] floats (36 rows of ~600 tokens
        # with SmolLM2's 49k vocabulary: 4 GB written and read once per batch).
        forward = inspect.signature(self.model.forward).parameters
        self._last_logits_only = {"logits_to_keep": 1} if "logits_to_keep" in forward else {}
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self._vocab_size = int(self.model.get_input_embeddings().weight.shape[0])
        self._eos = eos_ids(self.tokenizer, self.model.config, self.model.generation_config)
        pad = self.tokenizer.pad_token_id
        self._pad = int(pad if pad is not None else (self._eos[0] if self._eos else 0))
        # Every name a trainer may send, in the checkpoint's names (rlfleet_weights.names:
        # Nemotron-H's experts one by one), as views that write the model.
        self._targets = checkpoint_views(self.model)
        # Weights loaded from safetensors may be copy-on-write file mappings: write every
        # page once now, so the first weight update does not pay the page faults.
        with torch.no_grad():
            for tensor in self._targets.values():
                tensor.mul_(1)
        torch.manual_seed(cfg.seed)
        logger.info("hf engine ready: %s on %s (%s)", self.model_path, self.device, dtype)

    async def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._frozen = False
            self._cond.notify_all()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10)
        if self._receiver is not None:
            self._receiver.close()

    # ------------------------------------------------------------------ generation

    async def generate(self, request: GenerateInput) -> AsyncIterator[Sample]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Sample] = asyncio.Queue()

        def deliver(sample: Sample) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, sample)

        prompt_len = len(request.prompt_token_ids)
        rows = [
            _Row(
                request=request,
                index=i,
                sampling=sample_sampling(request, i),
                deliver=deliver,
                max_new=token_budget(request.sampling, prompt_len, self.max_model_len),
            )
            for i in range(request.n)
        ]
        with self._cond:
            self._aborted.discard(request.request_id)
            self._pending.extend(rows)
            self._inflight.add(request.request_id, request.n)
            self._cond.notify_all()
        received = 0
        try:
            while received < request.n:
                sample = await queue.get()
                received += 1
                yield sample
        finally:
            if received < request.n:
                await self.abort(request.request_id)

    async def abort(self, request_id: str) -> None:
        with self._cond:
            self._aborted.add(request_id)
            waiting = [r for r in self._pending if r.request.request_id == request_id]
            self._pending = [r for r in self._pending if r.request.request_id != request_id]
            self._cond.notify_all()
        for row in waiting:
            row.finish = FinishReason.ABORT
            self._emit(row)

    # ------------------------------------------------------------------ pause / resume

    async def pause(self, mode: PauseMode) -> int:
        with self._cond:
            in_flight = self._inflight.samples
            self._accepting = False
            if mode == PauseMode.KEEP:
                self._frozen = True
            elif mode == PauseMode.ABORT:
                ids = {r.request.request_id for r in (*self._pending, *self._running)}
                self._aborted.update(ids)
            self._cond.notify_all()
        if mode == PauseMode.ABORT:
            for request_id in list(self._aborted):
                await self.abort(request_id)
        if mode in (PauseMode.WAIT, PauseMode.ABORT):
            await asyncio.to_thread(self._wait_idle)
        return in_flight

    def _wait_idle(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: not self._running or self._stopping)

    async def resume(self) -> None:
        with self._cond:
            self._accepting = True
            self._frozen = False
            self._cond.notify_all()

    # ------------------------------------------------------------------ status

    def status(self) -> EngineStatus:
        with self._cond:
            return EngineStatus(
                weight_version=self._version,
                paused=not self._accepting,
                requests_waiting=len(self._pending),
                requests_running=len(self._running),
                tokens_per_s=self._meter.rate(),
                tokens_generated=self._meter.total,
            )

    # ------------------------------------------------------------------ decode thread

    def _decode_loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stopping or (self._accepting and self._pending))
                self._gather_pending()
                if self._stopping:
                    return
                if not (self._accepting and self._pending):  # paused or aborted meanwhile
                    continue
                batch = self._pending[: self.config.engine_config.max_num_seqs]
                del self._pending[: len(batch)]
                self._running = batch
            try:
                self._run_batch(batch)
            except Exception:
                logger.exception("hf decode step failed; aborting %d samples", len(batch))
                for row in batch:
                    if row.finish is None:
                        row.finish = FinishReason.ABORT
                        self._emit(row)
            finally:
                with self._cond:
                    self._running = []
                    self._cond.notify_all()

    def _gather_pending(self) -> None:
        """Wait up to `batch_wait_ms` for a fuller batch (called holding `_cond`). Requests
        sent together, such as a GRPO step's prompts, arrive milliseconds apart; without
        the wait the first one decodes alone and the rest wait for that whole batch."""
        limit = self.config.engine_config.max_num_seqs
        deadline = time.monotonic() + self.config.engine_config.batch_wait_ms / 1000
        while not self._stopping and len(self._pending) < limit:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._cond.wait(left)

    def _emit(self, row: _Row) -> None:
        text = row.text
        if row.request.return_text and not text:
            text = self.tokenizer.decode(row.tokens, skip_special_tokens=True)
        row.deliver(
            Sample(
                request_id=row.request.request_id,
                index=row.index,
                prompt_token_ids=row.request.prompt_token_ids,
                token_ids=list(row.tokens),
                logprobs=list(row.logprobs),
                finish_reason=row.finish or FinishReason.ABORT,
                weight_version_first=row.version_first,
                weight_version_last=self._version,
                generation_time_s=time.perf_counter() - row.started,
                text=text,
                replica=self.replica,
                top_logprobs=list(row.top),
            )
        )
        with self._cond:
            self._inflight.done(row.request.request_id)

    def _prefill(self, rows: list[_Row]) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Left-padded prompts through the model: (cache, last logits, mask, next positions),
        a row per sample. Each distinct prompt goes through once (a GRPO group's samples
        share theirs; 12 600-token prompts took 65 s on one SmolLM2 CPU thread), its cache
        and logits copied out to the rows that share it, and only past its longest prefix
        held in the prefix cache (hf_prefix.py)."""
        distinct: dict[tuple[int, ...], int] = {}
        owner = [
            distinct.setdefault(tuple(r.request.prompt_token_ids), len(distinct)) for r in rows
        ]
        prompts = list(distinct)
        hits = [self._prefix.lookup(p, self._version) if self._prefix else NO_HIT for p in prompts]
        return prefill(self._forward, prompts, hits, self._pad, self.device, rows=owner)

    def _forward(
        self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, past: Any
    ) -> tuple[Any, torch.Tensor]:
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=past,
            use_cache=True,
            **self._last_logits_only,
        )
        return out.past_key_values, out.logits[:, -1, :]

    def _run_batch(self, rows: list[_Row]) -> None:
        with self._model_lock, torch.no_grad():
            now = time.perf_counter()
            for row in rows:
                row.version_first = self._version
                row.started = now
                if row.sampling.seed is not None:
                    row.generator = torch.Generator(device=self.device).manual_seed(
                        row.sampling.seed
                    )
            cache, logits, mask, next_pos = self._prefill(rows)
        while True:
            self._sample_step(rows, logits, cache, mask)
            if all(r.finish is not None for r in rows):
                return
            if not self._between_steps(rows):
                return
            with self._model_lock, torch.no_grad():
                if self._recompute:
                    self._recompute = False
                    # Every row's KV again under the new weights (prompt + generated): the
                    # logits after the last token are sampled in place of a decode step.
                    seqs = [[*r.request.prompt_token_ids, *r.tokens] for r in rows]
                    hits = [NO_HIT] * len(seqs)
                    cache, logits, mask, next_pos = prefill(
                        self._forward, seqs, hits, self._pad, self.device
                    )
                    continue
                last = torch.tensor(
                    [r.tokens[-1] if r.tokens else self._pad for r in rows], device=self.device
                ).unsqueeze(-1)
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
                out = self.model(
                    input_ids=last,
                    attention_mask=mask,
                    position_ids=next_pos.unsqueeze(-1),
                    past_key_values=cache,
                    use_cache=True,
                )
                cache, logits, next_pos = out.past_key_values, out.logits[:, -1, :], next_pos + 1

    def _between_steps(self, rows: list[_Row]) -> bool:
        """Pause (KEEP freezes here, KV cache intact), aborts, shutdown. False = stop."""
        with self._cond:
            self._cond.wait_for(lambda: not self._frozen or self._stopping)
            aborted = set(self._aborted)
            stopping = self._stopping
        for row in rows:
            if row.finish is None and (stopping or row.request.request_id in aborted):
                row.finish = FinishReason.ABORT
                self._emit(row)
        return not stopping and any(r.finish is None for r in rows)

    def _sample_step(self, rows: list[_Row], logits: torch.Tensor, cache: Any, mask: Any) -> None:
        """A token for every unfinished row from `logits`; rows that finish are delivered,
        and kept in the prefix cache with `cache` and `mask` (what the batch has fed)."""
        active = [b for b, r in enumerate(rows) if r.finish is None]
        states = [
            RowState.of(r.sampling, r.request.prompt_token_ids, r.tokens, self._eos, r.generator)
            for r in (rows[b] for b in active)
        ]
        tokens, logprobs = choose_tokens(logits[active], states)
        self._meter.add(len(active))
        for b, token, logprob in zip(active, tokens, logprobs, strict=True):
            row = rows[b]
            row.tokens.append(token)
            row.logprobs.append(logprob)
            if row.sampling.top_logprobs > 0:
                row.top.append(top_logprobs(logits[b], row.sampling.top_logprobs))
            row.finish = self._finish_reason(row, token)
            if row.finish is not None:
                self._emit(row)
        if self._prefix is not None:  # all but the last token were fed, under these weights?
            done = [b for b in active if rows[b].finish not in (None, FinishReason.ABORT)]
            fed = [(b, [*rows[b].request.prompt_token_ids, *rows[b].tokens[:-1]]) for b in done]
            fresh = [(b, t) for b, t in fed if rows[b].version_first == self._version]
            self._prefix.keep(cache, mask, fresh, self._version)

    def _finish_reason(self, row: _Row, token: int) -> FinishReason | None:
        s = row.sampling
        if len(row.tokens) >= s.min_tokens:
            if (not s.ignore_eos and token in self._eos) or token in s.stop_token_ids:
                return FinishReason.STOP
            if s.stop:
                text = self.tokenizer.decode(row.tokens, skip_special_tokens=True)
                hits = [text.find(stop) for stop in s.stop if stop in text]
                if hits:
                    row.text = text[: min(hits)]
                    return FinishReason.STOP
        if len(row.tokens) >= row.max_new:
            return FinishReason.LENGTH
        return None
