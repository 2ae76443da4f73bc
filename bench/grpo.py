"""Asynchronous vs synchronous GRPO: optimizer steps per hour on the same tiny recipe, in
the same run. Target: async ≥ 1.5× sync.

Both runs use the bundled tiny model (2 layers, hidden 128, vocab 512), the same seeds,
prompts, recipe and step count, and the trainer's real loop over gRPC. The rollout service
is a separate process (the real `rlfleet-rollout`, hf engine); the reward is the trainer's
reward test double (a character-count reward over gRPC), served from its own process.
Sync = max_trajectory_age_steps 0 (generate, then train, then publish); async = 1
(generation for the next step overlaps training, weights are published in flight).

In production generation and training run on different devices. Here, for BOTH modes, the
rollout process (and the reward double) is pinned to one core and the trainer (this
process) to another, with one torch/OMP thread each, so generation and training do not
take each other's core; with fewer than two cores the bench runs unpinned and says so.
Throughput is wall-clock from the end of step WARMUP_STEPS to the end of the last step
(the same warm-up excluded in both modes; setup and the final checkpoint not counted).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rlfleet_core.bench import BenchResult

DESCRIPTION = "GRPO steps/hour, async (max_trajectory_age_steps=1) vs sync, tiny recipe on CPU"

WARMUP_STEPS = 2
"""Steps not counted, in both modes: the first forward/backward, and async's first step,
which waits for a whole step's generation with nothing to overlap."""

PROMPTS = [
    {
        "id": f"r{i}",
        "responses_create_params": {
            "input": [{"role": "user", "content": f"{i}: " + "write the letter e, " * 12}]
        },
        "env": "letters",
    }
    for i in range(64)
]

ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

# The reward double in a process of its own (pinned with the rollout, off the trainer's
# core): prints its target, then serves until its stdin closes.
REWARD_SERVER = """
import asyncio, sys
from pathlib import Path
from rlfleet_trainer.testing import serve_doubles

async def main():
    async with serve_doubles(Path(sys.argv[1])) as (_, reward, _, _):
        print(reward, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

asyncio.run(main())
"""


def _recipe(model: Path, rollout: str, reward: str, age: int, steps: int) -> object:
    from rlfleet_core.config import load_config
    from rlfleet_core.recipe import RecipeConfig

    return load_config(
        RecipeConfig,
        overrides=[
            f"policy.model={model}",
            "policy.max_total_sequence_length=320",
            "policy.train_micro_batch_size=16",
            "policy.logprob_micro_batch_size=32",
            "generation.max_new_tokens=32",
            "grpo.num_prompts_per_step=4",
            "grpo.num_generations_per_prompt=4",
            f"grpo.max_num_steps={steps}",
            "grpo.lr=1e-4",
            f"grpo.max_trajectory_age_steps={age}",
            f"services.rollout={rollout}",
            f"services.reward={reward}",
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


def _spawn(args: list[str], core: int | None, **kwargs: Any) -> subprocess.Popen[str]:
    def pin() -> None:
        if core is not None:
            os.sched_setaffinity(0, {core})

    return subprocess.Popen(
        [sys.executable, *args],
        env={**os.environ, **ONE_THREAD},
        preexec_fn=pin,  # one syscall in the child before exec
        text=True,
        **kwargs,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _reward_target(
    stack: contextlib.AsyncExitStack, model: Path, core: int | None, own_process: bool
) -> str:
    if not own_process:
        from rlfleet_trainer.testing import serve_doubles

        _, target, _, _ = await stack.enter_async_context(serve_doubles(model))
        return target
    reward = _spawn(
        ["-c", REWARD_SERVER, str(model)], core, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    stack.callback(_stop, reward)
    assert reward.stdout is not None
    target = (await asyncio.to_thread(reward.stdout.readline)).strip()
    if not target:
        raise RuntimeError("the reward double's process exited before serving")
    return target


def _stop(process: subprocess.Popen[str]) -> None:
    if process.stdin is not None:
        process.stdin.close()
    process.terminate()
    process.wait(timeout=30)


async def measure_mode(
    model: Path, age: int, steps: int, cores: dict[str, Any], reward_process: bool = True
) -> dict[str, float]:
    """One GRPO run of WARMUP_STEPS + steps at max_trajectory_age_steps=age."""
    from rlfleet_core.client import wait_for_serving
    from rlfleet_trainer.loop import run_grpo
    from rlfleet_trainer.run import build_context

    side_core = cores.get("rollout_core")
    run_dir = Path(tempfile.mkdtemp(prefix=f"bench-grpo-age{age}-"))
    port = _free_port()
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(shutil.rmtree, run_dir, ignore_errors=True)
        args = ["-m", "rlfleet_rollout", "--port", str(port), "engine=hf", f"model={model}"]
        rollout = _spawn(
            [*args, "engine_config.seed=0"],
            side_core,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        stack.callback(_stop, rollout)
        reward_target = await _reward_target(stack, model, side_core, reward_process)
        await wait_for_serving(f"127.0.0.1:{port}", timeout_s=180.0)
        recipe = _recipe(model, f"127.0.0.1:{port}", reward_target, age, WARMUP_STEPS + steps)
        ctx = build_context(recipe, run_dir, rows=PROMPTS)  # type: ignore[arg-type]
        ends: list[float] = []
        ctx.on_step = lambda step, metrics: ends.append(time.monotonic())
        if cores["pinned"]:
            pin_this_process({cores["trainer_core"]})  # gRPC threads started since, too
        try:
            await run_grpo(ctx)
        finally:
            await ctx.rollout.close()
            await ctx.reward.close()
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    metrics = [json.loads(x) for x in lines][WARMUP_STEPS:]
    result = {
        "steps_per_hour": steps / (ends[-1] - ends[WARMUP_STEPS - 1]) * 3600,
        "max_lag": max(m["policy_lag/max"] for m in metrics),
    }
    for key in ("wait_for_groups_s", "logprobs_s", "train_s", "publish_s", "step_s"):
        result[f"timing/{key}"] = sum(m[f"timing/{key}"] for m in metrics) / len(metrics)
    return result


async def _measure(model: Path, steps: int, cores: dict[str, Any]) -> dict[str, float]:
    results: dict[str, float] = {}
    for name, age in (("sync", 0), ("async", 1)):
        for key, value in (await measure_mode(model, age, steps, cores)).items():
            results[f"{name}_{key}"] = value
    return results


def _ideal_ratio(m: dict[str, float]) -> float:
    generate = m["sync_timing/wait_for_groups_s"]
    train = m["sync_timing/train_s"] + m["sync_timing/logprobs_s"] + m["sync_timing/publish_s"]
    return m["sync_timing/step_s"] / max(generate, train, 1e-9)


def run(quick: bool) -> list[BenchResult]:
    import torch
    from rlfleet_core.models import resolve_model

    torch.set_num_threads(1)  # one thread each: the trainer here, the rollout process
    model = resolve_model("tiny")
    steps = 4 if quick else 12
    cores = plan_cores()
    original = os.sched_getaffinity(0)
    try:
        measured = asyncio.run(_measure(model, steps, cores))
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
                "steps": steps,
                "warmup_steps": WARMUP_STEPS,
                "recipe": "tiny: 4 prompts x 4 generations, ~100-token prompts, 32 new tokens, hf rollout engine",
                "pinning": cores["pinning"],
                "threads": "torch 1 (trainer), OMP_NUM_THREADS=1 (rollout, reward)",
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


if __name__ == "__main__":
    for result in run(quick="--quick" in sys.argv):
        print(json.dumps(result.to_json()))
