"""FSDP2 probe (run by test_torch_backend.py under torchrun; not a test module itself).

    torchrun --nproc_per_node 2 fsdp_parity.py --out OUT MODEL_DIR
    torchrun --nproc_per_node 2 fsdp_parity.py --device cuda --out OUT MODEL_DIR   (NCCL)
    python fsdp_parity.py --device cuda --plain --out OUT MODEL_DIR   (the reference)

Every rank trains one step on its half of a fixed batch with the torch backend sharded by
FSDP2 (loss normalised by the global token count); rank 0 writes OUT/fsdp.pt with the
summed loss, the grad norm, the step's metrics and the full HF state dict after the step, to compare with one
process training on the whole batch. With --dpo the step is a DPO step on 4 preference
pairs (2 per rank), reference logprobs precomputed by the starting weights.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
from megatron_parity import parity_batch  # this folder: on sys.path as the script's own
from rlfleet_contracts.preference import DPOConfig
from rlfleet_contracts.recipe import GRPOConfig
from rlfleet_trainer.algorithms.dpo import TrainLoss
from rlfleet_trainer.backends.torch_backend import TorchBackendConfig, TorchPolicy
from rlfleet_trainer.batch import TrainBatch
from rlfleet_trainer.dpo import TokenizedPair, attach_reference_logprobs, build_pair_batch

LOSS = GRPOConfig(importance_sampling="tis")
DPO_LOSS = DPOConfig(beta=0.5, label_smoothing=0.1)


def dpo_batch() -> TrainBatch:
    """4 pairs of random token ids (vocab 512) of different lengths, interleaved."""
    gen = torch.Generator().manual_seed(11)

    def ids(n: int) -> list[int]:
        return torch.randint(3, 512, (n,), generator=gen).tolist()

    return build_pair_batch([TokenizedPair(ids(3 + i), ids(2 + i), ids(6 - i)) for i in range(4)])


def fixed_batch() -> TrainBatch:
    return parity_batch(vocab=512)  # the megatron probe's batch, over the tiny model's vocab


def policy(model: Path, device: str = "cpu", router_bias_rate: float = 0.0) -> TorchPolicy:
    torch.manual_seed(0)
    # Adam's first step moves a weight by lr * g / (|g| + eps): ±lr for any gradient well
    # above eps, so a gradient near eps whose last bits differ by summation order (2 ranks
    # reduce what 1 accumulates) could move it anywhere in ±lr. eps 1e-6 bounds that
    # sensitivity (lr / eps x ~1e-8 of gradient noise = ~1e-5): seen on the hybrid model,
    # one Mamba in_proj element off by 1.6e-4 at the default eps.
    config = TorchBackendConfig(
        model_path=model,
        lr=1e-3,
        eps=1e-6,
        max_grad_norm=None,
        device=device,
        dtype="float32",
        router_bias_update_rate=router_bias_rate,
    )
    return TorchPolicy(config)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--plain", action="store_true", help="one process, whole batch")
    parser.add_argument("--dpo", action="store_true", help="a DPO step on preference pairs")
    parser.add_argument(
        "--router-bias-rate", type=float, default=0.0, help="MoE: aux-loss-free bias updates"
    )
    parser.add_argument("model", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    loss: TrainLoss = DPO_LOSS if args.dpo else LOSS
    if args.plain:
        plain = policy(args.model, args.device, args.router_bias_rate)
        whole = dpo_batch() if args.dpo else fixed_batch()
        if args.dpo:
            attach_reference_logprobs(plain, whole, "precomputed")
        metrics = plain.train_step(whole, loss)
        state = dict(plain.hf_state_dict())
        result = {"loss": metrics["loss"], "grad_norm": metrics["grad_norm"], "state": state}
        result["metrics"] = metrics
        torch.save(result, args.out / "plain.pt")
        return
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    batch = dpo_batch() if args.dpo else fixed_batch()
    share = batch.size // world
    mine = batch.slice(rank * share, (rank + 1) * share)
    sharded = policy(args.model, args.device, args.router_bias_rate)
    if args.dpo:
        attach_reference_logprobs(sharded, mine, "precomputed")  # collective under FSDP
    metrics = sharded.train_step(mine, loss)  # the global step's metrics (summed over ranks)
    state = dict(sharded.hf_state_dict())  # collective: gathered once, onto rank 0 only
    assert bool(state) == (rank == 0)
    if rank == 0:
        torch.save(
            {
                "loss": metrics["loss"],
                "grad_norm": metrics["grad_norm"],
                "state": state,
                "metrics": metrics,
            },
            args.out / "fsdp.pt",
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
