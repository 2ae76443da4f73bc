"""The torch policy backend: a Hugging Face transformers causal LM trained with AdamW.

- CPU and one GPU: float32 weights; on GPU with dtype bfloat16 the forward/backward run
  under bf16 autocast while parameters and optimizer state stay float32 (mixed precision).
- Several GPUs: FSDP2 (`torch.distributed.fsdp.fully_shard`) over the data-parallel
  ranks of the default process group (launch with torchrun). Each decoder layer is its own
  FSDP unit, then the root; each rank trains on its slice of the global batch and the loss
  normaliser (valid tokens/sequences) is all-reduced, so the summed gradient equals the
  single-process one. `hf_state_dict` gathers the full tensors once, onto global rank 0
  only (the publishing rank); checkpoints are torch.distributed.checkpoint shards, one
  file per rank. A GRPO stage under torchrun runs it with gloo ranks on CPU
  (tests/test_trainer_ranks.py).

Shape legend: N = samples, L = sequence length, T = L − 1 prediction positions, V = vocab.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from rlfleet_contracts.policy import PolicyConfig
from rlfleet_contracts.recipe import RecipeConfig
from rlfleet_weights.names import checkpoint_named
from safetensors.torch import save_file

from rlfleet_trainer.algorithms.dpo import TrainLoss
from rlfleet_trainer.algorithms.router_balance import RouterBalance
from rlfleet_trainer.backends.base import BackendConfig
from rlfleet_trainer.backends.microbatch import (
    global_counts,
    linear_warmup,
    micro_batch_loss,
    score_micro_batches,
    token_logprobs_and_entropy,
    train_micro_batches,
)
from rlfleet_trainer.batch import TrainBatch

logger = logging.getLogger(__name__)


_POLICY = PolicyConfig()


@dataclass
class TorchBackendConfig(BackendConfig):
    dtype: str = _POLICY.dtype
    fsdp: bool | None = None
    """Shard with FSDP2; None = when the default process group has more than one rank."""
    activation_checkpointing: bool = _POLICY.activation_checkpointing
    train_top_layers: int | None = _POLICY.train_top_layers
    """Train only the top N decoder layers + final norm (the rest frozen); None = all."""
    router_bias_update_rate: float = _POLICY.moe.router_bias_update_rate
    """Aux-loss-free load balancing of MoE routers (algorithms/router_balance.py); 0 = off."""
    device: str | None = None
    """None = cuda if available (this rank's GPU) else cpu."""
    extra: dict[str, Any] = field(default_factory=dict)


class TorchPolicy:
    """`PolicyBackend` over a HF `AutoModelForCausalLM`."""

    @classmethod
    def from_recipe(cls, recipe: RecipeConfig, model_path: Path) -> TorchPolicy:
        p = recipe.policy
        return cls(
            TorchBackendConfig(
                **BackendConfig.recipe_values(recipe, model_path),
                dtype=p.dtype,
                activation_checkpointing=p.activation_checkpointing,
                train_top_layers=p.train_top_layers,
                router_bias_update_rate=p.moe.router_bias_update_rate,
            )
        )

    def __init__(self, config: TorchBackendConfig) -> None:
        from transformers import AutoModelForCausalLM

        self.config = config
        self.device = torch.device(
            config.device or ("cuda" if torch.cuda.is_available() else "cpu")
        )
        self.autocast_dtype: torch.dtype | None = None
        if config.dtype == "bfloat16" or (config.dtype == "auto" and self.device.type == "cuda"):
            self.autocast_dtype = torch.bfloat16
        self.model = AutoModelForCausalLM.from_pretrained(config.model_path, dtype=torch.float32)
        self.model.to(self.device)  # type: ignore[arg-type]
        self.model.config.use_cache = False
        if config.activation_checkpointing:
            self.model.gradient_checkpointing_enable()
        self.reference: torch.nn.Module | None = None
        if config.keep_reference:
            self.reference = copy.deepcopy(self.model)
            self.reference.eval()  # type: ignore[no-untyped-call]
            self.reference.requires_grad_(False)
        if config.train_top_layers is not None:
            freeze_below_top_layers(self.model, config.train_top_layers)
        self.world_size = dist.get_world_size() if dist.is_initialized() else 1
        self.fsdp_enabled = config.fsdp if config.fsdp is not None else self.world_size > 1
        if self.fsdp_enabled:
            apply_fsdp(self.model)
        self.grad_scale = float(self.world_size) if self.fsdp_enabled else 1.0
        self.router_balance = RouterBalance(self.model, config.router_bias_update_rate)
        if config.router_bias_update_rate > 0 and not self.router_balance:
            raise ValueError(
                f"policy.moe.router_bias_update_rate={config.router_bias_update_rate}: "
                f"{type(self.model).__name__} has no router with an expert bias; set it to 0"
            )
        # The rank contract of backends/base.py: every rank is a data-parallel replica.
        self.data_parallel_size = self.world_size if self.fsdp_enabled else 1
        self.data_parallel_rank = dist.get_rank() if self.data_parallel_size > 1 else 0
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=config.lr,
            betas=config.betas,
            eps=config.eps,
            weight_decay=config.weight_decay,
            fused=self.device.type == "cuda",
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, linear_warmup(config.warmup_steps)
        )

    # --- scoring --------------------------------------------------------------------------

    def _forward(
        self, model: torch.nn.Module, batch: TrainBatch, count_routes: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logprobs and entropies N×T; the LM head runs only from the first response
        position on (`logits_to_keep`): prompt positions are never scored, and the head
        is a fifth of a small model's FLOPs. Positions before it are 0. `count_routes`:
        MoE routers' choices count toward the step's expert load."""
        input_ids_NL = batch.input_ids_NL.to(self.device)
        attention_mask_NL = batch.attention_mask_NL.to(self.device)
        start = max(0, batch.response_start)
        keep = input_ids_NL.shape[1] - start
        routes = self.router_balance.counting(attention_mask_NL) if count_routes else nullcontext()
        with (
            routes,
            torch.autocast(
                self.device.type,
                dtype=self.autocast_dtype or torch.float32,
                enabled=self.autocast_dtype is not None,
            ),
        ):
            logits_NKV = model(
                input_ids=input_ids_NL, attention_mask=attention_mask_NL, logits_to_keep=keep
            ).logits
        logprobs_NK, entropy_NK = token_logprobs_and_entropy(
            logits_NKV[:, :-1], input_ids_NL[:, start + 1 :], self.config.temperature
        )
        pad = (start, 0)
        return torch.nn.functional.pad(logprobs_NK, pad), torch.nn.functional.pad(entropy_NK, pad)

    @torch.no_grad()
    def logprobs(self, batch: TrainBatch, *, reference: bool = False) -> torch.Tensor:
        model = self.reference if reference else self.model
        if model is None:
            raise RuntimeError("reference logprobs need keep_reference=True (grpo.kl_coef > 0)")
        model.eval()
        return score_micro_batches(
            batch, self.config.logprob_micro_batch_size, lambda part: self._forward(model, part)[0]
        )

    # --- training -------------------------------------------------------------------------

    def train_step(self, batch: TrainBatch, loss_config: TrainLoss) -> dict[str, float]:
        self.model.train()
        # Each rank holds its slice of the global batch; the normaliser is global.
        counts = global_counts(batch, self.device, reduce=self.world_size > 1)
        metrics: dict[str, float] = {}
        for part in train_micro_batches(batch, self.config.train_micro_batch_size, loss_config):
            logprobs_NT, entropy_NT = self._forward(self.model, part, count_routes=True)
            loss = micro_batch_loss(part, logprobs_NT, entropy_NT, loss_config, counts, metrics)
            # FSDP averages gradients over ranks; the loss is already divided by the
            # *global* token count, so ranks' gradients must add up: scale by the world
            # size (a divide factor of 1 needs PREMUL_SUM, which gloo lacks).
            (loss * self.grad_scale).backward()  # type: ignore[no-untyped-call]
        if self.data_parallel_size > 1:
            metrics = self._sum_over_ranks(metrics)
        # The rate this update uses, read before the scheduler steps (NeMo-RL's `lr`).
        metrics["lr"] = float(self.scheduler.get_last_lr()[0])
        metrics["grad_norm"] = self._clip_and_step()
        metrics.update(self.router_balance.step(self._all_reduce_sum))
        return metrics

    def _all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The sum over data-parallel ranks (the tensor itself with one)."""
        if self.data_parallel_size > 1:
            tensor = tensor.to(self.device)
            dist.all_reduce(tensor)
        return tensor.cpu()

    def _sum_over_ranks(self, metrics: dict[str, float]) -> dict[str, float]:
        """The step's metrics: each is normalised by the global counts, so the global value
        is the sum of the ranks' (every rank has the same keys, in sorted order)."""
        keys = sorted(metrics)
        values = torch.tensor([metrics[k] for k in keys], dtype=torch.float64, device=self.device)
        dist.all_reduce(values)
        return dict(zip(keys, values.tolist(), strict=True))

    def _clip_and_step(self) -> float:
        max_norm = self.config.max_grad_norm or math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        if hasattr(grad_norm, "full_tensor"):  # DTensor under FSDP2
            grad_norm = grad_norm.full_tensor()
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(grad_norm)

    # --- weights --------------------------------------------------------------------------

    def hf_state_dict(self) -> Iterator[tuple[str, torch.Tensor]]:
        """In the checkpoint's names (rlfleet_weights.names), which the engines and the
        export take; `save` keeps the module's own names."""
        own = dict(self._module_state())
        yield from checkpoint_named(self.model, own).items() if own else ()

    def _module_state(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full weights in the module's own names, on CPU; empty off global rank 0."""
        if not self.fsdp_enabled:
            for name, tensor in self.model.state_dict().items():
                yield name, tensor.detach().cpu()
            return
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        # Gathered once; with cpu_offload only global rank 0 keeps the full tensors.
        full = get_model_state_dict(
            self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
        if dist.get_rank() == 0:
            for name, tensor in full.items():
                assert isinstance(tensor, torch.Tensor)
                yield name, tensor

    def save(self, path: Path) -> None:
        if self.fsdp_enabled:
            self._save_sharded(path)
            return
        save_file(unshared(dict(self._module_state())), str(path / "model.safetensors"))
        torch.save(
            {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()},
            path / "optimizer.pt",
        )

    def load(self, path: Path) -> None:
        if self.fsdp_enabled:
            self._load_sharded(path)
            return
        from safetensors.torch import load_file

        self.model.load_state_dict(load_file(str(path / "model.safetensors")), strict=True)
        state = torch.load(path / "optimizer.pt", map_location=self.device, weights_only=True)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])

    def _save_sharded(self, path: Path) -> None:
        """FSDP2: torch.distributed.checkpoint into `path/dcp` (each rank writes its own
        `__<rank>_0.distcp` shards of model and optimizer, rank 0 the `.metadata`); the
        scheduler (the same on every rank) goes to `scheduler.pt` from rank 0."""
        from torch.distributed.checkpoint.state_dict import get_state_dict
        from torch.distributed.checkpoint.state_dict_saver import save

        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=str(path / "dcp"))
        if dist.get_rank() == 0:
            torch.save(self.scheduler.state_dict(), path / "scheduler.pt")

    def _load_sharded(self, path: Path) -> None:
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
        from torch.distributed.checkpoint.state_dict_loader import load

        if not (path / "dcp").is_dir():
            raise FileNotFoundError(
                f"{path} has no dcp/ folder: it was saved by a single process; resume it with "
                "one rank (policy.data_parallel_size=1)"
            )
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        # Loaded in place into this rank's shards (the dicts hold its DTensors).
        load({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=str(path / "dcp"))
        set_state_dict(
            self.model, self.optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd
        )
        self.scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))

    def export_hf(self, path: Path) -> None:
        tensors = dict(self.hf_state_dict())  # collective under FSDP2
        if self.data_parallel_size == 1 or dist.get_rank() == 0:
            export_hf_folder(tensors, self.config.model_path, path)


def export_hf_folder(state_dict: dict[str, torch.Tensor], source_model: Path, path: Path) -> None:
    """Write config, tokenizer files and `model.safetensors` so that
    `AutoModelForCausalLM.from_pretrained(path)` loads these weights."""
    import shutil

    path.mkdir(parents=True, exist_ok=True)
    for item in Path(source_model).iterdir():
        if (
            item.is_file()
            and not item.name.endswith((".safetensors", ".bin", ".gguf"))
            and (item.name != "model.safetensors.index.json")
        ):
            shutil.copy2(item, path / item.name)
    save_file(unshared(state_dict), str(path / "model.safetensors"), metadata={"format": "pt"})


def unshared(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Tensors safetensors can write: tied weights (SmolLM2's embeddings and LM head share
    storage) are cloned, since safetensors refuses tensors that share memory."""
    seen: set[int] = set()
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state_dict.items():
        tensor = tensor.detach().cpu()
        ptr = tensor.untyped_storage().data_ptr()
        out[name] = tensor.clone().contiguous() if ptr in seen else tensor.contiguous()
        seen.add(ptr)
    return out


def freeze_below_top_layers(model: torch.nn.Module, top: int) -> None:
    """requires_grad only on the top `top` decoder layers (all of them if the model has
    fewer) and the final norm; embeddings and LM head stay frozen."""
    inner: Any = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if inner is None or layers is None or not hasattr(inner, "norm"):
        raise ValueError(
            f"policy.train_top_layers: {type(model).__name__} has no .model.layers/.model.norm"
        )
    if top > len(layers):  # a recipe sized for a deeper model: train every layer
        logger.info("train_top_layers=%d >= the model's %d layers: all train", top, len(layers))
    model.requires_grad_(False)
    for layer in list(layers)[-top:]:
        layer.requires_grad_(True)
    inner.norm.requires_grad_(True)


def apply_fsdp(model: torch.nn.Module) -> None:
    """FSDP2: each decoder layer is a unit (its params gathered just in time), then the
    root (embeddings, norm, head). Uses the default process group's ranks."""
    from torch.distributed.fsdp import fully_shard

    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(f"FSDP2: {type(model).__name__} has no .model.layers to shard")
    for layer in layers:
        fully_shard(layer)
    fully_shard(model)
