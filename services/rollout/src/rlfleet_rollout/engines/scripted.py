"""TEST-ONLY engine (`engine=scripted`): replays a script of model turns instead of running
a model, so that tests can drive a multi-turn trajectory through the real rollout service
and know exactly what the policy said.

The script (`script_path`) is a JSONL file, one turn per line: `{"text": "..."}`. A request
gets the first turn whose text is not yet found, in order, in its decoded prompt (a
multi-turn trajectory's prompt holds the turns already replayed), so the engine keeps no
state per trajectory. Each of the request's samples is that text's token ids (the model's
tokenizer) plus the first EOS id, every logprob 0.0, cut to `max_tokens` (finish LENGTH).
A prompt past the script's end is refused (FAILED_PRECONDITION). Weight updates only move
the version (the engine has no weights); broadcast transfers are refused.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

from rlfleet_core.errors import FailedPrecondition, InvalidArgument

from rlfleet_rollout.config import RolloutServiceConfig
from rlfleet_rollout.engines.base import EngineBase, eos_ids
from rlfleet_rollout.engines.updates import check_newer
from rlfleet_rollout.types import (
    EngineStatus,
    FinishReason,
    GenerateInput,
    PauseMode,
    Sample,
    TransferGroup,
    UpdateResult,
    WeightUpdate,
)


def read_script(path: str) -> list[str]:
    """The turns of a script file; a bad line is an InvalidArgument naming it."""
    if not path:
        raise InvalidArgument("script_path", "engine=scripted needs script_path (a JSONL file)")
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise InvalidArgument("script_path", f"cannot read {path}: {exc.strerror}") from None
    turns = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            text = json.loads(line)["text"]
        except (json.JSONDecodeError, KeyError, TypeError):
            text = None
        if not isinstance(text, str) or not text:
            raise InvalidArgument("script_path", f'{path}:{number}: expected {{"text": "..."}}')
        turns.append(text)
    return turns


class ScriptedEngine(EngineBase):
    name = "scripted"

    def __init__(self, config: RolloutServiceConfig, model_path: Path) -> None:
        super().__init__(config, model_path)
        self.turns = read_script(config.script_path)
        self._paused = False
        self._tokens = 0

    async def start(self) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self._vocab_size = len(self.tokenizer)
        self._eos = eos_ids(self.tokenizer)

    async def stop(self) -> None:
        return None

    def next_turn(self, prompt: str) -> str:
        position = 0
        for turn in self.turns:
            found = prompt.find(turn, position)
            if found < 0:
                return turn
            position = found + len(turn)
        raise FailedPrecondition("the script has no turn left for this prompt")

    async def generate(self, request: GenerateInput) -> AsyncIterator[Sample]:
        if self._paused:
            raise FailedPrecondition("paused")
        started = time.monotonic()
        prompt = self.tokenizer.decode(list(request.prompt_token_ids), skip_special_tokens=False)
        ids = [*self.tokenizer.encode(self.next_turn(prompt), add_special_tokens=False)]
        ids += list(self.eos_token_ids[:1])
        finish = FinishReason.STOP
        budget = min(
            request.sampling.max_tokens, self.max_model_len - len(request.prompt_token_ids)
        )
        if len(ids) > budget:
            ids, finish = ids[: max(budget, 0)], FinishReason.LENGTH
        # The OpenAI face answers with `text` (as the hf engine fills it): without it a
        # scripted chat completion came back with empty content.
        text = self.tokenizer.decode(ids, skip_special_tokens=True) if request.return_text else ""
        for index in range(request.n):
            self._tokens += len(ids)
            yield Sample(
                request_id=request.request_id,
                index=index,
                prompt_token_ids=request.prompt_token_ids,
                token_ids=list(ids),
                logprobs=[0.0] * len(ids),
                # The script's token is certain: it alone is the top-k, at logprob 0.
                top_logprobs=[[(t, 0.0)] for t in ids] if request.sampling.top_logprobs else [],
                finish_reason=finish,
                weight_version_first=self._version,
                weight_version_last=self._version,
                generation_time_s=time.monotonic() - started,
                text=text,
                replica="scripted-0",
            )

    async def abort(self, request_id: str) -> None:
        return None

    async def pause(self, mode: PauseMode) -> int:
        self._paused = True
        return 0

    async def resume(self) -> None:
        self._paused = False

    async def init_weight_transfer(self, group: TransferGroup) -> int:
        raise FailedPrecondition("engine=scripted has no weights to receive by broadcast")

    async def update_weights(self, update: WeightUpdate) -> UpdateResult:
        if update.plan is not None:
            raise FailedPrecondition("engine=scripted has no weights to receive by broadcast")
        check_newer(update.version, self._version, self.config.max_weight_version_jump)
        self._version = update.version
        return UpdateResult(update.version, 0, 0.0, 0.0)

    def status(self) -> EngineStatus:
        return EngineStatus(
            weight_version=self._version,
            paused=self._paused,
            requests_waiting=0,
            requests_running=0,
            tokens_per_s=0.0,
            tokens_generated=self._tokens,
        )
