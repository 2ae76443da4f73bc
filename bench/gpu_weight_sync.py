"""Trainer → rollout weight broadcast over NCCL between two GPUs: rlfleet's weight path
(`rlfleet_weights`: bucket plan, double-buffered pack/broadcast, receive straight into
the live model's parameters) against a bare ProcessGroupNCCL broadcast of the same bucket
sizes between preallocated buffers, in the same run. Target: >= 0.8x the bare broadcast.

    python bench/gpu_weight_sync.py [--models smollm2-135m,llama-1b,llama-3b] [--repeats 5]

Needs two CUDA devices, torch, transformers and protobuf (no grpc, pydantic or vLLM): the
libs are imported from the source tree. Writes bench/results/weight-sync-gpu.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

REPO = Path(__file__).resolve().parents[1]
for src in ("libs/proto", "libs/core", "libs/weights", "services/trainer"):
    sys.path.insert(0, str(REPO / src / "src"))

from rlfleet_core.ports import pick_free_port  # noqa: E402
from rlfleet_trainer.model_shapes import LLAMA_1B, LLAMA_3B, SMOLLM2_135M  # noqa: E402

DESCRIPTION = "NCCL weight broadcast GB/s between two GPUs vs a bare ProcessGroupNCCL broadcast"
SHAPES = {"smollm2-135m": SMOLLM2_135M, "llama-1b": LLAMA_1B, "llama-3b": LLAMA_3B}


def build_model(name: str, device: torch.device) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**{**SHAPES[name], "tie_word_embeddings": False}, torch_dtype="bfloat16")
    torch.manual_seed(0)
    with torch.device(device):
        return LlamaForCausalLM(config).to(torch.bfloat16)


def worker(rank: int, port: int, models: list[str], repeats: int, bucket_bytes: int, queue) -> None:  # type: ignore[no-untyped-def]
    from rlfleet_weights.collective import (
        GroupSpec,
        WeightGroup,
        receive_weights_into,
        send_weights,
    )
    from rlfleet_weights.plan import plan_buckets, specs_of

    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    group = WeightGroup(GroupSpec("127.0.0.1", port, 2, rank, backend="nccl"))
    for name in models:
        model = build_model(name, device)
        params = dict(model.state_dict())
        plan = plan_buckets(specs_of(params), bucket_bytes)
        if rank == 0:  # the trainer publishes different weights than the receiver holds
            with torch.no_grad():
                for p in params.values():
                    p.add_(1.0)
        ours, bare = [], []
        buffers = [torch.empty(b.nbytes, dtype=torch.uint8, device=device) for b in plan.buckets]
        for _ in range(repeats + 1):  # first round warms NCCL channels and the caches
            torch.cuda.synchronize()
            group.pg.barrier().wait()
            start = time.perf_counter()
            if rank == 0:
                send_weights(group, params, bucket_bytes)
            else:
                receive_weights_into(group, plan, params)
            torch.cuda.synchronize()
            ours.append(time.perf_counter() - start)
            group.pg.barrier().wait()
            start = time.perf_counter()
            works = [group.pg.broadcast(buf, 0) for buf in buffers]
            for work in works:
                work.wait()
            torch.cuda.synchronize()
            bare.append(time.perf_counter() - start)
        if rank == 1:
            # The receiver's parameters must now be the sender's (its own + 1), everywhere.
            reference = build_model(name, device).state_dict()
            correct = all(torch.equal(params[k], (reference[k] + 1.0)) for k in params)
            del reference
            queue.put(
                {
                    "model": name,
                    "bytes": plan.total_bytes,
                    "buckets": len(plan.buckets),
                    "ours_s": statistics.median(ours[1:]),
                    "bare_s": statistics.median(bare[1:]),
                    "received_correctly": correct,
                }
            )
        del model, params, buffers
        torch.cuda.empty_cache()
    group.close()


def measure(argv: list[str] | None = None) -> list[Any]:
    """Both sides measured in one run; returns BenchResults (not yet recorded)."""
    from rlfleet_core.bench import BenchResult, describe_device

    parser = argparse.ArgumentParser(description=DESCRIPTION)
    parser.add_argument("--models", default="smollm2-135m,llama-1b,llama-3b")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--bucket-mb", type=int, default=256)
    args = parser.parse_args(argv)
    if torch.cuda.device_count() < 2:
        sys.exit("needs two CUDA devices")
    models = args.models.split(",")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = pick_free_port()  # the rendezvous port: both ranks need it in advance
    procs = [
        ctx.Process(
            target=worker, args=(r, port, models, args.repeats, args.bucket_mb << 20, queue)
        )
        for r in range(2)
    ]
    for p in procs:
        p.start()
    rows = [queue.get(timeout=1800) for _ in models]
    for p in procs:
        p.join(timeout=120)
    device = describe_device()
    results = []
    for row in rows:
        gbps, base_gbps = row["bytes"] / row["ours_s"] / 1e9, row["bytes"] / row["bare_s"] / 1e9
        extra = {
            "model": row["model"],
            "bytes": row["bytes"],
            "buckets": row["buckets"],
            "bucket_mb": args.bucket_mb,
            "received_correctly": row["received_correctly"],
            "latency_s": round(row["ours_s"], 4),
            "bare_latency_s": round(row["bare_s"], 4),
        }
        results.append(
            BenchResult(
                "weight-sync-gpu",
                f"gbps_{row['model']}",
                gbps,
                "GB/s",
                base_gbps,
                target=0.8,
                device=device,
                extra=extra,
            )
        )
    return results


def run(quick: bool = False) -> list[Any]:
    """`rlfleet bench gpu-weight-sync` (needs a machine with two GPUs)."""
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # leave NVLink multicast off
    return measure(["--models", "smollm2-135m,llama-1b"] if quick else [])


if __name__ == "__main__":  # without the rlfleet CLI (e.g. on a bare GPU box)
    from rlfleet_core.bench import record

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    for row in record(measure(), REPO / "bench" / "results"):
        print(json.dumps(row))
