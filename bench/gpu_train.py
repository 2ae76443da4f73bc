"""Torch-backend training throughput on one GPU: tokens/s and MFU for a SmolLM2-135M-shaped
and a ~1B Llama config (random weights), bf16, against the bf16 matmul peak measured in
the same run. Runs the trainer's real `TorchPolicy.train_step` (GRPO loss, gradient
accumulation, AdamW) on a synthetic GRPO batch.

    python bench/gpu_train.py [--models smollm2-135m,llama-1b] [--seq-len 1024]
        [--micro-batch 8] [--global-batch 32] [--steps 5] [--param-dtype float32|bfloat16]
        [--out bench/results/gpu_train.jsonl]

Needs only torch, transformers and safetensors (no vllm, ray, grpc or pydantic): the
trainer's modules are imported from services/trainer/src directly, so it runs on the GPU
machine from a plain copy of the repository.

MFU = achieved model FLOP/s ÷ measured peak, with training FLOPs per token
= 6·N (N = parameters without the embedding table) + 12·layers·hidden·seq (attention).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "services" / "trainer" / "src"))
from rlfleet_trainer.model_shapes import LLAMA_1B, SMOKE, SMOLLM2_135M  # noqa: E402

DESCRIPTION = "torch-backend GRPO training tokens/s and MFU on one GPU (bf16), 135M and ~1B"

CONFIGS = {"smollm2-135m": SMOLLM2_135M, "llama-1b": LLAMA_1B, "tiny": SMOKE}


def measure_bf16_peak(device: torch.device, size: int = 8192, iters: int = 20) -> float:
    """Dense bf16 matmul FLOP/s on this device (the MFU denominator)."""
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        a @ b
    torch.cuda.synchronize()
    return 2 * size**3 * iters / (time.perf_counter() - start)


def build_model_folder(name: str, seq_len: int, folder: Path) -> tuple[Path, int, int]:
    """A random-weight Llama folder; returns (path, parameters, non-embedding parameters)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(max_position_embeddings=max(seq_len, 2048), **CONFIGS[name])
    with torch.device("meta"):
        meta = LlamaForCausalLM(config)
    total = sum(p.numel() for p in meta.parameters())
    embedding = config.vocab_size * config.hidden_size
    path = folder / name
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    return path, total, total - embedding


def synthetic_batch(vocab: int, global_batch: int, seq_len: int):  # type: ignore[no-untyped-def]
    """GRPO-shaped: a quarter prompt, three quarters response, all sequences full length."""
    from rlfleet_trainer.batch import Trajectory, build_train_batch

    gen = torch.Generator().manual_seed(0)
    prompt_len = seq_len // 4
    trajectories = []
    for i in range(global_batch):
        ids = torch.randint(3, vocab, (seq_len,), generator=gen).tolist()
        trajectories.append(
            Trajectory(
                prompt_id=f"p{i // 8}",
                sample_index=i % 8,
                prompt_token_ids=ids[:prompt_len],
                token_ids=ids[prompt_len:],
                generation_logprobs=[-5.0] * (seq_len - prompt_len),
                truncated=False,
                advantage=1.0 if i % 2 else -1.0,
            )
        )
    return build_train_batch(trajectories, torch.ones(global_batch))


def bench_model(
    name: str, args: argparse.Namespace, peak: float, folder: Path
) -> dict[str, object]:
    from rlfleet_contracts.recipe import GRPOConfig
    from rlfleet_trainer.backends.torch_backend import TorchBackendConfig, TorchPolicy

    path, params, non_embedding = build_model_folder(name, args.seq_len, folder)
    policy = TorchPolicy(
        TorchBackendConfig(
            model_path=path,
            lr=1e-6,
            dtype="bfloat16",
            train_micro_batch_size=args.micro_batch,
            activation_checkpointing=args.checkpointing,
        )
    )
    if args.param_dtype == "bfloat16":
        # pure bf16 parameters and optimizer state (no float32 master copy)
        policy.model.to(torch.bfloat16)
        policy.optimizer = torch.optim.AdamW(policy.model.parameters(), lr=1e-6, fused=True)
    batch = synthetic_batch(CONFIGS[name]["vocab_size"], args.global_batch, args.seq_len)
    loss = GRPOConfig(force_on_policy_ratio=True)
    policy.train_step(batch, loss)  # warm-up (allocator, kernels)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(args.steps):
        policy.train_step(batch, loss)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    tokens = batch.num_tokens * args.steps
    layers, hidden = CONFIGS[name]["num_hidden_layers"], CONFIGS[name]["hidden_size"]
    flops_per_token = 6 * non_embedding + 12 * layers * hidden * args.seq_len
    achieved = tokens / elapsed * flops_per_token
    del policy
    torch.cuda.empty_cache()
    return {
        "name": "gpu_train",
        "metric": f"train_tokens_per_s_{name}",
        "value": round(tokens / elapsed, 1),
        "unit": "tokens/s",
        "model": name,
        "parameters": params,
        "non_embedding_parameters": non_embedding,
        "seq_len": args.seq_len,
        "micro_batch": args.micro_batch,
        "global_batch": args.global_batch,
        "param_dtype": args.param_dtype,
        "compute": "bf16 autocast" if args.param_dtype == "float32" else "bf16",
        "achieved_tflops": round(achieved / 1e12, 1),
        "peak_bf16_tflops_measured": round(peak / 1e12, 1),
        "mfu": round(achieved / peak, 4),
        "max_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
    }


def main(argv: list[str] | None = None) -> list[dict[str, object]]:
    parser = argparse.ArgumentParser(description=DESCRIPTION)
    parser.add_argument("--models", default="smollm2-135m,llama-1b")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--global-batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--param-dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--checkpointing", action="store_true", help="activation checkpointing")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "gpu_train.jsonl")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench/gpu_train.py needs a CUDA GPU (run it on the GPU machine)")
    device = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    peak = measure_bf16_peak(device)
    card = f"{torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"
    results = []
    with tempfile.TemporaryDirectory() as folder:
        for name in args.models.split(","):
            result = bench_model(name, args, peak, Path(folder))
            result.update(
                device=f"cuda: {card}",
                torch=torch.__version__,
                python=platform.python_version(),
                timestamp=datetime.now(UTC).isoformat(timespec="seconds"),
            )
            print(json.dumps(result), flush=True)
            results.append(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as f:
        for result in results:
            f.write(json.dumps(result) + "\n")
    return results


def run(quick: bool) -> list[object]:
    """`rlfleet bench gpu-train`: records to bench/results/gpu_train.jsonl itself."""
    main(["--steps", "2" if quick else "5"])
    return []


if __name__ == "__main__":
    main()
