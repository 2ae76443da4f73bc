"""Aux-loss-free load balancing (algorithms/router_balance.py): the bias update and the
load statistics against hand-computed values, and one training step of the hybrid tiny
model whose bias change is the update of the loads counted here independently."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from rlfleet_contracts.recipe import GRPOConfig
from rlfleet_core.models import resolve_model
from rlfleet_trainer.algorithms.router_balance import (
    BIAS,
    bias_update_LE,
    load_stats,
    routers_of,
)
from rlfleet_trainer.backends.torch_backend import TorchBackendConfig, TorchPolicy
from rlfleet_trainer.testing import random_batch
from transformers import AutoModelForCausalLM

LOSS = GRPOConfig(importance_sampling="tis", force_on_policy_ratio=True)


def test_bias_moves_toward_the_mean_load_by_the_rate() -> None:
    load = torch.tensor([[5, 1, 3, 3], [0, 0, 8, 0]])  # means 3 and 2
    want = torch.tensor([[-0.01, 0.01, 0.0, 0.0], [0.01, 0.01, -0.01, 0.01]])
    torch.testing.assert_close(bias_update_LE(load, 0.01), want)


def test_load_stats_by_hand() -> None:
    even = load_stats(torch.tensor([[2, 2, 2, 2]]))
    assert even == pytest.approx(
        {"moe/expert_load_entropy": 1.0, "moe/expert_load_max": 1.0, "moe/expert_load_min": 1.0}
    )
    one = load_stats(torch.tensor([[4, 0, 0, 0]]))
    assert one["moe/expert_load_entropy"] == pytest.approx(0.0, abs=1e-12)
    assert (one["moe/expert_load_max"], one["moe/expert_load_min"]) == (4.0, 0.0)
    # Two layers average: [3, 1] has entropy H(3/4, 1/4) / log 2.
    mixed = load_stats(torch.tensor([[3, 1], [2, 2]]))
    h = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25)) / math.log(2)
    assert mixed["moe/expert_load_entropy"] == pytest.approx((h + 1.0) / 2)
    assert mixed["moe/expert_load_max"] == pytest.approx((1.5 + 1.0) / 2)
    assert mixed["moe/expert_load_min"] == pytest.approx((0.5 + 1.0) / 2)


@torch.no_grad()
def _loads(model_path: Path, sequences: list[list[int]]) -> torch.Tensor:
    """Tokens per expert per MoE layer, each sequence run alone (no padding)."""
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    routers = routers_of(model)
    load = torch.zeros(len(routers), getattr(routers[0], BIAS).numel(), dtype=torch.long)

    def hook(layer: int):  # type: ignore[no-untyped-def]
        def add(module: object, args: object, output: tuple[torch.Tensor, ...]) -> None:
            load[layer] += torch.bincount(output[-1].reshape(-1), minlength=load.shape[1])

        return add

    handles = [r.register_forward_hook(hook(i)) for i, r in enumerate(routers)]
    for ids in sequences:
        model(input_ids=torch.tensor([ids]))
    for handle in handles:
        handle.remove()
    return load


def test_a_training_step_moves_each_bias_by_its_layers_load() -> None:
    model_path = resolve_model("tiny-nemotron-h")
    trajs, batch = random_batch(seed=3)  # different lengths: pads must not count
    rate = 0.01
    torch.manual_seed(0)
    policy = TorchPolicy(
        TorchBackendConfig(
            model_path=model_path, lr=1e-3, router_bias_update_rate=rate, train_micro_batch_size=3
        )
    )
    metrics = policy.train_step(batch, LOSS)
    load = _loads(model_path, [t.prompt_token_ids + t.token_ids for t in trajs])
    top_k = policy.router_balance.routers[0].top_k
    assert int(load[0].sum()) == top_k * sum(len(t.prompt_token_ids + t.token_ids) for t in trajs)
    biases = torch.stack([getattr(r, BIAS).detach() for r in policy.router_balance.routers])
    torch.testing.assert_close(biases, bias_update_LE(load, rate))  # they started at 0
    assert metrics["moe/router_bias_abs_max"] == pytest.approx(rate)
    for key, value in load_stats(load).items():
        assert metrics[key] == pytest.approx(value)


def test_a_rate_on_a_dense_model_is_refused(tiny_model: Path) -> None:
    with pytest.raises(ValueError, match=r"policy\.moe\.router_bias_update_rate"):
        TorchPolicy(TorchBackendConfig(model_path=tiny_model, router_bias_update_rate=1e-3))
