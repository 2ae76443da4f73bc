"""Expert load of mixture-of-experts routers, and DeepSeek-V3's aux-loss-free balancing.

A DeepSeek-style router (Nemotron-H's `NemotronHTopkRouter`, DeepSeek-V3's) picks each
token's top-k experts by `sigmoid(logits) + e_score_correction_bias`, and mixes their
outputs with weights that ignore the bias. Instead of an auxiliary loss, the bias is
nudged after every optimizer step: +rate for an expert that got fewer than the layer's
mean number of tokens, -rate for one that got more (DeepSeek-V3 §2.1.2; Megatron's
`--moe-router-bias-update-rate`). Only selection moves, so the gradient is untouched.

Shape legend: L = MoE layers, E = experts of a layer, N = tokens of a forward pass.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

BIAS = "e_score_correction_bias"


def bias_update_LE(load_LE: torch.Tensor, rate: float) -> torch.Tensor:
    """The change of every expert's bias for one step's token counts: rate × sign(mean
    load of its layer − its load); 0 for an expert exactly at the mean."""
    mean_L1 = load_LE.float().mean(dim=1, keepdim=True)
    return rate * torch.sign(mean_L1 - load_LE.float())


def load_stats(load_LE: torch.Tensor) -> dict[str, float]:
    """How evenly the step's tokens spread, averaged over layers: the load's entropy over
    log(E) (1 = perfectly even), and the busiest and idlest expert's load over the mean."""
    load = load_LE.double()
    experts = load.shape[1]
    frac = load / load.sum(dim=1, keepdim=True).clamp(min=1)
    entropy = -(frac * frac.clamp(min=1e-30).log()).sum(dim=1) / math.log(experts)
    mean = load.mean(dim=1).clamp(min=1e-30)
    return {
        "moe/expert_load_entropy": float(entropy.mean()),
        "moe/expert_load_max": float((load.max(dim=1).values / mean).mean()),
        "moe/expert_load_min": float((load.min(dim=1).values / mean).mean()),
    }


def routers_of(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's DeepSeek-style routers (a `top_k` and the bias buffer), in module order."""
    return [
        m
        for m in model.modules()
        if isinstance(getattr(m, BIAS, None), torch.Tensor) and hasattr(m, "top_k")
    ]


class RouterBalance:
    """Counts the tokens each router sends to each expert during training forwards, and
    after the optimizer step reports the load and (rate > 0) updates the biases."""

    def __init__(self, model: torch.nn.Module, rate: float) -> None:
        self.routers = routers_of(model)
        self.rate = rate
        # On the routers' device: counting adds no host sync to the forward pass.
        self._load: list[torch.Tensor] = [
            torch.zeros_like(getattr(r, BIAS), dtype=torch.long) for r in self.routers
        ]
        self._mask_N: torch.Tensor | None = None

    def __bool__(self) -> bool:
        return bool(self.routers)

    @contextmanager
    def counting(self, attention_mask_NL: torch.Tensor) -> Iterator[None]:
        """Within: each router's choices for the real tokens (mask 1) of this forward are
        added up. Hooks live only here: a recomputation in backward (activation
        checkpointing) and scoring passes do not count."""
        if not self.routers:
            yield
            return
        self._mask_N = attention_mask_NL.reshape(-1).bool()
        handles = [r.register_forward_hook(self._hook(i)) for i, r in enumerate(self.routers)]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()
            self._mask_N = None

    def _hook(self, layer: int) -> Callable[..., None]:
        def count(module: torch.nn.Module, args: Any, output: Any) -> None:
            indices_NK = output[-1]  # (logits, weights, indices), as the router returns
            mask_N = self._mask_N
            if mask_N is not None and mask_N.numel() == indices_NK.shape[0]:
                indices_NK = indices_NK[mask_N.to(indices_NK.device)]
            counts = torch.bincount(indices_NK.reshape(-1), minlength=self._load[layer].numel())
            self._load[layer] += counts

        return count

    def step(
        self, all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None
    ) -> dict[str, float]:
        """After the optimizer step: the step's load statistics (summed over ranks by
        `all_reduce`, so every rank moves its biases alike), and the bias update."""
        if not self.routers:
            return {}
        load_LE = torch.stack(self._load)
        if all_reduce is not None:
            load_LE = all_reduce(load_LE)
        for counts in self._load:
            counts.zero_()
        metrics = load_stats(load_LE)
        with torch.no_grad():
            if self.rate > 0:
                delta_LE = bias_update_LE(load_LE, self.rate)
                for router, delta_E in zip(self.routers, delta_LE, strict=True):
                    bias = getattr(router, BIAS)
                    bias.add_(delta_E.to(bias.device, bias.dtype))
            biases = torch.stack([getattr(r, BIAS).detach().float().cpu() for r in self.routers])
        metrics["moe/router_bias_abs_max"] = float(biases.abs().max())
        return metrics
