"""Asynchronous vs synchronous GRPO: optimizer steps per hour on the same recipe, in the
same run. Target: async ≥ 1.5× sync.

Both modes use the same model, seeds, prompts, recipe and step count, and the trainer's
real loop over gRPC. The rollout service is a separate process (the real
`rlfleet-rollout`, hf engine, or vllm with --engine vllm); the reward is the trainer's reward test double (a
character-count reward over gRPC), served from its own process. Sync =
max_trajectory_age_steps 0 (generate, then train, then publish); async = 1 (generation
for the next step overlaps training, weights are published in flight). Throughput is
wall-clock from the end of step WARMUP_STEPS to the end of the last step (the same warm-up
excluded in both modes; setup and the final checkpoint not counted).

Two placements, chosen by what is visible:

- CPU (fewer than two CUDA devices): the bundled tiny model (2 layers, hidden 128, vocab
  512), 4 prompts x 4 generations. Generation and training share the machine's cores
  (one torch/OMP thread per process; RLFLEET_BENCH_PIN=1 pins them to different cores).
- GPU (two or more CUDA devices; RLFLEET_BENCH_CPU=1 forces CPU): as in production,
  generation and training on different devices. The rollout process sees only GPU 1
  (CUDA_VISIBLE_DEVICES=1, hf or vllm engine in bf16), the trainer (this process) trains on
  cuda:0 (fp32 weights, bf16 autocast), the reward double runs on the CPU, and weights
  go trainer → rollout by an NCCL broadcast (services.weight_transport=nccl). The model
  is a randomly initialised Llama of SmolLM2-135M's shape (hidden 576, 30 layers, 9
  heads, 3 KV heads, tied embeddings) over the tiny model's 512-token vocabulary
  (~106M parameters). Why its recipe (GPU_SHAPE) is ONE prompt x 256 generations:
  docs/trainer.md, Benchmarks.

    python bench/grpo.py [--quick] [--record bench/results]
        [--prompts N --generations G --prompt-repeats R --new-tokens T]
        [--weight-transport nccl|grpc_stream|...]   (GPU placement only) [--engine hf|vllm]

On the GPU machine the libs come from the source tree (PYTHONPATH=libs/*/src:services/*/src),
a minimal *.dist-info/METADATA per rlfleet package (importlib.metadata.version), and
pydantic, fastapi, uvicorn, grpcio>=1.85 and friends carried as wheels (docs/trainer.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlfleet_contracts.run_folder import StageFolder
from rlfleet_core.bench import BenchResult
from rlfleet_core.models import resolve_model
from rlfleet_core.ports import wait_for_port_file
from rlfleet_trainer.model_shapes import SMOLLM2_135M, random_model
from rlfleet_trainer.testing import spawn_python, stop_process

DESCRIPTION = (
    "GRPO steps/hour, async (max_trajectory_age_steps=1) vs sync; CPU tiny recipe, or 2 GPUs"
)

WARMUP_STEPS = 2
"""Steps not counted, in both modes: the first forward/backward, and async's first step,
which waits for a whole step's generation with nothing to overlap."""

PROMPT_PHRASE = "write the letter e, "

ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@dataclass(frozen=True)
class Shape:
    """The recipe's size: what one step generates and trains on."""

    prompts: int
    """grpo.num_prompts_per_step"""
    generations: int
    """grpo.num_generations_per_prompt"""
    prompt_repeats: int
    """The prompt is `i: ` + PROMPT_PHRASE x this (~12 tokens each with the tiny tokenizer)."""
    new_tokens: int
    train_micro_batch: int
    logprob_micro_batch: int
    weight_transport: str = "grpc_stream"

    def describe(self, prompt_tokens: int, engine: str) -> str:
        return (
            f"{self.prompts} prompts x {self.generations} generations, ~{prompt_tokens}-token "
            f"prompts, {self.new_tokens} new tokens, {engine}"
        )


CPU_SHAPE = Shape(4, 4, 12, 32, train_micro_batch=16, logprob_micro_batch=32)
GPU_SHAPE = Shape(
    1, 256, 64, 48, train_micro_batch=32, logprob_micro_batch=64, weight_transport="nccl"
)
"""One prompt x 256 generations: one full static batch of the hf engine per step in both
modes (see the module docstring); --prompts/--generations change it."""


@dataclass
class Placement:
    """Where each process runs and with what model."""

    model: Path
    shape: Shape
    gpu: bool
    steps: int
    prompt_tokens: int = 0
    """Longest templated prompt, in tokens (set by `prepare`)."""
    cores: dict[str, Any] = field(default_factory=lambda: {"pinned": False})
    engine: str = "hf"
    """The rollout engine: hf, or vllm (GPU placement: bf16, CUDA graphs)."""

    @property
    def max_total(self) -> int:
        return self.prompt_tokens + self.shape.new_tokens + 8

    def rollout_env(self) -> dict[str, str]:
        if self.gpu:
            return {"CUDA_VISIBLE_DEVICES": "1"}
        return dict(ONE_THREAD)

    def reward_env(self) -> dict[str, str]:
        return {**ONE_THREAD, "CUDA_VISIBLE_DEVICES": ""} if self.gpu else dict(ONE_THREAD)

    def engine_args(self) -> list[str]:
        args = ["engine_config.seed=0"]
        if self.gpu:
            samples = self.shape.prompts * self.shape.generations
            args += [
                "engine_config.device=cuda",
                f"engine_config.max_num_seqs={samples}",
                f"engine_config.max_model_len={max(self.max_total, 1024)}",
            ]
            if self.engine == "vllm":
                args.append("engine_config.enforce_eager=false")
        return args


def prompts(repeats: int, count: int = 64) -> list[dict[str, Any]]:
    return [
        {
            "id": f"r{i}",
            "responses_create_params": {
                "input": [{"role": "user", "content": f"{i}: " + PROMPT_PHRASE * repeats}]
            },
            "env": "letters",
        }
        for i in range(count)
    ]


def _recipe(placement: Placement, rollout: str, reward: str, age: int, steps: int) -> object:
    from rlfleet_contracts.recipe import RecipeConfig
    from rlfleet_core.config import load_config

    shape = placement.shape
    return load_config(
        RecipeConfig,
        overrides=[
            f"policy.model={placement.model}",
            f"policy.max_total_sequence_length={max(placement.max_total, 320)}",
            f"policy.train_micro_batch_size={shape.train_micro_batch}",
            f"policy.logprob_micro_batch_size={shape.logprob_micro_batch}",
            f"generation.max_new_tokens={shape.new_tokens}",
            f"grpo.num_prompts_per_step={shape.prompts}",
            f"grpo.num_generations_per_prompt={shape.generations}",
            f"grpo.max_num_steps={steps}",
            "grpo.lr=1e-4",
            f"grpo.max_trajectory_age_steps={age}",
            f"services.rollout={rollout}",
            f"services.reward={reward}",
            f"services.weight_transport={shape.weight_transport}",
            "checkpoint.export_hf=false",
            "checkpoint.save_every_steps=0",
        ],
    )


def plan_cores() -> dict[str, Any]:
    """With RLFLEET_BENCH_PIN=1: one core for the trainer, another for the rollout and
    reward processes. Off by default: on 2 cores the trainer's event loop then shares the
    training core and async measured 0.61-0.64x (load 9-14), against 1.16x unpinned."""
    available = sorted(os.sched_getaffinity(0))
    if os.environ.get("RLFLEET_BENCH_PIN") != "1":
        return {"pinned": False, "pinning": "none (RLFLEET_BENCH_PIN=1 pins)"}
    if len(available) < 2:
        return {
            "pinned": False,
            "pinning": f"none: only {len(available)} core(s) available, all processes share it",
        }
    trainer, rollout = available[-1], available[0]
    return {
        "pinned": True,
        "trainer_core": trainer,
        "rollout_core": rollout,
        "pinning": f"trainer on core {trainer}; rollout and reward processes on core {rollout}",
    }


def pin_this_process(cores: set[int]) -> None:
    """Every thread of this process (threads started later inherit the mask)."""
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # the thread ended meanwhile
            os.sched_setaffinity(int(tid), cores)


async def _reward_target(
    stack: contextlib.AsyncExitStack, placement: Placement, core: int | None, own_process: bool
) -> str:
    if not own_process:
        from rlfleet_trainer.testing import serve_doubles

        _, target, _, _ = await stack.enter_async_context(serve_doubles(placement.model))
        return target
    reward = spawn_python(
        ["-m", "rlfleet_trainer.testing", str(placement.model)],
        core,
        placement.reward_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    stack.callback(stop_process, reward)
    assert reward.stdout is not None
    target = (await asyncio.to_thread(reward.stdout.readline)).strip()
    if not target:
        raise RuntimeError("the reward double's process exited before serving")
    return target


async def measure_mode(
    placement: Placement, age: int, reward_process: bool = True
) -> dict[str, float]:
    """One GRPO run of WARMUP_STEPS + steps at max_trajectory_age_steps=age."""
    from rlfleet_core.client import wait_for_serving
    from rlfleet_trainer.loop import run_grpo
    from rlfleet_trainer.run import build_context

    steps, cores = placement.steps, placement.cores
    side_core = cores.get("rollout_core")
    run_dir = Path(tempfile.mkdtemp(prefix=f"bench-grpo-age{age}-"))
    port_file = run_dir / "rollout.ports.json"
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(shutil.rmtree, run_dir, ignore_errors=True)
        args = ["-m", "rlfleet_rollout", "--port", "0", "--port-file", str(port_file)]
        args.append(f"engine={placement.engine}")
        # The rollout's log goes to stderr on GPU (a failure there must be readable).
        quiet = None if placement.gpu else subprocess.DEVNULL
        rollout = spawn_python(
            [*args, f"model={placement.model}", *placement.engine_args()],
            side_core,
            placement.rollout_env(),
            stdout=subprocess.DEVNULL,
            stderr=quiet,
        )
        stack.callback(stop_process, rollout)
        reward_target = await _reward_target(stack, placement, side_core, reward_process)
        bound = await asyncio.to_thread(wait_for_port_file, port_file, rollout, 300.0)
        port = bound.grpc
        await wait_for_serving(f"127.0.0.1:{port}", timeout_s=300.0)
        recipe = _recipe(placement, f"127.0.0.1:{port}", reward_target, age, WARMUP_STEPS + steps)
        rows = prompts(placement.shape.prompt_repeats)
        ctx = build_context(recipe, run_dir, rows=rows)  # type: ignore[arg-type]
        ends: list[float] = []
        ctx.on_step = lambda step, metrics: ends.append(time.monotonic())
        if cores["pinned"]:
            pin_this_process({cores["trainer_core"]})  # gRPC threads started since, too
        try:
            await run_grpo(ctx)
        finally:
            await ctx.rollout.close()
            await ctx.reward.close()
        lines = StageFolder(run_dir).metrics.read_text().splitlines()
    metrics = [json.loads(x) for x in lines][WARMUP_STEPS:]
    result = {
        "steps_per_hour": steps / (ends[-1] - ends[WARMUP_STEPS - 1]) * 3600,
        "max_lag": max(m["policy_lag/max"] for m in metrics),
    }
    for key in ("wait_for_groups_s", "logprobs_s", "train_s", "publish_s", "step_s"):
        result[f"timing/{key}"] = sum(m[f"timing/{key}"] for m in metrics) / len(metrics)
    return result


async def _measure(placement: Placement) -> dict[str, float]:
    results: dict[str, float] = {}
    for name, age in (("sync", 0), ("async", 1)):
        for key, value in (await measure_mode(placement, age)).items():
            results[f"{name}_{key}"] = value
    return results


def _ideal_ratio(m: dict[str, float]) -> float:
    generate = m["sync_timing/wait_for_groups_s"]
    train = m["sync_timing/train_s"] + m["sync_timing/logprobs_s"] + m["sync_timing/publish_s"]
    return m["sync_timing/step_s"] / max(generate, train, 1e-9)


def use_gpus() -> bool:
    if os.environ.get("RLFLEET_BENCH_CPU") == "1":
        return False
    import torch

    return torch.cuda.device_count() >= 2


def build_gpu_model(out: Path, seed: int = 0) -> int:
    """A randomly initialised SmolLM2-shaped Llama with the tiny model's tokenizer, saved
    as a HF folder; returns its parameter count."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig

    tiny = resolve_model("tiny")
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    tiny_generation = GenerationConfig.from_pretrained(tiny)
    shape = {**SMOLLM2_135M, "vocab_size": len(tokenizer)}  # the tiny 512-token vocabulary
    device = "cuda" if torch.cuda.is_available() else "cpu"  # init in seconds
    model = random_model(
        "llama",
        seed,
        device,
        **shape,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tiny_generation.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    tiny_generation.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def prepare(placement: Placement) -> None:
    """Measure the longest templated prompt (the recipe's sequence limit follows)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(placement.model)
    lengths = []
    for row in prompts(placement.shape.prompt_repeats):
        ids: Any = tokenizer.apply_chat_template(
            row["responses_create_params"]["input"], add_generation_prompt=True, tokenize=True
        )
        if hasattr(ids, "keys"):  # transformers 5 returns a BatchEncoding
            ids = ids["input_ids"]
        lengths.append(len(ids))
    placement.prompt_tokens = max(lengths)


def run(
    quick: bool, gpu_shape: Shape = GPU_SHAPE, force_cpu: bool = False, engine: str = "hf"
) -> list[BenchResult]:
    import torch

    gpu = not force_cpu and use_gpus()
    original = os.sched_getaffinity(0)
    with tempfile.TemporaryDirectory(prefix="bench-grpo-model-") as tmp:
        extra: dict[str, Any] = {}
        if gpu:
            model = Path(tmp)
            params = build_gpu_model(model)
            placement = Placement(
                model, gpu_shape, gpu=True, steps=4 if quick else 10, engine=engine
            )
            prepare(placement)
            # torch.cuda.get_device_name(1) is GPU 1 here: the rollout's CUDA_VISIBLE_DEVICES=1
            extra = {
                "model": "random-init Llama, SmolLM2-135M shape (hidden 576, 30 layers, "
                "9 heads, 3 KV heads, tied embeddings), tiny tokenizer vocab 512, "
                f"{params / 1e6:.0f}M params",
                "placement": "trainer cuda:0 (this process; fp32 weights, bf16 autocast); "
                f"rollout process CUDA_VISIBLE_DEVICES=1 ({engine} engine, bf16); reward double "
                "on CPU",
                "gpus": [torch.cuda.get_device_name(i) for i in range(2)],
                "weight_transport": gpu_shape.weight_transport,
                "recipe": gpu_shape.describe(placement.prompt_tokens, f"{engine} rollout engine"),
                "max_num_seqs": gpu_shape.prompts * gpu_shape.generations,
            }
        else:
            torch.set_num_threads(1)  # one thread each: the trainer here, the rollout process
            placement = Placement(
                resolve_model("tiny"),
                CPU_SHAPE,
                gpu=False,
                steps=4 if quick else 12,
                cores=plan_cores(),
                engine=engine,
            )
            prepare(placement)
            extra = {
                "recipe": "tiny: 4 prompts x 4 generations, ~100-token prompts, 32 new tokens, "
                f"{engine} rollout engine",
                "pinning": placement.cores["pinning"],
                "threads": "torch 1 (trainer), OMP_NUM_THREADS=1 (rollout, reward)",
            }
        try:
            measured = asyncio.run(_measure(placement))
        finally:
            pin_this_process(original)
    load = os.getloadavg()
    return [
        BenchResult(
            name="grpo",
            metric="steps_per_hour",
            value=measured["async_steps_per_hour"],
            unit="steps/h",
            baseline=measured["sync_steps_per_hour"],
            target=1.5,
            extra={
                "steps": placement.steps,
                "warmup_steps": WARMUP_STEPS,
                **extra,
                "load_average_1_5_15": [round(x, 2) for x in load],
                "async_max_policy_lag": measured["async_max_lag"],
                "sync_max_policy_lag": measured["sync_max_lag"],
                **{k: round(v, 4) for k, v in measured.items() if "timing" in k},
                # What full overlap would give on dedicated devices (generation and training
                # on different hardware, as in production): sync step / max(phase).
                "ideal_overlap_ratio": round(_ideal_ratio(measured), 3),
            },
        )
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=DESCRIPTION)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--cpu", action="store_true", help="CPU placement even with GPUs")
    parser.add_argument("--record", type=Path, help="append results to DIR/grpo.jsonl")
    for name in ("prompts", "generations", "prompt_repeats", "new_tokens"):
        parser.add_argument(
            f"--{name.replace('_', '-')}", type=int, default=getattr(GPU_SHAPE, name)
        )
    parser.add_argument("--weight-transport", default=GPU_SHAPE.weight_transport)
    parser.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    args = parser.parse_args()
    shape = dataclasses.replace(
        GPU_SHAPE,
        prompts=args.prompts,
        generations=args.generations,
        prompt_repeats=args.prompt_repeats,
        new_tokens=args.new_tokens,
        weight_transport=args.weight_transport,
    )
    results = run(quick=args.quick, gpu_shape=shape, force_cpu=args.cpu, engine=args.engine)
    if args.record:
        from rlfleet_core.bench import record

        rows = record(results, args.record)
    else:
        rows = [r.to_json() for r in results]
    for row in rows:
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
