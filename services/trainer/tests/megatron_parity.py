"""Megatron vs torch parity probe (run by test_megatron.py; not a test module itself).

    torchrun --nproc_per_node 2 megatron_parity.py --tp 2 --out OUT MODEL_DIR [MODEL_DIR ...]
    torchrun --nproc_per_node 4 megatron_parity.py --tp 2 --pp 2 --out OUT MODEL_DIR

For each model: megatron logprobs on a fixed batch, one train step (loss, grad norm),
logprobs after the step, and the HF state dict it publishes; rank 0 writes OUT/<i>.pt and
every rank OUT/<i>.rank<r>.pt. The world left over by TP × PP is data parallel: each DP
replica takes its contiguous slice of the batch (`dp_slice`).
With --save-load, each model's policy is also saved, reloaded into a fresh policy
(`reloaded`: its logprobs) and loaded into one built at PP=1 (`mismatch`: the error).
With --resume CKPT --phase save: after the step, save to CKPT, take a second step (its
results in OUT/<i>.rank<r>.pt under "second"), then kill -9 this rank; --phase load: a fresh
policy loads CKPT and takes the same second step.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

import torch
from rlfleet_contracts.recipe import GRPOConfig
from rlfleet_trainer.batch import TrainBatch, Trajectory, build_train_batch

LOSS = GRPOConfig(importance_sampling="tis", ratio_clip_c=3.0)


def parity_batch(vocab: int) -> TrainBatch:
    gen = torch.Generator().manual_seed(7)
    trajs = []
    for i in range(4):
        prompt = torch.randint(3, vocab, (4 + i,), generator=gen).tolist()
        response = torch.randint(3, vocab, (3 + 2 * i,), generator=gen).tolist()
        trajs.append(
            Trajectory(
                prompt_id=f"p{i}",
                sample_index=0,
                prompt_token_ids=prompt,
                token_ids=response,
                generation_logprobs=(-torch.rand(len(response), generator=gen) - 5.0).tolist(),
                truncated=False,
                advantage=[1.0, -0.5, 0.25, -1.0][i],
            )
        )
    return build_train_batch(trajs, torch.ones(4))


def dp_slice(batch: TrainBatch, rank: int, size: int) -> TrainBatch:
    """Data-parallel replica `rank`'s contiguous share of `batch` (the stage's split)."""
    per = batch.size // size
    return batch.slice(rank * per, (rank + 1) * per)


def data_parallel() -> tuple[int, int]:
    """This rank's DP replica and the replica count, from megatron's parallel state."""
    from megatron.core import parallel_state

    return parallel_state.get_data_parallel_rank(), parallel_state.get_data_parallel_world_size()


def run_backend(policy: object, vocab: int, dp: tuple[int, int] = (0, 1)) -> dict[str, object]:
    batch = dp_slice(parity_batch(vocab), *dp)
    before = policy.logprobs(batch)  # type: ignore[attr-defined]
    batch.prev_logprobs_NT = before + 0.01 * batch.mask_NT  # exercise ratios ≠ 1
    metrics = policy.train_step(batch, LOSS)  # type: ignore[attr-defined]
    after = policy.logprobs(batch)  # type: ignore[attr-defined]
    state = {k: v.clone() for k, v in policy.hf_state_dict()}  # type: ignore[attr-defined]
    return {
        "before": before,
        "after": after,
        "metrics": metrics,
        "state": state,
        "mask": batch.mask_NT,
    }


def megatron_policy(model: Path, tp: int, pp: int) -> object:
    from rlfleet_trainer.backends.megatron_backend import MegatronPolicy
    from rlfleet_trainer.backends.megatron_setup import MegatronBackendConfig

    # Micro-batches of 1 over 4 samples: the 1F1B schedule runs warm-up, steady state and
    # cool-down (and micro-batches of different lengths) even at PP=2.
    micro = 3 if pp == 1 else 1
    return MegatronPolicy(
        MegatronBackendConfig(
            model_path=model,
            tensor_parallel_size=tp,
            pipeline_parallel_size=pp,
            lr=1e-3,
            train_micro_batch_size=micro,
            logprob_micro_batch_size=micro,
        )
    )


def second_step(policy: object, vocab: int) -> dict[str, object]:
    """A step on the DP slice from the current weights and optimizer state."""
    batch = dp_slice(parity_batch(vocab), *data_parallel())
    batch.prev_logprobs_NT = policy.logprobs(batch)  # type: ignore[attr-defined]
    metrics = policy.train_step(batch, LOSS)  # type: ignore[attr-defined]
    after = policy.logprobs(batch)  # type: ignore[attr-defined]
    state = {k: v.clone() for k, v in policy.hf_state_dict()}  # type: ignore[attr-defined]
    return {"metrics": metrics, "after": after, "state": state}


def megatron_results(model: Path, tp: int, pp: int = 1, ckpt: Path | None = None) -> dict:
    import torch.distributed as dist
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(model).vocab_size
    policy = megatron_policy(model, tp, pp)
    results = run_backend(policy, vocab, data_parallel())
    # The backend's own view (the stage slices the batch by it).
    results["dp"] = (
        getattr(policy, "data_parallel_rank", None),
        getattr(policy, "data_parallel_size", None),
    )
    if ckpt is not None:
        if dist.get_rank() == 0:
            ckpt.mkdir(parents=True)
        dist.barrier()
        policy.save(ckpt)  # type: ignore[attr-defined]
        fresh = megatron_policy(model, tp, pp)
        fresh.load(ckpt)  # type: ignore[attr-defined]
        results["reloaded"] = fresh.logprobs(parity_batch(vocab))  # type: ignore[attr-defined]
        try:
            megatron_policy(model, tp, 1).load(ckpt)  # type: ignore[attr-defined]
            results["mismatch"] = None
        except ValueError as exc:
            results["mismatch"] = str(exc)
    return results


def main() -> None:
    import torch.distributed as dist

    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--save-load", action="store_true")
    parser.add_argument("--resume", type=Path)
    parser.add_argument("--phase", choices=("save", "load"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("models", nargs="+", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    args.out.mkdir(parents=True, exist_ok=True)
    if args.resume is not None:
        resume(
            args.models[0], args.tp, args.pp, args.resume, args.phase, args.out / f"0.rank{rank}.pt"
        )
    for i, model in enumerate(args.models):
        ckpt = args.out / f"ckpt{i}" if args.save_load else None
        results = megatron_results(model, args.tp, args.pp, ckpt)
        torch.save(results, args.out / f"{i}.rank{dist.get_rank()}.pt")
        if dist.get_rank() == 0:
            torch.save(results, args.out / f"{i}.pt")
    dist.destroy_process_group()


def resume(model: Path, tp: int, pp: int, ckpt: Path, phase: str, out: Path) -> None:
    """--phase save: one step, save, a second step, kill -9 (no clean shutdown);
    --phase load: load into a fresh policy, the same second step."""
    import torch.distributed as dist
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(model).vocab_size
    policy = megatron_policy(model, tp, pp)
    if phase == "save":
        run_backend(policy, vocab, data_parallel())
        policy.save(ckpt)  # type: ignore[attr-defined]
    else:
        policy.load(ckpt)  # type: ignore[attr-defined]
    torch.save({"second": second_step(policy, vocab)}, out)
    if phase == "save":
        os.kill(os.getpid(), signal.SIGKILL)
    dist.destroy_process_group()
    sys.exit(0)


if __name__ == "__main__":
    main()
