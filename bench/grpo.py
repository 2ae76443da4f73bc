"""Asynchronous vs synchronous GRPO: optimizer steps per hour on the same tiny recipe, in
the same run. Target: async ≥ 1.5× sync.

Both runs use the bundled tiny model (2 layers, hidden 128, vocab 512), the same seeds and
prompts, and the trainer's real loop over gRPC. The rollout service is a separate process
(the real `rlfleet-rollout`, hf engine) so generation and training can use different cores,
as they use different GPUs in production; the reward is the trainer's reward test double
(a character-count reward served over gRPC in this process). Sync = max_trajectory_age_steps
0 (generate, then train, then publish); async = 1 (generation for the next step overlaps
training, weights are published in flight).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rlfleet_core.bench import BenchResult

DESCRIPTION = "GRPO steps/hour, async (max_trajectory_age_steps=1) vs sync, tiny recipe on CPU"

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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _wait_serving(target: str, timeout_s: float = 180.0) -> None:
    from rlfleet_core.client import wait_for_serving

    await wait_for_serving(target, timeout_s=timeout_s)


async def _measure(model: Path, steps: int) -> dict[str, float]:
    from rlfleet_trainer.loop import run_grpo
    from rlfleet_trainer.run import build_context
    from rlfleet_trainer.testing import serve_doubles

    results: dict[str, float] = {}
    for name, age in (("sync", 0), ("async", 1)):
        port = _free_port()
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        rollout = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rlfleet_rollout",
                "--port",
                str(port),
                "engine=hf",
                f"model={model}",
                "engine_config.seed=0",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        run_dir = Path(tempfile.mkdtemp(prefix=f"bench-grpo-{name}-"))
        try:
            await _wait_serving(f"127.0.0.1:{port}")
            async with serve_doubles(model) as (_, reward_target, _, _):
                recipe = _recipe(model, f"127.0.0.1:{port}", reward_target, age, steps + 1)
                ctx = build_context(recipe, run_dir, rows=PROMPTS)  # type: ignore[arg-type]
                started = time.monotonic()
                await run_grpo(ctx)
                elapsed = time.monotonic() - started
                lines = (run_dir / "metrics.jsonl").read_text().splitlines()
                metrics = [json.loads(x) for x in lines]
                # the first step carries warm-up (first forward/backward); count the rest
                first = metrics[0]["timing/step_s"]
                results[f"{name}_steps_per_hour"] = steps / max(elapsed - first, 1e-9) * 3600
                results[f"{name}_max_lag"] = max(m["policy_lag/max"] for m in metrics)
                for key in (
                    "timing/wait_for_groups_s",
                    "timing/train_s",
                    "timing/logprobs_s",
                    "timing/publish_s",
                    "timing/step_s",
                ):
                    results[f"{name}_{key}"] = sum(m[key] for m in metrics[1:]) / steps
                await ctx.rollout.close()
                await ctx.reward.close()
        finally:
            rollout.terminate()
            rollout.wait(timeout=30)
            shutil.rmtree(run_dir, ignore_errors=True)
    return results


def _ideal_ratio(m: dict[str, float]) -> float:
    generate = m["sync_timing/wait_for_groups_s"]
    train = m["sync_timing/train_s"] + m["sync_timing/logprobs_s"] + m["sync_timing/publish_s"]
    return m["sync_timing/step_s"] / max(generate, train, 1e-9)


def run(quick: bool) -> list[BenchResult]:
    import torch
    from rlfleet_core.models import resolve_model

    torch.set_num_threads(1)  # the trainer one core, the rollout process the other
    model = resolve_model("tiny")
    steps = 4 if quick else 10
    measured = asyncio.run(_measure(model, steps))
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
                "recipe": "tiny: 4 prompts x 4 generations, ~100-token prompts, 32 new tokens, hf rollout engine",
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
