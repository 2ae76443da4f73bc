"""A GRPO stage at several trainer ranks on 2 GPUs, the rollout service's vllm engine
serving the policy: the torch backend at DP=1 (the baseline, same run) and DP=2 (FSDP2
over both GPUs), and the megatron backend at TP=2. Every layout trains the same recipe
from the same random-weight model and
pushes its weights to vLLM over NCCL after each step (GPU_SHAPE: ~90M parameters).

The trainer runs as `rlfleet-trainer run` under torchrun, exactly as `rlfleet rl` launches
a stage with `policy.world_size` > 1; vLLM shares GPU 1 with trainer rank 1 (a third of its
memory). The reward is a stand-in served in this process (the share of 'e' characters:
the reward gateway's environments need packages the GPU image lacks): the point here is
that the ranks train and publish together, and how long a step takes.

    python bench/gpu_ranks.py [--steps 8] [--out DIR] [--cpu]

--cpu checks the script on a CPU machine (gloo, hf engine, the smoke shape): no numbers.
Writes DIR/gpu-ranks.jsonl (one line per layout) and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

GPU_SHAPE: dict[str, Any] = {
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "vocab_size": 512,
    "tie_word_embeddings": True,
}
"""SmolLM2-135M's depth and width class with 8 query / 4 KV heads (its own 9 / 3 do not
split over TP=2: megatron refused them on the first GPU run), over the tiny vocabulary."""

LAYOUTS: dict[str, tuple[int, list[str]]] = {
    "torch-dp1": (1, ["policy.backend=torch"]),
    "torch-dp2": (2, ["policy.backend=torch", "policy.data_parallel_size=2"]),
    "megatron-tp2": (2, ["policy.backend=megatron", "policy.tensor_parallel_size=2"]),
}


def rows(count: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    words = ["tree", "seven", "green", "eleven", "sleep", "bread", "cheese", "queen"]
    return [
        {
            "id": f"r{seed}-{i}",
            "responses_create_params": {
                "input": [{"role": "user", "content": " ".join(rng.choices(words, k=24))}]
            },
            "env": "e_share",
        }
        for i in range(count)
    ]


def recipe_overrides(args: Any, model: Path, rollout: str, reward: str, gpu: bool) -> list[str]:
    return [
        f"policy.model={model}",
        "policy.max_total_sequence_length=512",
        "policy.dtype=bfloat16" if gpu else "policy.dtype=float32",
        f"policy.train_micro_batch_size={args.prompts * args.generations // 2}",
        f"policy.logprob_micro_batch_size={args.prompts * args.generations // 2}",
        f"generation.max_new_tokens={args.new_tokens}",
        "generation.seed=1",
        f"grpo.num_prompts_per_step={args.prompts}",
        f"grpo.num_generations_per_prompt={args.generations}",
        f"grpo.max_num_steps={args.steps}",
        "grpo.lr=1e-5",
        "grpo.max_trajectory_age_steps=0",
        "grpo.dynamic_sampling=false",
        "grpo.val_at_start=false",
        "grpo.val_at_end=false",
        f"services.rollout={rollout}",
        f"services.reward={reward}",
        f"services.weight_transport={'nccl' if gpu else 'gloo'}",
        "checkpoint.export_hf=false",
        "checkpoint.save_every_steps=0",
    ]


async def run_layout(
    name: str, args: Any, model: Path, rollout: str, reward: str, gpu: bool, work: Path
) -> dict[str, Any]:
    from rlfleet_contracts.recipe import RecipeConfig
    from rlfleet_contracts.run_folder import StageFolder
    from rlfleet_core.config import dump_yaml, load_config

    ranks, extra = LAYOUTS[name]
    run_dir = work / name
    run_dir.mkdir(parents=True)
    recipe = load_config(
        RecipeConfig, overrides=[*recipe_overrides(args, model, rollout, reward, gpu), *extra]
    )
    recipe_file = run_dir / "recipe.yaml"
    recipe_file.write_text(dump_yaml(recipe))
    rows_file = work / "rows.jsonl"
    cmd = [sys.executable]
    if ranks > 1:
        cmd += ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)]
    cmd += ["-m", "rlfleet_trainer", "run", "-c", str(recipe_file), "--run-dir", str(run_dir)]
    cmd += ["--rows", str(rows_file)]
    started = time.monotonic()
    with open(run_dir / "trainer.log", "w") as log:
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdout=log, stderr=log, start_new_session=True
        )
        try:
            code = await asyncio.wait_for(proc.wait(), args.layout_timeout_s)
        except TimeoutError:
            # Every rank prints its threads' stacks (SIGUSR1, see rlfleet_trainer.__main__),
            # then the whole process group goes: a rank left behind would hold its GPU.
            subprocess.run(["pkill", "-USR1", "-f", "rlfleet_trainer run"], check=False)
            await asyncio.sleep(3)
            # SIGUSR1 also ends torchrun itself, which may take its group with it
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            code = -9
    wall = time.monotonic() - started
    folder = StageFolder(run_dir)
    metrics = (
        [json.loads(x) for x in folder.metrics.read_text().splitlines()]
        if folder.metrics.exists()
        else []
    )
    # The first step carries compilation and allocator warm-up: report the rest.
    steady = [m for m in metrics if m["step"] > 1] or metrics
    result: dict[str, Any] = {
        "layout": name,
        "ranks": ranks,
        "exit_code": code,
        "steps": len(metrics),
        "wall_s": round(wall, 1),
    }
    if steady:
        for key in ("timing/step_s", "timing/train_s", "timing/logprobs_s", "timing/publish_s"):
            values = [m[key] for m in steady if key in m]
            if values:
                result[key.split("/")[1].replace("_s", "_median_s")] = round(
                    statistics.median(values), 4
                )
        result["train_tokens_per_s_median"] = round(
            statistics.median(m["throughput/train_tokens_per_s"] for m in steady), 1
        )
        result["loss_first_last"] = [metrics[0].get("loss"), metrics[-1].get("loss")]
        result["reward_first_last"] = [
            metrics[0].get("reward/mean"),
            metrics[-1].get("reward/mean"),
        ]
    if code != 0:
        result["log_tail"] = (run_dir / "trainer.log").read_text()[-3000:]
    return result


async def main_async(args: Any) -> list[dict[str, Any]]:
    from _gpu_vllm_common import (
        CPU_SHAPE,
        Service,
        service_overrides,
        write_model,
    )
    from rlfleet_trainer.testing import serve_doubles

    gpu = not args.cpu
    work = Path(tempfile.mkdtemp(prefix="gpu-ranks-"))
    model = write_model(work / "model", CPU_SHAPE if args.cpu else GPU_SHAPE, "float32")
    (work / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(4000, 1)))
    seqs = args.prompts * args.generations
    if gpu:
        overrides = service_overrides(model, "bfloat16", eager=args.eager, gpu=True, seqs=seqs)
        overrides = [o.replace("utilization=0.4", "utilization=0.3") for o in overrides]
        env = {"CUDA_VISIBLE_DEVICES": "1"}
    else:
        overrides = ["server.port=0", "server.http_port=0", "engine=hf", f"model={model}"]
        env = {}
    service = await Service(work, overrides, env, "rollout").ready()
    results = []
    try:
        async with serve_doubles(model) as (_, reward, _, _):
            rollout = f"127.0.0.1:{service.grpc_port}"
            for name in args.layouts:
                print(f"== {name}", flush=True)
                result = await run_layout(name, args, model, rollout, reward, gpu, work)
                print(json.dumps({k: v for k, v in result.items() if k != "log_tail"}), flush=True)
                results.append(result)
                # Each layout is kept as it finishes: a later one may outlast the call.
                args.out.mkdir(parents=True, exist_ok=True)
                with open(args.out / "gpu-ranks.partial.jsonl", "a") as f:
                    f.write(json.dumps(result) + "\n")
                log = work / name / "trainer.log"
                if log.exists():
                    (args.out / f"trainer-{name}.log").write_text(log.read_text()[-200_000:])
    finally:
        service.stop()
    return results


DESCRIPTION = (
    "GRPO stage at 2 trainer ranks on 2 GPUs (vllm engine): torch DP=2, megatron TP=2 vs DP=1"
)


def run(quick: bool = False) -> list[Any]:
    """`rlfleet bench gpu-ranks`: median step time of each layout, DP=1 the baseline (needs
    two CUDA GPUs, CUDA vLLM and megatron-core; bench/gpu_vllm.sh ranks)."""
    import torch
    from gpu_vllm import device_name
    from rlfleet_core.bench import BenchResult

    if torch.cuda.device_count() < 2:
        raise RuntimeError("gpu-ranks needs two CUDA GPUs and CUDA vLLM; see bench/gpu_vllm.sh")
    args = argparse.Namespace(steps=4 if quick else 8, prompts=16, generations=8, new_tokens=64,
                              layouts=list(LAYOUTS), layout_timeout_s=240, cpu=False, eager=False)  # fmt: skip
    results = asyncio.run(main_async(args))
    base = next(r for r in results if r["layout"] == "torch-dp1")
    return [
        BenchResult(
            "gpu-ranks",
            f"{r['layout']}_step_s",
            r.get("step_median_s", float("nan")),
            "s",
            base.get("step_median_s", float("nan")),
            target=None,
            higher_is_better=False,
            device=device_name(),
            extra=r,
        )
        for r in results
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    parser.add_argument("--layout-timeout-s", type=float, default=240)
    parser.add_argument("--eager", action="store_true", help="vLLM without CUDA graphs")
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    if args.cpu:
        args.prompts, args.generations, args.new_tokens = 4, 4, 16
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from gpu_vllm import device_name

    device = "cpu" if args.cpu else device_name()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    results = asyncio.run(main_async(args))
    base = next((r for r in results if r["layout"] == "torch-dp1"), None)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "gpu-ranks.jsonl", "a") as f:
        for r in results:
            if base and base.get("step_median_s") and r.get("step_median_s"):
                r["step_speedup_vs_dp1"] = round(base["step_median_s"] / r["step_median_s"], 3)
            f.write(json.dumps({**r, "device": device, "timestamp": stamp}) + "\n")
    print(f"{'layout':14} {'ranks':>5} {'exit':>4} {'steps':>5} {'step s':>8} {'train s':>8} "
          f"{'publish s':>9} {'tok/s':>9}")  # fmt: skip
    for r in results:
        print(f"{r['layout']:14} {r['ranks']:>5} {r['exit_code']:>4} {r['steps']:>5} "
              f"{r.get('step_median_s', float('nan')):>8.3f} {r.get('train_median_s', float('nan')):>8.3f} "
              f"{r.get('publish_median_s', float('nan')):>9.3f} "
              f"{r.get('train_tokens_per_s_median', float('nan')):>9.0f}")  # fmt: skip


if __name__ == "__main__":
    main()
