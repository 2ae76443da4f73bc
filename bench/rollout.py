"""Generation throughput through the rollout service vs vLLM's own `LLM.generate`.

Ours: the rollout service with the vllm engine (AsyncLLM), in this process, driven over
gRPC by concurrent `Generate` calls (one per prompt, n samples each) — what the trainer
does. Baseline, in the same run: `vllm.LLM.generate` on the same token-id prompts with
the same sampling (seeded, `ignore_eos`, so both generate exactly the same number of
tokens), in a child process with the engine in-process (no IPC at all: the fastest way
vLLM offers). Tokens/s = generated tokens / wall time after a warm-up. Target: >= 0.9x.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from typing import Any

DESCRIPTION = "rollout service tokens/s (gRPC Generate, vllm engine) vs vLLM LLM.generate"

_BASELINE = """
import json, os, sys, time
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
cfg = json.loads(sys.argv[1])
llm = LLM(model=cfg["model"], dtype=cfg["dtype"], enforce_eager=True,
          max_model_len=cfg["max_model_len"], kv_cache_memory_bytes=cfg["kv_bytes"],
          max_num_seqs=cfg["max_num_seqs"], seed=0)
prompts = [TokensPrompt(prompt_token_ids=p) for p in cfg["prompts"]]
def params(max_tokens):
    return SamplingParams(n=cfg["n"], temperature=1.0, max_tokens=max_tokens, ignore_eos=True,
                          seed=1, logprobs=0)
llm.generate(prompts, params(8), use_tqdm=False)
rates = []
for _ in range(cfg["repeats"]):
    start = time.perf_counter()
    outs = llm.generate(prompts, params(cfg["max_tokens"]), use_tqdm=False)
    tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
    rates.append(tokens / (time.perf_counter() - start))
print("RESULT " + json.dumps({"rates": rates, "tokens": tokens}))
"""


def _prompts(model_path: Any, count: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    questions = [
        "What is 12 + 30?",
        "Name three prime numbers.",
        "Write a haiku about rain.",
        "Explain recursion briefly.",
        "What is the capital of France?",
        "Sort 5, 3, 9, 1.",
        "Give a synonym for quick.",
        "How many legs does a spider have?",
    ]
    prompts = []
    for i in range(count):
        ids = tok.apply_chat_template(
            [{"role": "user", "content": questions[i % len(questions)]}],
            add_generation_prompt=True,
            tokenize=True,
        )
        prompts.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return prompts


def _baseline(cfg: dict[str, Any]) -> list[float]:
    out = subprocess.run(
        [sys.executable, "-c", _BASELINE, json.dumps(cfg)],
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return list(json.loads(line[7:])["rates"])
    raise RuntimeError(f"baseline failed:\n{out.stderr[-3000:]}")


async def _ours(model: str, cfg: dict[str, Any]) -> list[float]:
    from rlfleet_core.client import connect
    from rlfleet_core.config import load_config
    from rlfleet_core.server import start_service
    from rlfleet_proto.v1 import rollout_pb2, rollout_pb2_grpc
    from rlfleet_rollout.service import SERVICE

    config = load_config(
        SERVICE.config_model,
        overrides=[
            "server.port=0",
            "engine=vllm",
            f"model={model}",
            f"engine_config.dtype={cfg['dtype']}",
            f"engine_config.max_model_len={cfg['max_model_len']}",
            f"engine_config.kv_cache_bytes={cfg['kv_bytes']}",
            f"engine_config.max_num_seqs={cfg['max_num_seqs']}",
        ],
    )
    running = await start_service(SERVICE, config)
    try:
        async with connect(f"127.0.0.1:{running.grpc_port}", default_timeout_s=1200) as channel:
            stub = rollout_pb2_grpc.RolloutServiceStub(channel)

            async def one(i: int, prompt: list[int], max_tokens: int) -> int:
                request = rollout_pb2.GenerateRequest(
                    request_id=f"b{i}",
                    prompt_token_ids=prompt,
                    n=cfg["n"],
                    sampling=rollout_pb2.SamplingParams(
                        temperature=1.0, max_tokens=max_tokens, ignore_eos=True, seed=1
                    ),
                )
                return sum([len(r.token_ids) async for r in stub.Generate(request)])

            async def round_(max_tokens: int) -> tuple[int, float]:
                start = time.perf_counter()
                counts = await asyncio.gather(
                    *(one(i, p, max_tokens) for i, p in enumerate(cfg["prompts"]))
                )
                return sum(counts), time.perf_counter() - start

            await round_(8)
            rates = []
            for _ in range(cfg["repeats"]):
                tokens, elapsed = await round_(cfg["max_tokens"])
                rates.append(tokens / elapsed)
            return rates
    finally:
        running.stop_event.set()
        await running.done


def run(quick: bool = False) -> list[Any]:
    from rlfleet_core.bench import BenchResult
    from rlfleet_core.models import resolve_model

    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    model = "tiny" if quick else "smollm2-135m-instruct"
    path = resolve_model(model)
    cfg = {
        "model": str(path),
        "dtype": "float32" if quick else "bfloat16",
        "max_model_len": 512,
        "kv_bytes": 256 << 20,
        "max_num_seqs": 64,
        "prompts": _prompts(path, 8),
        "n": 4,
        "max_tokens": 128 if quick else 64,
        "repeats": 2,
    }
    baseline = _baseline(cfg)
    ours = asyncio.run(_ours(model, cfg))
    extra = {
        "model": model,
        "prompts": len(cfg["prompts"]),
        "n": cfg["n"],
        "max_tokens": cfg["max_tokens"],
        "dtype": cfg["dtype"],
        "engine": "vllm",
        "ours_runs": [round(r, 1) for r in ours],
        "baseline_runs": [round(r, 1) for r in baseline],
    }
    return [
        BenchResult(
            "rollout",
            f"tokens_per_s_{model}",
            max(ours),
            "tokens/s",
            max(baseline),
            target=0.9,
            extra=extra,
        )
    ]
