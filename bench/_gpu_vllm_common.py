"""Shared parts of bench/gpu_vllm.py: the random-weight model folders, the rollout
service in a child process (the "serve" mode), and the client helpers.

The service runs as its own process, as in production: the trainer side (this process,
GPU 0) reaches it over gRPC and HTTP on loopback, and NCCL joins the two for weights.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rlfleet_trainer import model_shapes

REPO = Path(__file__).resolve().parents[1]

SMOLLM2_135M_V512: dict[str, Any] = {**model_shapes.SMOLLM2_135M, "vocab_size": 512}
"""SmolLM2-135M's body over the tiny 512-token vocabulary (~106M parameters): the shape
that ../shared/gpu's smoke run and bench/grpo.py's GPU placement generate with."""

CPU_SHAPE: dict[str, Any] = model_shapes.SMOKE
"""A CPU-sized stand-in for the GPU shapes (--cpu: a check of the script, not a number)."""


def write_model(path: Path, shape: dict[str, Any], dtype: str, seed: int = 0) -> Path:
    """A random-weight Llama of `shape` with the tiny model's tokenizer (512 tokens),
    saved as a Hugging Face folder (once: reused when present)."""
    if (path / "config.json").exists():
        return path
    import torch
    from rlfleet_core.models import build_tiny_tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    build_tiny_tokenizer(512).save_pretrained(path)
    config = LlamaConfig(
        **shape, max_position_embeddings=2048, bos_token_id=1, eos_token_id=2, pad_token_id=0
    )
    torch.manual_seed(seed)
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = LlamaForCausalLM(config).to(getattr(torch, dtype))
    model.save_pretrained(path)
    del model
    return path


def reference_model(path: Path, dtype: str, device: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(device).eval()


class Service:
    """The rollout service (vllm engine) in a child process: `python bench/gpu_vllm.py
    serve ...`; the ports come back through a file, SIGTERM stops it."""

    def __init__(self, workdir: Path, overrides: list[str], env: dict[str, str], name: str):
        self.ports_file = workdir / f"{name}.ports.json"
        self.ports_file.unlink(missing_ok=True)
        self.log = open(workdir / f"{name}.log", "w")  # noqa: SIM115
        cmd = [sys.executable, str(Path(__file__).with_name("gpu_vllm.py")), "serve"]
        cmd += ["--ports-file", str(self.ports_file), *overrides]
        self.proc = subprocess.Popen(
            cmd, env={**os.environ, **env}, stdout=self.log, stderr=subprocess.STDOUT
        )
        self.grpc_port = 0
        self.http_port = 0
        self.name = name

    async def ready(self, timeout_s: float = 600) -> Service:
        deadline = time.monotonic() + timeout_s
        while not self.ports_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.log.flush()
                tail = Path(self.log.name).read_text()[-4000:]
                raise RuntimeError(f"service {self.name} did not start:\n{tail}")
            await asyncio.sleep(0.5)
        ports = json.loads(self.ports_file.read_text())
        self.grpc_port, self.http_port = ports["grpc"], ports["http"]
        return self

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self.log.close()


def service_overrides(model: Path, dtype: str, eager: bool, gpu: bool, seqs: int) -> list[str]:
    out = [
        "server.port=0",
        "server.http_port=0",
        "engine=vllm",
        f"model={model}",
        f"engine_config.dtype={dtype}",
        "engine_config.max_model_len=1024",
        f"engine_config.max_num_seqs={seqs}",
        f"engine_config.enforce_eager={str(eager).lower()}",
    ]
    out.append("engine_config.gpu_memory_utilization=0.4" if gpu else "")
    out.append("engine_config.kv_cache_bytes=" + str(256 << 20))
    return [o for o in out if o]


async def serve(argv: list[str]) -> None:
    """The child: start the service, write its ports, and (asked by the parent through a
    request file) time vLLM's AsyncLLM directly on the service's own engine."""
    import gc

    from rlfleet_core.config import load_config
    from rlfleet_core.server import start_service
    from rlfleet_rollout.service import SERVICE

    ports_file = Path(argv[argv.index("--ports-file") + 1])
    overrides = [a for a in argv if "=" in a]
    config = load_config(SERVICE.config_model, overrides=overrides)
    running = await start_service(SERVICE, config)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, running.stop_event.set)
    engines = [o for o in gc.get_objects() if type(o).__name__ == "VllmEngine"]
    direct_req = ports_file.with_suffix(".direct.json")
    tmp = ports_file.with_suffix(".tmp")
    tmp.write_text(json.dumps({"grpc": running.grpc_port, "http": running.http_port}))
    tmp.rename(ports_file)
    while not running.stop_event.is_set():
        if direct_req.exists():
            cfg = json.loads(direct_req.read_text())
            direct_req.unlink()
            rates = await direct_asyncllm(engines[0].llm, cfg)
            out = ports_file.with_suffix(".direct-result.tmp")
            out.write_text(json.dumps(rates))
            out.rename(ports_file.with_suffix(".direct-result.json"))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(running.stop_event.wait(), 0.2)
    await running.done


async def direct_asyncllm(llm: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    """vLLM's own AsyncLLM.generate on the same engine, prompts and sampling: one request
    per prompt with n samples (vLLM's parallel sampling), FINAL_ONLY, no detokenization,
    logprobs of the sampled tokens (what the service asks for)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    def params(max_tokens: int) -> Any:
        return SamplingParams(
            n=cfg["n"],
            temperature=1.0,
            max_tokens=max_tokens,
            ignore_eos=True,
            seed=1,
            logprobs=0,
            detokenize=False,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

    async def one_request(prompt: list[int], sampling: Any, request_id: str) -> int:
        total = 0
        async for out in llm.generate(TokensPrompt(prompt_token_ids=prompt), sampling, request_id):
            if out.finished:
                total = sum(len(c.token_ids) for c in out.outputs)
        return total

    async def one(i: int, prompt: list[int], max_tokens: int, tag: str) -> int:
        sampling = params(max_tokens)
        if not cfg.get("per_sample"):
            return await one_request(prompt, sampling, f"direct-{tag}-{i}")
        # One vLLM request per sample, as the service's engine does (seed + j).
        counts = []
        for j in range(cfg["n"]):
            child = sampling.clone()
            child.n, child.seed = 1, 1 + j
            counts.append(one_request(prompt, child, f"direct-{tag}-{i}#{j}"))
        return sum(await asyncio.gather(*counts))

    return await rounds(cfg, one)


async def rounds(cfg: dict[str, Any], one: Any) -> dict[str, Any]:
    """A warm-up round, then `repeats` timed rounds of every prompt at once through `one`."""

    async def round_(max_tokens: int, tag: str) -> tuple[int, float]:
        start = time.perf_counter()
        counts = await asyncio.gather(
            *(one(i, p, max_tokens, tag) for i, p in enumerate(cfg["prompts"]))
        )
        return sum(counts), time.perf_counter() - start

    await round_(8, "warm")
    rates, tokens = [], 0
    for r in range(cfg["repeats"]):
        tokens, elapsed = await round_(cfg["max_tokens"], str(r))
        rates.append(tokens / elapsed)
    return {"rates": rates, "tokens": tokens}
