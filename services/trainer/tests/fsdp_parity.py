"""FSDP2 probe (run by test_torch_backend.py under torchrun; not a test module itself).

    torchrun --nproc_per_node 2 fsdp_parity.py --out OUT MODEL_DIR

Every rank trains one step on its half of a fixed batch with the torch backend sharded by
FSDP2 (loss normalised by the global token count); rank 0 writes OUT/fsdp.pt with the
summed loss, the grad norm and the full HF state dict after the step, to compare with one
process training on the whole batch.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.distributed as dist
from rlfleet_trainer.algorithms import LossConfig
from rlfleet_trainer.backends.torch_backend import TorchBackendConfig, TorchPolicy
from rlfleet_trainer.batch import TrainBatch, Trajectory, build_train_batch

LOSS = LossConfig(importance_sampling="tis")


def fixed_batch() -> TrainBatch:
    gen = torch.Generator().manual_seed(3)
    trajs = [
        Trajectory(
            prompt_id=f"p{i // 2}",
            sample_index=i % 2,
            prompt_token_ids=torch.randint(3, 512, (3 + i,), generator=gen).tolist(),
            token_ids=torch.randint(3, 512, (2 + 3 * i,), generator=gen).tolist(),
            generation_logprobs=[-6.2] * (2 + 3 * i),
            truncated=False,
            advantage=[1.0, -1.0, 0.5, -0.5][i],
        )
        for i in range(4)
    ]
    return build_train_batch(trajs, torch.ones(4))


def policy(model: Path) -> TorchPolicy:
    torch.manual_seed(0)
    return TorchPolicy(
        TorchBackendConfig(model_path=model, lr=1e-3, max_grad_norm=None, device="cpu")
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("model", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    batch = fixed_batch()
    share = batch.size // world
    mine = batch.slice(rank * share, (rank + 1) * share)
    sharded = policy(args.model)
    metrics = sharded.train_step(mine, LOSS)
    loss = torch.tensor([metrics["loss"]], dtype=torch.float64)
    dist.all_reduce(loss)
    state = dict(sharded.hf_state_dict())  # collective: every rank gathers
    if rank == 0:
        torch.save(
            {"loss": float(loss), "grad_norm": metrics["grad_norm"], "state": state},
            args.out / "fsdp.pt",
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
